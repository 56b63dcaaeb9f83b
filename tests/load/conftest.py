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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each test's call outcome on the item, for its figures."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


_PASSED = pytest.StashKey[bool]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Where a load test puts its figures: printed, and written to RESULTS.md."""
    found: dict[str, Any] = {}
    start = time.perf_counter()
    yield found
    found.setdefault("wall s", round(time.perf_counter() - start, 1))
    if not request.node.stash.get(_PASSED, False):
        found["FAILED"] = "see the test's output"
    name = request.node.name
    _FIGURES[name] = found
    print(f"\n{name}: " + ", ".join(f"{k} {v}" for k, v in found.items()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write RESULTS.md with the figures of this run (when the load tier ran); the rows of
    tests that did not run this time are kept from the file."""
    if not _FIGURES:
        return
    rows: dict[str, str] = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            if line.startswith("| test_l"):
                if line.count(" | ") == 1:  # a row written before runs were dated
                    line += " - |"
                rows[line.split(" | ", 1)[0].removeprefix("| ")] = line
    stamp = time.strftime("%Y-%m-%d %H:%M")
    for name, found in _FIGURES.items():
        figures = "; ".join(f"{k}: {v}" for k, v in found.items())
        rows[name] = f"| {name} | {figures} | {stamp} |"
    lines = [
        "# Load tier: figures",
        "",
        "Written by `make test-load` (tests/load/): one row per scenario of RELIABILITY.md's load",
        "list, from the last run of each. Wall times include the clients, which run in the same",
        "process as the server.",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end of the "
        "last run",
        "",
        "| test | figures | run |",
        "| --- | --- | --- |",
        *(rows[name] for name in sorted(rows)),
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    # the same table in bench/RESULTS.md, where every figure of the project is gathered
    from bench.report import replace_section

    replace_section(
        "load",
        "\n".join(
            [
                "## Load tier",
                "",
                "`make test-load` (tests/load/, the load scenarios L1–L8 of the reliability",
                "catalogue; each row from the last run of its test, dated).",
                "",
                *lines[-(len(rows) + 2) :],
            ]
        ),
    )
