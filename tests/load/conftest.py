"""The load tier's figures: each test's, printed, and gathered into tests/load/RESULTS.md at the
end of a run of the tier."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ._support import raise_fd_limit

if TYPE_CHECKING:
    from collections.abc import Iterator

RESULTS = Path(__file__).parent / "RESULTS.md"
_FIGURES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="session", autouse=True)
def fd_limit() -> int:
    """The soft limit on open files, raised to the hard one: many sockets are opened here."""
    return raise_fd_limit()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Where a load test puts its figures: printed, and written to RESULTS.md."""
    found: dict[str, Any] = {}
    start = time.perf_counter()
    yield found
    found.setdefault("wall s", round(time.perf_counter() - start, 1))
    name = request.node.name
    _FIGURES[name] = found
    print(f"\n{name}: " + ", ".join(f"{k} {v}" for k, v in found.items()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write RESULTS.md with the figures of this run (when the load tier ran)."""
    if not _FIGURES:
        return
    lines = [
        "# Load tier: figures of the last run",
        "",
        "Written by `make test-load` (tests/load/); each line is one scenario of RELIABILITY.md's",
        "load list. Wall times include the clients, which run in the same process.",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        "| test | figures |",
        "| --- | --- |",
    ]
    for name, found in sorted(_FIGURES.items()):
        lines.append(f"| {name} | " + "; ".join(f"{k}: {v}" for k, v in found.items()) + " |")
    RESULTS.write_text("\n".join(lines) + "\n")
