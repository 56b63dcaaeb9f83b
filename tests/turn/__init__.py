"""Tests of the turn on trio: the handler and its ladders, the graph, sinks, upstreams, the
chain."""
