"""Many concurrent turns in one process: throughput, memory per turn, event-loop lag.

Each run happens in a fresh child process (`python -m bench.turns --mode ...`, which prints
JSON), so its resident memory starts from the same place: after imports, one warm-up turn and a
full collection. Every turn runs `run_turn` (the full actor pipeline) against one shared
`httpx.AsyncClient` whose in-memory transport answers with an OpenAI Chat text stream.

Two modes:

- `paced`: the arrival pattern of real streams. Turns start spread over the first second; each
  turn's reads come one per `period` (every turn is in one of 100 tick groups, woken in turn, so
  reads arrive evenly spread rather than all at once). With the defaults (100 events a turn,
  ~2.6 events a read, one read per 0.5 s per turn) 1,000 turns offer ~5,000 events/s, and all of
  them are in flight at once: this is where peak memory per turn and loop lag are judged.
- `burst`: every turn starts at once and reads as fast as the CPU allows: throughput at
  saturation, and the loop lag that saturation brings.

A ticker task sleeps 10 ms at a time and records how late it wakes (the loop lag) and the
process's resident memory.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import trio
from rillet import Admission, Policy, TurnResult, run_turn

from .contestants import http_client, message_digest, provider_for, request
from .wire import build_stream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["main", "run_turns"]

_TICK = 0.010
_GROUPS = 100


def _rss_kib() -> int:
    """The process's resident memory now, in KiB."""
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() // 1024


class _Ticks:
    """Tick groups: group `g` is woken every `period`, the groups evenly staggered."""

    def __init__(self, period: float, groups: int = _GROUPS) -> None:
        self.period = period
        self.groups = groups
        self._events = [trio.Event() for _ in range(groups)]
        self._next = itertools.count()

    async def drive(self) -> None:
        for i in itertools.cycle(range(self.groups)):
            await trio.sleep(self.period / self.groups)
            event, self._events[i] = self._events[i], trio.Event()
            event.set()

    def pacer(self) -> Callable[[], Awaitable[object]]:
        group = next(self._next) % self.groups
        return lambda: self._events[group].wait()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _all_turns(
    turns: int,
    ticks: _Ticks | None,
    ticker: Callable[[], Awaitable[None]],
    one: Callable[[float], Awaitable[None]],
) -> None:
    """Every turn, with the ticker (and the tick driver) running beside them until the last
    turn ends."""
    async with trio.open_nursery() as outer:
        outer.start_soon(ticker)
        if ticks is not None:
            outer.start_soon(ticks.drive)
        async with trio.open_nursery() as nursery:
            for i in range(turns):
                nursery.start_soon(one, i / turns if ticks is not None else 0.0)
        outer.cancel_scope.cancel()


async def run_turns(turns: int, events: int, mode: str, period: float) -> dict[str, Any]:
    """Run `turns` concurrent turns of `events` fragment events each; the figures as a dict."""
    stream = build_stream("openai-chat", events)
    ticks = _Ticks(period) if mode == "paced" else None
    client = http_client(stream, pacer=ticks.pacer if ticks is not None else None)
    provider = provider_for(stream.dialect)
    req = request()
    policy = Policy()
    # every turn streams at once: the process's default of 32 provider streams would queue them
    slots = Admission(turns)
    expected = stream.expected.digest()
    async with http_client(stream) as unpaced:  # warm-up (no tick driver runs yet)
        await run_turn(req, provider, client=unpaced, policy=policy)
    gc.collect()
    baseline = _rss_kib()
    peak = baseline
    lags: list[float] = []
    results: list[TurnResult] = []

    async def ticker() -> None:
        nonlocal peak
        while True:
            t0 = time.perf_counter()
            await trio.sleep(_TICK)
            lags.append(time.perf_counter() - t0 - _TICK)
            peak = max(peak, _rss_kib())

    async def one(delay: float) -> None:
        if delay:
            await trio.sleep(delay)
        results.append(await run_turn(req, provider, client=client, policy=policy, admission=slots))

    gc_before = sum(s["collections"] for s in gc.get_stats())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    # a turn that never ends must not hold the benchmark: give up well past the expected time
    budget = len(stream.chunks) * (period if ticks is not None else 0.0) * 3 + 120
    with trio.fail_after(budget):
        await _all_turns(turns, ticks, ticker, one)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    await client.aclose()
    peak = max(peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    ok = sum(1 for r in results if r.ok and message_digest(r.message) == expected)
    total = turns * events
    return {
        "mode": mode,
        "turns": turns,
        "events_per_turn": events,
        "reads_per_turn": len(stream.chunks),
        "period": period if ticks is not None else None,
        # while every turn is in flight: each delivers its events over its reads, one a period
        "offered_events_per_s": (
            total / (len(stream.chunks) * period) if ticks is not None else None
        ),
        "ok": ok,
        "wall": wall,
        "cpu": cpu,
        "events_per_s_wall": total / wall,
        "cpu_us_per_event": cpu / total * 1e6,
        "lag_p50_ms": statistics.median(lags) * 1e3 if lags else 0.0,
        "lag_p99_ms": _percentile(lags, 0.99) * 1e3,
        "lag_max_ms": max(lags, default=0.0) * 1e3,
        "ticks": len(lags),
        "rss_baseline_kib": baseline,
        "rss_peak_kib": peak,
        "kib_per_turn": (peak - baseline) / turns,
        "gc_collections": sum(s["collections"] for s in gc.get_stats()) - gc_before,
    }


def main(argv: list[str] | None = None) -> None:
    """Child-process entry point: run one mode, print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.turns")
    parser.add_argument("--mode", choices=("paced", "burst"), default="paced")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--period", type=float, default=0.5)
    args = parser.parse_args(argv)
    out = trio.run(run_turns, args.turns, args.events, args.mode, args.period)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
