"""Tests of the server: its routes, wires, fan-out, workers, browser page and real clients."""
