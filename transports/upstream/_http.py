"""HTTP on httpx: the default upstream transport.

`HttpUpstream` wraps an `httpx.AsyncClient` (its own, or one the caller passes, whatever that
client's httpx transport: a mock, a replay, a real pool). A request's read timeout is lifted:
waits on the provider are the handler's deadlines alone (a client's 5 s default would cut a
provider that thinks before its first token); the client's connect, write and pool timeouts
still apply. httpx's failures leave as `UpstreamError`, named by httpx's class.

A plain client's requests go straight to its transport's pool (`_pool_path`: the same bytes,
fewer layers), and their bodies are read straight from the connection (`_body_path`); a reply
that is complete before its body ended reads that end (`finish`), so its
connection goes back to the pool for the next turn.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import urllib.request
from typing import TYPE_CHECKING

import attrs
import httpx
import trio
from rillet._core._errors import UpstreamError

from ._body_path import BodyPath
from ._pool_path import PoolPath

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from rillet._core._dialect import HttpRequest

__all__ = ["HttpExchange", "HttpUpstream"]

_DRAIN_LIMIT = 256  # chunks an abandoned body may still hand over from memory
_FINISH_GRACE = 0.005  # seconds a complete reply's body may take to end, to keep its connection
_FINISH_BYTES = 64 * 1024  # and how much of it may still be read (and dropped) for that


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client the turns make: building one costs ~100 ms."""
    return ssl.create_default_context()


def _proxies_in_environment() -> bool:
    """Whether httpx would find proxies to use: a `*_proxy` variable (any case), or a system
    whose proxies are not only the environment's (macOS's and Windows' settings)."""
    if urllib.request.getproxies is not urllib.request.getproxies_environment:
        return True
    return any(name[-6:].lower() == "_proxy" for name in os.environ)


def default_client() -> httpx.AsyncClient:
    """The client a turn makes when it is given none: no timeouts of its own (the handler's
    deadlines rule), no redirects followed, the process's shared TLS context.

    It reads proxies from the environment as httpx does, but only when some are named there:
    httpx's own look decodes every variable of the environment, two thirds of what making a
    client costs. (With a TLS context given, the environment means nothing else to it.)"""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None),
        follow_redirects=False,
        verify=tls_context(),
        trust_env=_proxies_in_environment(),
    )


@attrs.define(eq=False)
class HttpUpstream:
    """Requests over HTTP with an `httpx.AsyncClient`.

    Attributes:
        client: the client; a new one (no timeouts, no redirects) when none is given.
        owns_client: whether `aclose` closes the client (True for the one it made).
    """

    client: httpx.AsyncClient = attrs.field(factory=default_client)
    owns_client: bool = True
    _pool_path: PoolPath | bool | None = attrs.field(default=False, init=False)
    """The short way to the client's pool (`PoolPath`), None if it has none; False: not
    looked for yet."""

    @classmethod
    def wrapping(cls, client: httpx.AsyncClient) -> HttpUpstream:
        """An upstream over the caller's client, which stays the caller's to close."""
        return cls(client, owns_client=False)

    async def open(self, request: HttpRequest) -> HttpExchange:
        """Send the request; the exchange once the response's head has come."""
        path = self._pool_path
        if path is False:
            path = self._pool_path = PoolPath.of(self.client)
        if isinstance(path, PoolPath) and path.usable(request.url):
            try:
                response = await path.send(
                    request.method, request.url, request.headers, request.body
                )
            except httpx.TransportError as exc:
                raise UpstreamError(type(exc).__name__, str(exc)) from exc
            return HttpExchange(response)
        client = self.client
        limits = client.timeout
        timeout = httpx.Timeout(None, connect=limits.connect, write=limits.write, pool=limits.pool)
        built = client.build_request(
            request.method,
            request.url,
            headers=request.headers,
            content=request.body,
            timeout=timeout,
        )
        try:
            response = await client.send(built, stream=True)
        except httpx.TransportError as exc:
            raise UpstreamError(type(exc).__name__, str(exc)) from exc
        return HttpExchange(response)

    async def aclose(self) -> None:
        """Close the client if it is ours."""
        if self.owns_client:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.client.aclose()


class HttpExchange:
    """One HTTP response being read: its status, headers and body chunks.

    `receive` is httpx's own iterator step (no frame of ours per read), so it raises httpx's
    `TransportError` as it is: the exchange names it in `failures`, and `failure` makes it the
    `UpstreamError` it stands for (the `Exchange` protocol's fast path). A reply that came the
    short way (`PoolPath`) over HTTP/1.1 is read straight from its connection (`BodyPath`),
    which raises the `UpstreamError` itself.
    """

    __slots__ = ("_chunks", "_closed", "_headers", "_short", "receive", "response")

    failures: tuple[type[BaseException], ...] = (httpx.TransportError,)

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._headers: dict[str, str] | None = None
        self._closed = False
        # raw when the body has no content coding (httpx's decoding layer would only copy the
        # bytes through), decoded otherwise, or when an httpx transport already read it whole
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        raw = coding in ("", "identity") and not response.is_stream_consumed
        # raw: the response's own stream, not `aiter_raw`, whose layer per read only counts
        # bytes and re-chunks them (errors come the same: the transport's stream maps them)
        stream = response.stream
        # the short way (`BodyPath`): straight from httpcore's HTTP/1.1 connection
        self._short = BodyPath.of(stream) if raw else None
        self._chunks: AsyncIterator[bytes] | None = None
        if self._short is not None:
            self.receive: Callable[[], Awaitable[bytes]] = self._short.receive
            return
        self._chunks = (
            stream.__aiter__()
            if raw and isinstance(stream, httpx.AsyncByteStream)
            else response.aiter_bytes()
        )
        self.receive = functools.partial(anext, self._chunks, b"")
        """The next body chunk; `b""` at the end (httpx yields no empty chunks)."""

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        """The response headers, names lower-cased."""
        if self._headers is None:
            self._headers = {k.lower(): v for k, v in self.response.headers.items()}
        return self._headers

    async def finish(self) -> None:
        """The reply has said it is complete (a stop, `[DONE]`) before its body ended: read the
        body's end if it comes at once, bounded in time and bytes, so that httpx puts the
        connection back in the client's pool for the next request instead of closing it. What
        is read is dropped; a failure, or a body that does not end within the bounds, leaves
        `aclose` to close the connection as it would have."""
        if self._closed:
            return
        left = _FINISH_BYTES
        quiet = contextlib.suppress(httpx.HTTPError, httpx.StreamError)
        with trio.move_on_after(_FINISH_GRACE), quiet, contextlib.suppress(UpstreamError):
            while left > 0:
                chunk = await self.receive()
                if not chunk:
                    return
                left -= len(chunk)

    @staticmethod
    def failure(exc: BaseException) -> UpstreamError:
        """The `UpstreamError` for one of `failures`."""
        error = UpstreamError(type(exc).__name__, str(exc))
        error.__cause__ = exc
        return error

    async def aclose(self) -> None:
        """Close a response that may have been read only in part, even while cancelled.

        The connection closes first, so the rest of the body is never read from the network.
        Then the body's iterators (httpx's and its transport's: a chain of async generators)
        are run to their end: on the closed stream they finish at once (any wait raises
        `Cancelled` inside them, which ends them). Closing only the outermost would leave the
        inner ones suspended for the garbage collector, which trio reports as a
        `ResourceWarning` for each.
        """
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5):
                await self.response.aclose()
            if self._chunks is None:  # the short way: no iterator to end
                return
            with trio.CancelScope() as drain:
                drain.cancel()
                with contextlib.suppress(Exception):
                    count = 0
                    async for _ in self._chunks:
                        count += 1
                        if count >= _DRAIN_LIMIT:
                            break
