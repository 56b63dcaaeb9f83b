"""Fixtures every test module may use."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest
import trio.testing
from rillet._core._policy import default_graph

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(params=["chained", "hops"])
def graph(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test under each actor graph: every `Policy` made during it (the turn's own
    default too) gets that graph. The two must give the same events. A test marked
    `chained_only` asserts what chaining itself does (a sink called on the turn's task) and
    runs chained alone."""
    if request.param == "hops" and request.node.get_closest_marker("chained_only"):
        pytest.skip("asserts the chained graph's own behaviour")
    token = default_graph.set(request.param)
    try:
        yield request.param
    finally:
        default_graph.reset(token)


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the test: with thousands of connections alive, its
    passes over the whole test session's heap double a test's time. Collected afterwards."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness (bytes in flight on loopback
    are not silence)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chained_only: runs under the chained graph alone")
