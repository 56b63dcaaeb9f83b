"""Replay: a recorded wire file played back as if the provider were sending it.

`ReplayTransport` answers every request with the recorded bytes, chunk by chunk at a chosen
pace, so the whole pipeline (dialect, grammar, handler, sinks) runs exactly as it would against
the live provider. It is an upstream transport of rillet's own (`run_turn(upstream=
ReplayTransport(path))`: no HTTP at all) and an httpx transport too (`httpx.AsyncClient(
transport=ReplayTransport(path))` passed to `run_turn(client=...)`). The dialect is the one that
recorded the file (the caller's provider says which).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import httpx
import trio

from .upstream._memory import MemoryExchange

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._core._dialect import HttpRequest

__all__ = ["ReplayTransport", "content_type_for"]

_CONTENT_TYPES = {
    ".sse": "text/event-stream",
    ".ndjson": "application/x-ndjson",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
}


def content_type_for(path: Path) -> str:
    """The Content-Type a recording was served with, from its suffix."""
    return _CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")


class _PacedStream(httpx.AsyncByteStream):
    def __init__(self, data: bytes, chunk_size: int, delay: float) -> None:
        self._data = data
        self._chunk_size = chunk_size
        self._delay = delay

    async def __aiter__(self) -> AsyncIterator[bytes]:
        data, size = self._data, self._chunk_size
        for i in range(0, len(data), size):
            if self._delay:
                await trio.sleep(self._delay)
            yield data[i : i + size]


@attrs.define(eq=False)
class ReplayTransport(httpx.AsyncBaseTransport):
    """Answers every request with a recorded body, as an upstream or as an httpx transport.

    Attributes:
        path: the recording (`.sse`, `.ndjson`, `.json`).
        chunk_size: bytes per read (small values cut events and characters, as networks do).
        delay: seconds before each chunk (0: as fast as possible).
        status: the HTTP status to answer with.
        requests: how many requests it answered.
    """

    path: Path = attrs.field(converter=Path)
    chunk_size: int = 256
    delay: float = 0.0
    status: int = 200
    requests: int = 0
    _data: bytes = attrs.field(init=False, default=b"", repr=False)

    def __attrs_post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self._data = self.path.read_bytes()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The recording, paced."""
        self.requests += 1
        return httpx.Response(
            self.status,
            headers={"content-type": content_type_for(self.path)},
            stream=_PacedStream(self._data, self.chunk_size, self.delay),
            request=request,
        )

    async def open(self, request: HttpRequest) -> MemoryExchange:
        """The recording, paced, as an upstream exchange."""
        self.requests += 1
        data, size = self._data, self.chunk_size
        pieces = [data[i : i + size] for i in range(0, len(data), size)]
        headers = {"content-type": content_type_for(self.path)}
        await trio.lowlevel.checkpoint()
        return MemoryExchange(pieces, self.status, headers, self.delay)

    async def aclose(self) -> None:
        """Nothing to release."""
