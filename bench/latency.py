"""Time to first delta: from the moment the read holding the first text fragment is handed over
by the transport to the moment that fragment reaches a sink.

Each stream's first read ends right after the frame carrying the first text fragment
(`wire.first_delta_stream`); the in-memory transport stamps `time.perf_counter()` just before
handing it over. The next read comes `_GAP` later, as the next token would: a body that is all
there at once would let the reading task go on decoding later reads before the first delta's
batch is passed on, which no network allows. A kind with `+4k` (`openai-chat+4k`) is the same
stream with a 4 KB first read instead, holding the first fragment and a dozen or more frames
after it, as a provider's first packet often does: it shows what the first delta waits for
when the rest of its read is decoded first. Contestants, interleaved iteration by iteration:

- `limit-httpx`: the limit loop reading through httpx in one task; stamped once that read's
  frames are decoded;
- `pipeline`: `run_turn` with a sink that stamps the first batch holding a text delta;
- `jsonl`: `open_turn` with a `JSONLSink` (null device), stamped once that sink has written the
  batch holding the first text delta.

This is a latency, so it is wall time (`perf_counter`); the median over many turns resists the
noise of a shared machine.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import IO, TYPE_CHECKING, Any

import httpx
import trio
from rillet import TextDelta, UniEvent, open_turn, run_turn
from rillet.transports.sinks import JSONLSink

from .contestants import dialect_of, limit_httpx, provider_for, request
from .transport import ChunkTransport
from .wire import first_delta_stream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rillet import SinkBatch

    from .wire import Stream

__all__ = ["TTFD_CONTESTANTS", "TTFD_KINDS", "Samples", "TtfdResult", "run_ttfd", "ttfd_stream"]

TTFD_KINDS = (
    "openai-chat",
    "openai-responses",
    "anthropic",
    "gemini",
    "ollama",
    "openai-chat+4k",
    "anthropic+4k",
)
_BIG_FIRST_READ = 4096
TTFD_CONTESTANTS = ("limit-httpx", "pipeline", "jsonl")
_WARMUP = 5
_GAP = 0.002  # seconds between the reads after the first


def _has_text(batch: SinkBatch) -> bool:
    for item in batch.uni:
        if type(item) is UniEvent:
            for part in item.content_items:
                if type(part) is TextDelta:
                    return True
    return False


class _Stamp:
    """A sink that stamps the first batch with a text delta, optionally after an inner sink."""

    def __init__(self, inner: JSONLSink | None = None) -> None:
        self.inner = inner
        self.at: float | None = None

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Stamp on the turn's task (as the JSONL sink writes there)."""
        if self.inner is not None:
            self.inner.deliver_nowait(batch)
        if self.at is None and _has_text(batch):
            self.at = time.perf_counter()
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        if self.inner is not None:
            await self.inner.deliver(batch)
        if self.at is None and _has_text(batch):
            self.at = time.perf_counter()

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


class Samples:
    """One contestant's latencies, in µs, and their median and quantiles."""

    def __init__(self) -> None:
        self.samples_us: list[float] = []
        self.error: str | None = None

    def median(self) -> float:
        """The median, µs."""
        return statistics.median(self.samples_us) if self.samples_us else float("nan")

    def percentile(self, q: float) -> float:
        """The `q` quantile (0..1), µs."""
        if not self.samples_us:
            return float("nan")
        ordered = sorted(self.samples_us)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class TtfdResult(Samples):
    """One contestant on one stream kind: the time to first delta of each turn, in µs."""

    def __init__(self, contestant: str, kind: str) -> None:
        super().__init__()
        self.contestant = contestant
        self.kind = kind

    def as_dict(self) -> dict[str, Any]:
        """For results.json."""
        return {
            "contestant": self.contestant,
            "kind": self.kind,
            "n": len(self.samples_us),
            "median_us": self.median(),
            "p10_us": self.percentile(0.10),
            "p90_us": self.percentile(0.90),
            "p99_us": self.percentile(0.99),
            "error": self.error,
        }


async def _one(
    contestant: str,
    stream: Stream,
    client: httpx.AsyncClient,
    transport: ChunkTransport,
    devnull: IO[bytes],
) -> float:
    """One turn; its time to first delta in µs."""
    stamp: list[float] = []
    if contestant == "limit-httpx":
        ndjson = dialect_of(stream.dialect).framing == "ndjson"
        await limit_httpx(client, ndjson, lambda: stamp.append(time.perf_counter()))
    else:
        provider = provider_for(stream.dialect)
        if contestant == "pipeline":
            sink = _Stamp()
            result = await run_turn(request(), provider, client=client, sinks=[sink])
        else:
            sink = _Stamp(JSONLSink(devnull))
            async with open_turn(request(), provider, client=client, sinks=[sink]) as turn:
                result = await turn.result()
        if not result.ok:
            raise RuntimeError(f"turn {result.outcome.name}: {result.error!r}")
        if sink.at is not None:
            stamp.append(sink.at)
    mark = transport.streams[-1].mark
    transport.streams.clear()
    if not stamp or mark is None:
        raise RuntimeError("no first delta was stamped")
    return (stamp[0] - mark) * 1e6


def ttfd_stream(kind: str) -> Stream:
    """The stream of a ttfd kind: `first_delta_stream`, its first read 4 KB for `+4k`."""
    base, _, big = kind.partition("+")
    stream = first_delta_stream(base, 400 if big else 64)
    if not big:
        return stream
    data = b"".join(stream.chunks)
    first, rest = data[:_BIG_FIRST_READ], data[_BIG_FIRST_READ:]
    reads = [rest[i : i + 1024] for i in range(0, len(rest), 1024)]
    return dataclasses.replace(stream, kind=base, chunks=[first, *reads])


def _gap() -> Callable[[], Awaitable[object]]:
    """One body's pace: a gap before its second read only (the rest follow at once)."""
    gaps = [_GAP]

    async def pace() -> None:
        if gaps:
            await trio.sleep(gaps.pop())

    return pace


async def _run(
    kinds: tuple[str, ...], iterations: int, progress: Callable[[str], None]
) -> list[TtfdResult]:
    results = {(c, k): TtfdResult(c, k) for k in kinds for c in TTFD_CONTESTANTS}
    with open(os.devnull, "wb") as devnull:  # noqa: ASYNC230 - the null device never blocks
        for kind in kinds:
            stream = ttfd_stream(kind)
            transport = ChunkTransport(
                stream.chunks, stream.content_type, mark_at=0, keep=True, pacer=_gap
            )
            async with httpx.AsyncClient(transport=transport) as client:
                for i in range(_WARMUP + iterations):
                    if i % 20 == 0:
                        progress(f"ttfd {kind}: turn {i + 1}/{_WARMUP + iterations}")
                    order = TTFD_CONTESTANTS if i % 2 == 0 else TTFD_CONTESTANTS[::-1]
                    for contestant in order:
                        res = results[(contestant, kind)]
                        if res.error is not None:
                            continue
                        try:
                            us = await _one(contestant, stream, client, transport, devnull)
                        except Exception as exc:
                            res.error = f"{type(exc).__name__}: {exc}"[:200]
                            continue
                        if i >= _WARMUP:
                            res.samples_us.append(us)
    return list(results.values())


def run_ttfd(
    kinds: tuple[str, ...] = TTFD_KINDS,
    iterations: int = 200,
    progress: Callable[[str], None] = lambda _: None,
) -> list[TtfdResult]:
    """Measure every contestant on every stream kind, `iterations` turns each, interleaved."""
    return trio.run(_run, kinds, iterations, progress)
