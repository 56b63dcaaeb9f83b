"""Run logs and their fan-out to subscribers, in this process and on Redis Streams."""
