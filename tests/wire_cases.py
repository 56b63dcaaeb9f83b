"""Shared test support: the recorded provider fixtures, and running wire bytes through the core.

Each fixture is `<case>.<sse|ndjson|json>` with `<case>.expected.json` beside it: a JSON array of
content items, then a `stop` entry or an `error` entry naming the error class (docs/wire.md §0).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import trio
from rillet import RilletError, TurnRequest, UniEvent, encode_json, user
from rillet._core._policy import Policy
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet.lowlevel import WireDecoder
from rillet.providers import Provider, Secret
from rillet.transports.testing import Reply, open_loopback_provider, split

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rillet._turn._turn import TurnResult
    from rillet.providers import Dialect

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
WIRE_SUFFIXES = (".sse", ".ndjson", ".json")


def cases(folder: str) -> list[str]:
    """The case names of one dialect's fixture folder, sorted."""
    return sorted(
        p.name.removesuffix(".expected.json") for p in (FIXTURES / folder).glob("*.expected.json")
    )


def wire_path(folder: str, case: str) -> Path:
    """The wire file of a case."""
    for suffix in WIRE_SUFFIXES:
        path = FIXTURES / folder / f"{case}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"{folder}/{case}")


def expected(folder: str, case: str) -> list[str]:
    """The expected entries, each as canonical JSON text (so key order is compared too)."""
    entries = json.loads((FIXTURES / folder / f"{case}.expected.json").read_text("utf-8"))
    return [json.dumps(entry, ensure_ascii=False) for entry in entries]


def entry_of(event: UniEvent) -> str:
    """A UniEvent as an expected entry (docs/wire.md §0), canonical JSON text."""
    if event.event_type == "stop":
        wire = json.loads(encode_json(event))
        entry: dict[str, Any] = {
            "type": "stop",
            "finish_reason": wire["finish_reason"],
            "usage_metadata": wire["usage_metadata"],
        }
        return json.dumps(entry, ensure_ascii=False)
    (item,) = json.loads(encode_json(event))["content_items"]
    return json.dumps(item, ensure_ascii=False)


def error_entry(exc: BaseException) -> str:
    """An error as an expected entry."""
    return json.dumps({"type": "error", "error": type(exc).__name__})


def chunkings(data: bytes, *, seed: int = 7) -> Iterator[tuple[str, list[bytes]]]:
    """The ways each fixture is fed: whole, small arbitrary chunks, and one byte at a time."""
    yield "whole", [data]
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(data):
        n = rng.randint(1, 17)
        chunks.append(data[i : i + n])
        i += n
    yield "small", chunks
    yield "bytewise", [data[i : i + 1] for i in range(len(data))]


def cut_at(data: bytes, points: list[int]) -> list[bytes]:
    """`data` cut at these offsets (any order, repeats and out-of-range values allowed; empty
    pieces kept)."""
    marks = sorted({min(max(p, 0), len(data)) for p in points})
    chunks, start = [], 0
    for mark in marks:
        chunks.append(data[start:mark])
        start = mark
    chunks.append(data[start:])
    return chunks


def run(dialect: Dialect, chunks: list[bytes], *, stream: bool = True) -> list[str]:
    """Feed the chunks through framing, dialect and grammar; the entries that come out, with an
    error entry last if the stream raised."""
    decoder = WireDecoder(dialect, stream=stream, clock=lambda: 0)
    events: list[UniEvent] = []
    error: list[str] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk, events)
        decoder.close(events)
    except RilletError as exc:
        error.append(error_entry(exc))
    return [entry_of(e) for e in events] + error


async def turn_over_loopback(
    dialect: Dialect, body: bytes, *, content_type: str = "text/event-stream"
) -> tuple[TurnResult, int]:
    """One whole turn of `dialect` against the loopback provider, which answers every request
    with `body` (in 64-byte chunks): the turn's result and how many requests it made. Run it
    under a `MockClock` with a small autojump threshold (real sockets, virtual backoff)."""
    reply = Reply(chunks=split(body, 64), content_type=content_type)
    with trio.fail_after(60):
        async with open_loopback_provider([reply] * 8) as server:
            provider = Provider(dialect, f"{server.url}/v1", "test-model", api_key=Secret("k" * 16))
            async with httpx.AsyncClient() as client:
                result = await run_turn(
                    TurnRequest(messages=[user("hi")]),
                    provider,
                    client=client,
                    policy=Policy(random=lambda: 0.0),
                    limiter=RateLimiter(),
                )
            return result, len(server.requests)
