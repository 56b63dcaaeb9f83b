"""The load tier's tools: a raised file-descriptor limit, the process's memory, open files and
trio tasks, an event-loop lag ticker, and the loopback provider in a process of its own."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss() -> int:
    """The process's resident set, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    """How many file descriptors the process has open."""
    return len(os.listdir("/proc/self/fd"))


def tasks() -> int:
    """How many trio tasks are alive in this run."""
    count = 0
    root = trio.lowlevel.current_root_task()
    assert root is not None
    stack = [root]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


@attrs.define
class Ticker:
    """A task that asks to wake every `period` s and records how late it woke (the event
    loop's lag), and the peak resident set seen at each tick."""

    period: float = 0.010
    lags: list[float] = attrs.field(factory=list)
    peak_rss: int = 0

    async def run(self) -> None:
        while True:
            due = trio.current_time() + self.period
            await trio.sleep_until(due)
            self.lags.append(trio.current_time() - due)
            self.peak_rss = max(self.peak_rss, rss())

    @property
    def p99_ms(self) -> float:
        return percentile(self.lags, 99) * 1000 if self.lags else 0.0

    @property
    def max_ms(self) -> float:
        return max(self.lags) * 1000 if self.lags else 0.0


@asynccontextmanager
async def ticking(period: float = 0.010) -> AsyncIterator[Ticker]:
    """A `Ticker` running for the block."""
    ticker = Ticker(period)
    ticker.peak_rss = rss()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.run)
        yield ticker
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def provider_process(
    chunks: int, *, per_chunk: int = 1, gap: float = 0.0
) -> AsyncIterator[str]:
    """The loopback provider (`tests.load._provider`) in a child process: its base URL."""
    args = ("--chunks", str(chunks), "--per-chunk", str(per_chunk), "--gap", str(gap))
    async with child_provider("tests.load._provider", *args) as url:
        yield url


@asynccontextmanager
async def child_provider(module: str, *args: str) -> AsyncIterator[str]:
    """A provider `python -m module *args` serves in a child process (it prints `PORT <n>`
    once listening, and serves until its standard input closes): its base URL."""
    root = Path(__file__).parents[2]
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", module, *args],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            data = await process.stdout.receive_some(1024)
            assert data, "the provider process ended before it listened"
            line += data
        assert line.startswith(b"PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        with trio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
