"""The `rillet` command line and the demo. Nothing imports this package but `__main__`."""
