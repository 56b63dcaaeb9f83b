"""Memory per turn: what a finished turn keeps, and what a turn in flight holds.

Each figure comes from a fresh child process (`python -m bench.memory ...`, which prints JSON),
so every measurement starts from the same place: after imports, one warm-up turn and a full
collection. `K` turns of `events` fragment events each (the bench's OpenAI Chat and Anthropic
text streams, network-sized reads that cut events and UTF-8 characters) run at once through
`open_turn` (the full actor pipeline) over one shared httpx client on an in-memory transport.
Every read after a body's first waits one scheduler round, so the `K` turns advance read by
read together and are all in flight at once. Each turn's `Turn` handle (and so its
`TurnResult`) is held until every turn has ended, as an application holding its turns would.

Three figures per stream and history setting:

- retained: traced bytes (tracemalloc) still allocated once every turn has ended and a full
  collection ran, minus those before the turns started, ÷ `K`: what a finished turn keeps (its
  `Turn`, its `TurnResult`, and with history its replay logs);
- peak in flight: the tracemalloc peak while the `K` turns run, minus the bytes before they
  started, ÷ `K`;
- RSS growth (a cross-check, in its own process without tracemalloc): the peak resident memory
  while the turns run minus that before, ÷ `K`.

`--top N` (diagnosis) prints where the retained and the in-flight bytes were allocated, grouped
by line, and the retained objects grouped by type.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import tracemalloc
from collections import Counter
from typing import TYPE_CHECKING, Any

import trio
from rillet import Admission, Policy, Turn, open_turn

from .contestants import http_client, message_digest, provider_for, request
from .wire import build_stream

if TYPE_CHECKING:
    from .wire import Stream

__all__ = ["MEMORY_KINDS", "main", "measure"]

MEMORY_KINDS = ("openai-chat", "anthropic")


def _rss_kib() -> int:
    """The process's resident memory now, in KiB."""
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() // 1024


async def _one(stream: Stream, client: Any, history: bool, slots: Admission) -> Turn:
    """One turn to its end; its handle."""
    options: dict[str, Any] = {
        "client": client,
        "policy": Policy(),
        "history": history,
        "admission": slots,
    }
    async with open_turn(request(), provider_for(stream.dialect), **options) as turn:
        await turn.result()
    return turn


async def _turns(
    stream: Stream, client: Any, k: int, history: bool, on_first_end: Any = None
) -> list[Turn]:
    """`k` turns at once; their handles, once every one has ended."""
    slots = Admission(k)
    kept: list[Turn] = []

    async def one() -> None:
        turn = await _one(stream, client, history, slots)
        if not kept and on_first_end is not None:
            on_first_end()
        kept.append(turn)

    async with trio.open_nursery() as nursery:
        for _ in range(k):
            nursery.start_soon(one)
    return kept


async def _check(stream: Stream, turns: list[Turn]) -> int:
    """How many turns brought the stream's reply home, intact (every turn has ended)."""
    expected = stream.expected.digest()
    ok = 0
    for turn in turns:
        result = await turn.result()
        if result.ok and message_digest(result.message) == expected:
            ok += 1
    return ok


def _by_type(turns: list[Turn]) -> list[tuple[str, int, int]]:
    """The objects the turns keep, by type: (type, count, bytes), largest first."""
    seen: set[int] = set()
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    stack: list[Any] = list(turns)
    skip = (type, type(sys), type(_rss_kib))
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        name = type(obj).__qualname__
        sizes[name] += sys.getsizeof(obj)
        counts[name] += 1
        stack.extend(gc.get_referents(obj))
    return [(name, counts[name], size) for name, size in sizes.most_common(15)]


def _top(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot, n: int) -> list[str]:
    stats = snapshot.compare_to(base, "lineno")
    return [str(s) for s in stats[:n]]


async def _measure(
    kind: str, events: int, k: int, history: bool, how: str, top: int
) -> dict[str, Any]:
    stream = build_stream(kind, events)
    # every read after a body's first waits one scheduler round: the turns advance together
    client = http_client(stream, pacer=lambda: trio.lowlevel.checkpoint)
    await _turns(stream, client, 2, history)  # warm-up: imports, caches, first-use allocations
    gc.collect()
    out: dict[str, Any] = {
        "kind": kind,
        "events": events,
        "turns": k,
        "history": history,
        "how": how,
    }
    if how == "rss":
        before = _rss_kib()
        peak = before
        done = False

        async def sample() -> None:
            nonlocal peak
            while not done:
                peak = max(peak, _rss_kib())
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            kept = await _turns(stream, client, k, history)
            done = True
        peak = max(peak, _rss_kib())
        out["rss_kib_per_turn"] = (peak - before) / k
    else:
        tracemalloc.start(25 if top else 1)
        base_snapshot = tracemalloc.take_snapshot() if top else None
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        first: list[tracemalloc.Snapshot] = []

        def on_first_end() -> None:
            if top:
                first.append(tracemalloc.take_snapshot())

        kept = await _turns(stream, client, k, history, on_first_end)
        peak = tracemalloc.get_traced_memory()[1]
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0]
        out["retained_kib_per_turn"] = (retained - before) / k / 1024
        out["peak_kib_per_turn"] = (peak - before) / k / 1024
        if top and base_snapshot is not None:
            out["top_retained"] = _top(tracemalloc.take_snapshot(), base_snapshot, top)
            if first:
                out["top_in_flight"] = _top(first[0], base_snapshot, top)
            out["types_retained"] = _by_type(kept)
        tracemalloc.stop()
    out["ok"] = await _check(stream, kept)
    await client.aclose()
    return out


def measure(
    kind: str, events: int, turns: int, *, history: bool, how: str, top: int = 0
) -> dict[str, Any]:
    """One measurement (`how`: `trace` or `rss`) in this process; its figures."""
    result: dict[str, Any] = trio.run(_measure, kind, events, turns, history, how, top)
    return result


def main(argv: list[str] | None = None) -> None:
    """Child-process entry point: one measurement, its figures as JSON on stdout."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("--kind", choices=MEMORY_KINDS, default="openai-chat")
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--no-history", action="store_true", help="history=False")
    parser.add_argument("--how", choices=("trace", "rss"), default="trace")
    parser.add_argument("--top", type=int, default=0, help="print where the bytes go")
    args = parser.parse_args(argv)
    out = measure(
        args.kind, args.events, args.turns, history=not args.no_history, how=args.how, top=args.top
    )
    if args.top:
        for key in ("top_retained", "top_in_flight"):
            print(f"--- {key}", file=sys.stderr)
            for line in out.pop(key, []):
                print(line, file=sys.stderr)
        print("--- types_retained", file=sys.stderr)
        for name, count, size in out.pop("types_retained", []):
            print(f"{name:30} {count:8,} {size:12,}", file=sys.stderr)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
