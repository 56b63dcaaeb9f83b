"""Fixtures every test module may use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from rillet._policy import default_graph

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chained_only: runs under the chained graph alone")
