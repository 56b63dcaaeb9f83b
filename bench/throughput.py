"""Throughput on whole streams: rillet's contestants and the limit loops in this process, the
peers (the SDKs a user would pick instead) in the peers' virtualenv, round by round.

Every stream is built once; the peers' driver reads the very same bytes from bench/out/streams.
Each round runs every rillet contestant on every stream (contestant order rotated per round) in
this process, and the peers' driver once as a subprocess (`python -m bench.peers`) with the
peers' interpreter, alternating which goes first. Inside the peers' driver, rillet's `run_turn`
runs on each stream right before or after each peer (alternating by round; recorded as
`pipeline:<peer>`), so every peer's ratio divides two figures from one process taken moments
apart. Figures are CPU seconds per whole stream (`time.process_time`, in the process that did
the work); the report takes medians.
"""

from __future__ import annotations

import functools
import gc
import json
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .contestants import RILLET
from .peers import CONTESTANTS as PEER_CONTESTANTS
from .peers import family, paired
from .wire import Stream, build_stream, write_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "PEERS_PYTHON",
    "PeersPlan",
    "Series",
    "ThroughputRun",
    "run_throughput",
]

ROOT = Path(__file__).resolve().parent.parent
PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"
STREAMS_DIR = ROOT / "bench" / "out" / "streams"


@dataclass
class Series:
    """One contestant on one stream: CPU (and wall) seconds per round, and what went wrong."""

    contestant: str
    stream: str
    kind: str
    events: int
    side: str  # "rillet" (this process) or "peers" (the peers' driver)
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    error: str | None = None  # a failure or a wrong reply: the row is invalid
    unavailable: str | None = None  # the library could not be installed or imported

    def median(self) -> float | None:
        """Median CPU seconds per stream, None without a valid measurement."""
        if self.error is not None or self.unavailable is not None or not self.cpu:
            return None
        ordered = sorted(self.cpu)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def us_per_event(self) -> float | None:
        """Median CPU µs per fragment event."""
        m = self.median()
        return None if m is None else m / self.events * 1e6

    def as_dict(self) -> dict[str, Any]:
        """For results.json."""
        us = self.us_per_event()
        return {
            "contestant": self.contestant,
            "stream": self.stream,
            "kind": self.kind,
            "events": self.events,
            "side": self.side,
            "rounds": len(self.cpu),
            "cpu_s": self.cpu,
            "wall_s": self.wall,
            "median_cpu_s": self.median(),
            "us_per_event": us,
            "events_per_s": None if not us else 1e6 / us,
            "error": self.error,
            "unavailable": self.unavailable,
        }


@dataclass
class PeersPlan:
    """Which peers run, on what, how often."""

    contestants: Sequence[str] = tuple(PEER_CONTESTANTS)
    rounds: int = 3
    # contestant -> largest stream it runs (LiteLLM takes ~3 ms an event: 20,000 would be a
    # minute a stream a round)
    caps: dict[str, int] = field(default_factory=lambda: {"litellm": 1000})
    timeout: float = 1200.0


@dataclass
class ThroughputRun:
    """Everything one throughput run measured."""

    streams: list[dict[str, Any]]
    series: list[Series]
    rounds: int
    peer_rounds: int
    peer_versions: dict[str, str] = field(default_factory=dict)
    peer_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For results.json."""
        return {
            "streams": self.streams,
            "rounds": self.rounds,
            "peer_rounds": self.peer_rounds,
            "peer_versions": self.peer_versions,
            "peer_notes": self.peer_notes,
            "series": [s.as_dict() for s in self.series],
        }


async def _rillet_round(
    streams: list[Stream],
    names: Sequence[str],
    table: dict[tuple[str, str], Series],
    r: int,
    progress: Callable[[str], None],
    timed: bool = True,
) -> None:
    k = r % len(names) if names else 0
    order = [*names[k:], *names[:k]]
    for stream in streams:
        for name in order:
            series = table[(name, stream.name)]
            if series.error is not None:
                continue
            if timed:
                progress(f"round {r + 1}: {name} on {stream.name}")
            contestant = RILLET[name](stream)
            try:
                gc.collect()
                t0, w0 = time.process_time(), time.perf_counter()
                got = await contestant.run()
                cpu, wall = time.process_time() - t0, time.perf_counter() - w0
            except Exception as exc:
                series.error = f"{type(exc).__name__}: {exc}"[:200]
                continue
            finally:
                await contestant.aclose()
            if got != stream.expected.digest():
                series.error = f"reply differs from the stream's ({got})"
            elif timed:
                series.cpu.append(cpu)
                series.wall.append(wall)


def _peers_round(
    streams: list[Stream],
    warmups: list[Stream],
    plan: PeersPlan,
    table: dict[tuple[str, str], Series],
    run: ThroughputRun,
    r: int,
    progress: Callable[[str], None],
) -> None:
    cmd = [
        str(PEERS_PYTHON),
        "-m",
        "bench.peers",
        "--dir",
        str(STREAMS_DIR),
        "--streams",
        ",".join(s.name for s in streams),
        "--warmup",
        ",".join(s.name for s in warmups),
        "--only",
        ",".join(plan.contestants),
        *(f"--cap={name}={n}" for name, n in plan.caps.items()),
        # rillet's run_turn alternates with each peer in the peers' process
        "--rillet",
        sysconfig.get_paths()["purelib"],
        "--round",
        str(r),
    ]
    start = time.monotonic()
    with subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        while True:
            try:
                out, err = proc.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                progress(f"round {r + 1}: peers' driver running ({elapsed:.0f} s)")
                if elapsed > plan.timeout:
                    proc.kill()
                    out, err = proc.communicate()
                    break
    report: dict[str, Any] | None = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            report = json.loads(line)
            break
    if report is None:
        why = (err.strip().splitlines() or ["no output"])[-1][:200]
        run.peer_notes.append(f"round {r + 1}: the peers' driver failed ({why})")
        return
    run.peer_versions = report.get("versions", {})
    for name, why in report.get("unavailable", {}).items():
        for series in table.values():
            if series.side == "peers" and series.contestant == name:
                series.unavailable = why
    for entry in report.get("results", []):
        found = table.get((entry["contestant"], entry["stream"]))
        if found is None:
            continue
        if entry.get("error"):
            found.error = entry["error"]
        elif "cpu" in entry:
            found.cpu.append(entry["cpu"])
            found.wall.append(entry["wall"])


def run_throughput(
    kinds: Sequence[str],
    sizes: Sequence[int],
    rounds: int,
    rillet: Sequence[str] = tuple(RILLET),
    peers: PeersPlan | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> ThroughputRun:
    """Measure `rillet` contestants (and `peers`, when given) on every kind at every size."""
    progress("building streams")
    streams = [build_stream(k, n) for n in sizes for k in kinds]
    peer_streams = [s for s in streams if family(s.kind) is not None]
    warm_size = min(sizes)
    warmups = [s for s in peer_streams if s.events == warm_size]
    table: dict[tuple[str, str], Series] = {}
    for s in streams:
        for name in rillet:
            table[(name, s.name)] = Series(name, s.name, s.kind, s.events, "rillet")
    peer_rounds = 0
    run = ThroughputRun(
        streams=[
            {
                "name": s.name,
                "kind": s.kind,
                "events": s.events,
                "bytes": s.size,
                "reads": len(s.chunks),
            }
            for s in streams
        ],
        series=[],
        rounds=rounds,
        peer_rounds=0,
    )
    if peers is not None and peer_streams:
        peer_rounds = min(peers.rounds, rounds)
        run.peer_rounds = peer_rounds
        for s in peer_streams:
            fam = family(s.kind)
            for name in peers.contestants:
                if fam in PEER_CONTESTANTS[name] and s.events <= peers.caps.get(name, s.events):
                    table[(name, s.name)] = Series(name, s.name, s.kind, s.events, "peers")
                    if name != "limit-sync":
                        ours = paired(name)
                        table[(ours, s.name)] = Series(ours, s.name, s.kind, s.events, "peers")
        if not PEERS_PYTHON.exists():
            why = "bench/.venv-peers is missing (`make bench` creates it)"
            for series in table.values():
                if series.side == "peers":
                    series.unavailable = why
            peer_rounds = 0
        else:
            for s in peer_streams:
                write_stream(s, STREAMS_DIR)
    # warm-up: every rillet contestant once on each kind's smallest stream, untimed
    progress("warming up")
    trio.run(
        _rillet_round,
        [s for s in streams if s.events == warm_size],
        rillet,
        table,
        0,
        progress,
        False,
    )
    for r in range(rounds):
        steps: list[Callable[[], object]] = [
            functools.partial(trio.run, _rillet_round, streams, rillet, table, r, progress)
        ]
        if peers is not None and r < peer_rounds:
            steps.append(
                functools.partial(
                    _peers_round, peer_streams, warmups, peers, table, run, r, progress
                )
            )
        for step in steps if r % 2 == 0 else steps[::-1]:
            step()
    run.series = list(table.values())
    return run
