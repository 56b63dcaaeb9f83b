"""Core decode throughput: rillet's sans-I/O decode in one task against the limit loop.

For each dialect, the same 20,000-fragment text stream (network-sized reads that cut events and
UTF-8 characters) is fed to:

- the limit: a minimal loop that splits lines, keeps `data:` lines (or NDJSON lines) and
  msgspec-decodes each one, doing nothing else;
- rillet's core: SSE/NDJSON decoder -> dialect (typed msgspec decode) -> lanes -> grammar ->
  accumulator, all in one task.

Contestants are interleaved round by round; the report gives medians and the ratio of rillet's
events/s to the limit's, measured in the same run.
"""

from __future__ import annotations

import functools
import gc
import importlib
import statistics
import time
from typing import TYPE_CHECKING, Any

import msgspec

from pipeline import Accumulator, WireDecoder

from .wire import GENERATORS, chunk, fragments

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.providers import Dialect

__all__ = ["CoreResult", "run_core"]

_decode = msgspec.json.decode


def limit_loop(chunks: list[bytes], ndjson: bool) -> int:
    """Split lines and msgspec-decode each data line; the count of decoded frames."""
    n = 0
    tail = b""
    for c in chunks:
        lines = (tail + c).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if ndjson:
                if line:
                    _decode(line)
                    n += 1
            elif line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                _decode(line[6:])
                n += 1
    return n


def rillet_core(dialect: Dialect, chunks: list[bytes]) -> tuple[int, str]:
    """The full sans-I/O decode; the count of UniEvents and the answer text."""
    decoder = WireDecoder(dialect, clock=lambda: 0)
    acc = Accumulator()
    n = 0
    for c in chunks:
        events = decoder.feed(c)
        n += len(events)
        acc.feed_many(events)
    events = decoder.close()
    n += len(events)
    acc.feed_many(events)
    return n, acc.text


class CoreResult(msgspec.Struct):
    """One dialect's figures."""

    dialect: str
    frames: int
    events: int
    limit_events_per_s: float
    rillet_events_per_s: float
    ratio: float
    limit_us_per_event: float
    rillet_us_per_event: float


def _time(fn: Callable[[], Any]) -> float:
    """CPU seconds the call took: the loops are single-threaded and CPU-bound, and CPU time is
    far less disturbed than wall time by other work on a shared machine."""
    gc.collect()
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def run_core(
    n_fragments: int = 20_000,
    rounds: int = 7,
    dialects: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[CoreResult]:
    """Measure every dialect (or the named ones); medians over `rounds` interleaved rounds."""
    parts = fragments(n_fragments)
    text = "".join(parts)
    results = []
    for name in dialects or list(GENERATORS):
        module, cls, generate = GENERATORS[name]
        try:
            dialect: Dialect = getattr(importlib.import_module(module), cls)()
        except ImportError:
            progress(f"{name}: dialect not available, skipped")
            continue
        chunks = chunk(generate(parts))
        ndjson = dialect.framing == "ndjson"
        frames = limit_loop(chunks, ndjson)
        events, got = rillet_core(dialect, chunks)
        if got != text:
            raise AssertionError(f"{name}: rillet's text differs from the generated text")
        limit_t, rillet_t = [], []
        for r in range(rounds):
            progress(f"{name}: round {r + 1}/{rounds}")
            limit_t.append(_time(functools.partial(limit_loop, chunks, ndjson)))
            rillet_t.append(_time(functools.partial(rillet_core, dialect, chunks)))
        lm, rm = statistics.median(limit_t), statistics.median(rillet_t)
        # events/s counts text fragments delivered, the unit both loops share
        results.append(
            CoreResult(
                dialect=name,
                frames=frames,
                events=events,
                limit_events_per_s=n_fragments / lm,
                rillet_events_per_s=n_fragments / rm,
                ratio=lm / rm,
                limit_us_per_event=lm / n_fragments * 1e6,
                rillet_us_per_event=rm / n_fragments * 1e6,
            )
        )
    return results
