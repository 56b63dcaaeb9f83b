"""Tests of the hub: run logs and subscribers, in memory and on Redis."""
