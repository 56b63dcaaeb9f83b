"""What the benchmarks read about processes and the machine from `/proc`: CPU time, peak
resident set, how busy every core was, and a nearest-rank quantile for the figures."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["machine_busy", "peak_rss", "process_cpu", "process_tree", "rank"]


def process_cpu(pid: int, *, children: bool = False) -> float:
    """User+system seconds of a process so far (with `children`, its reaped children's too);
    0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(fields[i]) for i in ((11, 12, 13, 14) if children else (11, 12)))
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """A process and every live descendant (a server may run workers of its own)."""
    found = [pid]
    for child in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [p for c in child.read_text().split() for p in process_tree(int(c))]
        except OSError:
            continue
    return found


def peak_rss(pid: int) -> int:
    """The peak resident set of a process and its live descendants, in bytes (`VmHWM`)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def machine_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy so far, every core and process
    (`/proc/stat`: all but idle and iowait); NaN where there is no `/proc/stat`."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return math.nan
    ticks = [int(f) for f in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def rank(ordered: list[float], p: float) -> float:
    """The p-quantile of a sorted list (nearest rank), NaN when empty."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]
