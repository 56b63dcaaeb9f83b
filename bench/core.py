"""Core decode throughput: rillet's sans-I/O decode in one task against the limit loop.

For each stream kind (every dialect's text stream, and the tool-call and thinking streams), the
same stream (network-sized reads that cut events and UTF-8 characters) is fed to:

- the limit: a minimal loop that splits lines, keeps `data:` lines (or NDJSON lines) and
  msgspec-decodes each one, doing nothing else;
- rillet's core: SSE/NDJSON decoder -> dialect (typed msgspec decode) -> lanes -> grammar ->
  accumulator, all in one task.

Contestants are interleaved round by round; the report gives medians of CPU time and the ratio
of rillet's events/s to the limit's, measured in the same run. rillet's reply is checked against
what the stream decodes to before any timing.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from typing import TYPE_CHECKING, Any

import msgspec
from rillet.lowlevel import Accumulator, WireDecoder

from .contestants import dialect_of, limit_loop, message_digest
from .wire import STREAM_KINDS, build_stream

if TYPE_CHECKING:
    from collections.abc import Callable

    from rillet.providers import Dialect

__all__ = ["CORE_KINDS", "CoreResult", "cpu_time", "run_core"]

CORE_KINDS = tuple(STREAM_KINDS)


def rillet_core(dialect: Dialect, chunks: list[bytes]) -> Accumulator:
    """The full sans-I/O decode; the accumulated reply."""
    decoder = WireDecoder(dialect, clock=lambda: 0)
    acc = Accumulator()
    for c in chunks:
        acc.feed_many(decoder.feed(c))
    acc.feed_many(decoder.close())
    return acc


class CoreResult(msgspec.Struct):
    """One stream kind's figures."""

    dialect: str
    kind: str
    frames: int
    events: int
    limit_events_per_s: float
    rillet_events_per_s: float
    ratio: float
    limit_us_per_event: float
    rillet_us_per_event: float


def cpu_time(fn: Callable[[], Any]) -> float:
    """CPU seconds the call took: the loops are single-threaded and CPU-bound, and CPU time is
    far less disturbed than wall time by other work on a shared machine."""
    gc.collect()
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def run_core(
    n_fragments: int = 20_000,
    rounds: int = 7,
    kinds: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[CoreResult]:
    """Measure every stream kind (or the named ones); medians over `rounds` interleaved rounds."""
    results = []
    for kind in kinds or list(CORE_KINDS):
        stream = build_stream(kind, n_fragments)
        try:
            dialect = dialect_of(stream.dialect)
        except ImportError:
            progress(f"{kind}: dialect not available, skipped")
            continue
        chunks = stream.chunks
        ndjson = dialect.framing == "ndjson"
        frames = limit_loop(chunks, ndjson)
        if message_digest(rillet_core(dialect, chunks).message()) != stream.expected.digest():
            raise AssertionError(f"{kind}: rillet's reply differs from the generated one")
        limit_t: list[float] = []
        rillet_t: list[float] = []
        for r in range(rounds):
            progress(f"core {kind}: round {r + 1}/{rounds}")
            pair: list[tuple[list[float], Callable[[], Any]]] = [
                (limit_t, functools.partial(limit_loop, chunks, ndjson)),
                (rillet_t, functools.partial(rillet_core, dialect, chunks)),
            ]
            for into, fn in pair if r % 2 == 0 else pair[::-1]:
                into.append(cpu_time(fn))
        lm, rm = statistics.median(limit_t), statistics.median(rillet_t)
        # events/s counts fragment events delivered, the unit both loops share
        results.append(
            CoreResult(
                dialect=stream.dialect,
                kind=kind,
                frames=frames,
                events=n_fragments,
                limit_events_per_s=n_fragments / lm,
                rillet_events_per_s=n_fragments / rm,
                ratio=lm / rm,
                limit_us_per_event=lm / n_fragments * 1e6,
                rillet_us_per_event=rm / n_fragments * 1e6,
            )
        )
    return results
