"""The agent loop: model steps and tool runs until the model answers; its handle; tools."""
