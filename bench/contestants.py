"""rillet's contestants and the limit loops, in this (the main) virtualenv.

Each contestant consumes one whole `Stream` and returns the fingerprint of what it assembled
(`Expected.digest`), or a description of what went wrong; the caller times it.

- `limit`: the floor. One loop over the reads that splits lines and msgspec-decodes every data
  line (or NDJSON line), doing nothing else.
- `limit-httpx`: the same loop reading the body through an `httpx.AsyncClient` on the in-memory
  transport in one trio task: the floor for anything that reads through httpx.
- `core`: rillet's sans-I/O decode in one task: `WireDecoder` (framing, dialect, grammar) and
  `Accumulator`, over the reads.
- `pipeline`: the full actor pipeline, `run_turn` with an httpx client on the in-memory
  transport (handler, accumulator actor, logs, run events).
- `jsonl`: `open_turn` with a `JSONLSink` writing the run events to the null device.
- `pipeline-hops`: `run_turn` with `Policy(graph="hops")`, every actor on its own task with
  real channels between them: what the default's chaining saves.
- `pipeline-16k` (diagnostic): `run_turn` on the same bytes in 16 KiB reads, to tell the cost
  paid per read from the cost paid per event.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from functools import cache
from typing import IO, TYPE_CHECKING, Any

import httpx
import msgspec
from rillet import (
    Policy,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    TurnRequest,
    UniMessage,
    open_turn,
    run_turn,
    user,
)
from rillet.lowlevel import Accumulator, WireDecoder
from rillet.providers import Provider, Secret
from rillet.transports.sinks import JSONLSink

from .transport import ChunkTransport
from .wire import GENERATORS, digest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rillet.providers import Dialect

    from .wire import Stream

__all__ = [
    "RILLET",
    "Contestant",
    "dialect_of",
    "http_client",
    "limit_httpx",
    "limit_loop",
    "message_digest",
    "provider_for",
    "request",
]

_decode = msgspec.json.decode
_BIG_READ = 16 * 1024
BASE_URL = "http://bench.invalid/v1"


@cache
def dialect_of(name: str) -> Dialect:
    """The dialect a stream's generator speaks (a key of `GENERATORS`)."""
    module, cls, _ = GENERATORS[name]
    dialect: Dialect = getattr(importlib.import_module(module), cls)()
    return dialect


@cache
def provider_for(name: str) -> Provider:
    """A provider for the dialect `name`; the in-memory transport answers whatever it asks."""
    return Provider(
        dialect=dialect_of(name),
        base_url=BASE_URL,
        model="bench-model",
        api_key=Secret("sk-bench-0000000000000000"),
    )


def request() -> TurnRequest:
    """The turn every contestant asks for."""
    return TurnRequest(messages=[user("Write the notes down.")])


def http_client(stream: Stream, **transport: Any) -> httpx.AsyncClient:
    """An httpx client whose every request is answered with the stream's reads."""
    return httpx.AsyncClient(
        transport=ChunkTransport(stream.chunks, stream.content_type, **transport)
    )


def message_digest(message: UniMessage) -> str:
    """The fingerprint of a rillet message: its text, its thinking, its tool calls' arguments."""
    text: list[str] = []
    thinking: list[str] = []
    calls: list[object] = []
    for item in message.content_items:
        if isinstance(item, TextDone):
            text.append(item.text)
        elif isinstance(item, ThinkingDone):
            thinking.append(item.thinking)
        elif isinstance(item, ToolCallDone):
            calls.append(item.arguments)
    return digest("".join(text), "".join(thinking), calls)


# --- the limit loops -----------------------------------------------------------------------------


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


async def limit_httpx(
    client: httpx.AsyncClient,
    ndjson: bool,
    on_first: Callable[[], object] | None = None,
) -> int:
    """The limit loop reading through httpx in this task; `on_first` is called once the first
    read that held whole frames has been decoded (what the time-to-first-delta benchmark
    stamps)."""
    n = 0
    tail = b""
    async with client.stream("POST", BASE_URL) as response:
        async for c in response.aiter_bytes():
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
            if on_first is not None and n:
                on_first()
                on_first = None
    return n


# --- the contestants ------------------------------------------------------------------------------


class Contestant:
    """One way of consuming a stream, set up once per stream (untimed), run many times."""

    name = ""
    label = ""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.ndjson = dialect_of(stream.dialect).framing == "ndjson"

    def run(self) -> Awaitable[str]:
        """Consume the stream once; the fingerprint of what was assembled."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what setup made."""


class _Limit(Contestant):
    name = "limit"
    label = "limit loop (reads in memory)"

    async def run(self) -> str:
        n = limit_loop(self.stream.chunks, self.ndjson)
        return self.stream.expected.digest() if n >= self.stream.events else f"{n} frames"


class _LimitHttpx(Contestant):
    name = "limit-httpx"
    label = "limit loop through httpx"

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream)
        self.client = http_client(stream)

    async def run(self) -> str:
        n = await limit_httpx(self.client, self.ndjson)
        return self.stream.expected.digest() if n >= self.stream.events else f"{n} frames"

    async def aclose(self) -> None:
        await self.client.aclose()


class _Core(Contestant):
    name = "core"
    label = "rillet core (WireDecoder + Accumulator, one task)"

    async def run(self) -> str:
        decoder = WireDecoder(dialect_of(self.stream.dialect), clock=lambda: 0)
        acc = Accumulator()
        for c in self.stream.chunks:
            acc.feed_many(decoder.feed(c))
        acc.feed_many(decoder.close())
        return message_digest(acc.message())


class _Pipeline(Contestant):
    name = "pipeline"
    label = "rillet run_turn (full actor pipeline)"

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream)
        self.client = http_client(stream)
        self.provider = provider_for(stream.dialect)
        self.request = request()

    async def run(self) -> str:
        result = await run_turn(self.request, self.provider, client=self.client)
        if not result.ok:
            return f"turn {result.outcome.name}: {result.error!r}"[:200]
        return message_digest(result.message)

    async def aclose(self) -> None:
        await self.client.aclose()


class _PipelineHops(_Pipeline):
    """`run_turn` with every actor on its own task (`Policy(graph="hops")`)."""

    name = "pipeline-hops"
    label = "rillet run_turn, hops mode"
    policy = Policy(graph="hops")

    async def run(self) -> str:
        result = await run_turn(self.request, self.provider, client=self.client, policy=self.policy)
        if not result.ok:
            return f"turn {result.outcome.name}: {result.error!r}"[:200]
        return message_digest(result.message)


class _PipelineBigReads(_Pipeline):
    """Diagnostic: the same bytes in 16 KiB reads. Against `pipeline` it splits rillet's cost
    into what it pays per read and what it pays per event."""

    name = "pipeline-16k"
    label = "rillet run_turn, 16 KiB reads (diagnostic)"

    def __init__(self, stream: Stream) -> None:
        data = b"".join(stream.chunks)
        big = [data[i : i + _BIG_READ] for i in range(0, len(data), _BIG_READ)]
        super().__init__(dataclasses.replace(stream, chunks=big))


class _Jsonl(_Pipeline):
    name = "jsonl"
    label = "rillet open_turn + JSONL sink (null device)"

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream)
        self.sink_file: IO[bytes] = open(os.devnull, "wb")  # noqa: SIM115 - closed by aclose

    async def run(self) -> str:
        sink = JSONLSink(self.sink_file)
        async with open_turn(self.request, self.provider, client=self.client, sinks=[sink]) as t:
            result = await t.result()
        if not result.ok:
            return f"turn {result.outcome.name}: {result.error!r}"[:200]
        return message_digest(result.message)

    async def aclose(self) -> None:
        await super().aclose()
        self.sink_file.close()


# in the order they are reported
RILLET: dict[str, type[Contestant]] = {
    c.name: c
    for c in (_Limit, _LimitHttpx, _Core, _Pipeline, _PipelineHops, _Jsonl, _PipelineBigReads)
}
