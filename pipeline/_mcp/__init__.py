"""A turn as an MCP tool, and the client side of its run events."""
