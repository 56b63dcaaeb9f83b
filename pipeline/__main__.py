"""`python -m rillet`: the `rillet` command line."""

from ._cli._main import main

if __name__ == "__main__":
    main()
