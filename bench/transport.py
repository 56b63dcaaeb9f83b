"""In-memory httpx transports that answer every request with the same recorded body, read by
read, so every contestant consumes the same bytes with no network in between.

httpx only: the peers' driver (another virtualenv) uses it too. Some SDKs use `httpx2`, a
fork with the same transport API; `transport_class(httpx2)` builds the same transport for it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
    from types import ModuleType

__all__ = ["ChunkStream", "ChunkTransport", "transport_class"]


class _StreamBody:
    """A response body handed over as the given reads, sync or async.

    `pace` (async only) is awaited before every read after the first: a `trio.sleep` spaces
    the reads as a provider emitting tokens would. `mark` is set to `time.perf_counter()` just
    before read number `mark_at` is handed over (the moment those bytes are "available").
    """

    def __init__(
        self,
        chunks: Sequence[bytes],
        *,
        pace: Callable[[], Awaitable[object]] | None = None,
        mark_at: int | None = None,
    ) -> None:
        self._chunks = chunks
        self._pace = pace
        self._mark_at = mark_at
        self.mark: float | None = None

    def __iter__(self) -> Iterator[bytes]:
        mark_at = self._mark_at
        for i, c in enumerate(self._chunks):
            if i == mark_at:
                self.mark = time.perf_counter()
            yield c

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pace, mark_at = self._pace, self._mark_at
        for i, c in enumerate(self._chunks):
            if pace is not None and i:
                await pace()
            if i == mark_at:
                self.mark = time.perf_counter()
            yield c

    def close(self) -> None:
        """Nothing to release."""

    async def aclose(self) -> None:
        """Nothing to release."""


class ChunkStream(_StreamBody, httpx.SyncByteStream, httpx.AsyncByteStream):
    """`_StreamBody` as an httpx byte stream."""


class _Answerer:
    """Answers every request 200 with `chunks` as the body (a fresh stream each time).

    `streams` keeps every body handed out when `keep` is set, so a caller can read their marks.
    """

    _module: Any = httpx
    _stream_class: Any = ChunkStream

    def __init__(
        self,
        chunks: Sequence[bytes],
        content_type: str = "text/event-stream",
        *,
        pacer: Callable[[], Callable[[], Awaitable[object]]] | None = None,
        mark_at: int | None = None,
        keep: bool = False,
    ) -> None:
        self.chunks = chunks
        self.content_type = content_type
        self._pacer = pacer
        self._mark_at = mark_at
        self._keep = keep
        self.streams: list[_StreamBody] = []

    def _response(self, request: Any) -> Any:
        pace = self._pacer() if self._pacer is not None else None
        stream = self._stream_class(self.chunks, pace=pace, mark_at=self._mark_at)
        if self._keep:
            self.streams.append(stream)
        headers = {"content-type": self.content_type}
        return self._module.Response(200, headers=headers, stream=stream, request=request)

    def handle_request(self, request: Any) -> Any:
        """Read the request; answer with the body."""
        request.read()
        return self._response(request)

    async def handle_async_request(self, request: Any) -> Any:
        """Read the request; answer with the body."""
        await request.aread()
        return self._response(request)


class ChunkTransport(_Answerer, httpx.BaseTransport, httpx.AsyncBaseTransport):
    """`_Answerer` as an httpx transport, sync and async."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Read the request; answer with the body."""
        response: httpx.Response = super().handle_request(request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Read the request; answer with the body."""
        response: httpx.Response = await super().handle_async_request(request)
        return response


def transport_class(module: ModuleType) -> Any:
    """`ChunkTransport` for another module with httpx's transport API (e.g. `httpx2`)."""
    if module is httpx:
        return ChunkTransport
    stream = type("ChunkStream", (_StreamBody, module.SyncByteStream, module.AsyncByteStream), {})
    return type(
        "ChunkTransport",
        (_Answerer, module.BaseTransport, module.AsyncBaseTransport),
        {"_module": module, "_stream_class": stream},
    )
