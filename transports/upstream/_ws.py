"""WebSocket on trio-websocket: the upstream for providers that stream over a socket.

An exchange is one WebSocket session: the request's URL and headers open it, its `messages`
are sent in order as text messages, and every message the server sends is one piece of the
reply (`receive`), until the exchange is closed (the handler closes it at the reply's stop:
such sessions stay open otherwise) or the server closes the socket (normal closure: the end of
the reply; any other code: `UpstreamError`). A refused handshake is a reply like any other:
its status, headers and body reach the dialect as an HTTP error would.

trio-websocket runs a reader task per connection, so each session is a task in the
upstream's nursery: `open_websocket_upstream()` gives one for a block of turns; `run_turn`
gives its own turn's when it routes a `ws://` or `wss://` request itself. Cancelling `open`
cancels the session; closing the exchange ends it (the close handshake runs in its task).
"""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs
import trio
import trio_websocket
from rillet._core._errors import UpstreamError
from rillet._core._upstream import Upstream

from ._http import tls_context
from ._memory import MemoryExchange

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from rillet._core._dialect import HttpRequest
    from rillet._core._upstream import Exchange

__all__ = ["SchemeUpstream", "WebSocketExchange", "WebSocketUpstream", "open_websocket_upstream"]

_NORMAL_CLOSURE = (1000, 1001)  # normal, going away
_CLOSE_GRACE = 5.0  # seconds the close handshake may take


class WebSocketExchange:
    """One open WebSocket session; its server messages are the reply's pieces."""

    __slots__ = ("_closed", "_ws", "headers", "status")

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self._closed = trio.Event()
        self.status = 200  # the handshake (101) succeeded
        handshake = ws.handshake_headers
        self.headers: Mapping[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in handshake
        }

    async def receive(self) -> bytes:
        """The next message (text as UTF-8); `b""` once the server closed normally."""
        if self._closed.is_set():
            return b""
        try:
            message = await self._ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            reason = exc.reason
            if reason is not None and reason.code not in _NORMAL_CLOSURE:
                raise UpstreamError("ConnectionClosed", f"code {reason.code}") from exc
            return b""
        return message.encode("utf-8") if isinstance(message, str) else message

    async def aclose(self) -> None:
        """End the session: its task closes the socket."""
        self._closed.set()

    async def wait_closed(self) -> None:
        """Until the exchange is closed."""
        await self._closed.wait()


@attrs.define(eq=False)
class WebSocketUpstream:
    """Requests over WebSocket; each session is a task in `nursery`.

    Attributes:
        nursery: where sessions run (see `open_websocket_upstream`).
        max_message: the largest message accepted (bytes); the dialect's frame cap refuses a
            smaller one with `FrameTooLarge`.
        queue: messages read ahead of the consumer.
    """

    nursery: trio.Nursery
    max_message: int = 32 * 1024 * 1024 + 1
    queue: int = 64

    async def open(self, request: HttpRequest) -> Exchange:
        """Open the session and send the request's messages."""
        exchange: Exchange = await self.nursery.start(self._session, request)
        return exchange

    async def aclose(self) -> None:
        """Sessions end with their exchanges: nothing else to release."""

    async def _session(
        self,
        request: HttpRequest,
        task_status: trio.TaskStatus[Exchange] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One session, from the TCP connection to its close. The socket is ours, so it is
        closed whoever ends the session (trio-websocket leaves it open when the server does)."""
        parts = urlsplit(request.url)
        secure = parts.scheme.lower() == "wss"
        host = parts.hostname or ""
        port = parts.port or (443 if secure else 80)
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
        try:
            if secure:
                stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=tls_context(), https_compatible=True
                )
            else:
                stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamError("ConnectError", str(exc)) from exc
        started = _Started(task_status)
        try:
            failed: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    failed = await self._speak(nursery, stream, request, started)
                    nursery.cancel_scope.cancel()  # the reader task, should it still run
            except BaseExceptionGroup as group:  # the reader task's: a refusal, a broken socket
                failed = started.settle(group)
            if failed is not None:
                raise failed
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await stream.aclose()

    async def _speak(
        self,
        nursery: trio.Nursery,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        request: HttpRequest,
        started: _Started,
    ) -> BaseException | None:
        """The handshake, the request's messages, then the exchange until it is closed; an
        error before the exchange started is returned (raised by the caller, outside the
        nursery, so never inside an exception group)."""
        parts = urlsplit(request.url)
        default = 443 if parts.scheme.lower() == "wss" else 80
        host = parts.netloc if parts.port not in (None, default) else parts.hostname or ""
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        try:
            ws = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                host,
                resource,
                extra_headers=headers,
                message_queue_size=self.queue,
                max_message_size=self.max_message,
            )
            for message in request.messages:
                await ws.send_message(message.decode("utf-8"))
        except trio_websocket.ConnectionRejected as exc:
            started.reject(exc)
            return None
        except _BROKEN as exc:
            return _upstream_error(exc)
        exchange = WebSocketExchange(ws)
        started.start(exchange)
        await exchange.wait_closed()
        with trio.move_on_after(_CLOSE_GRACE):
            await ws.aclose()  # the close handshake, when the server has not closed already
        return None


_BROKEN = (
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    trio.BrokenResourceError,
    OSError,
)


def _upstream_error(exc: BaseException) -> UpstreamError:
    error = UpstreamError(type(exc).__name__, str(exc))
    error.__cause__ = exc
    return error


class _Started:
    """Whether a session's exchange has been handed over, and the hand-over."""

    __slots__ = ("done", "task_status")

    def __init__(self, task_status: trio.TaskStatus[Exchange]) -> None:
        self.task_status = task_status
        self.done = False

    def start(self, exchange: Exchange) -> None:
        self.done = True
        self.task_status.started(exchange)

    def reject(self, exc: trio_websocket.ConnectionRejected) -> None:
        """A refused handshake, handed over as the reply it is."""
        body = exc.body or b""
        head = {k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers}
        self.start(MemoryExchange([body] if body else [], exc.status_code, head, 0.0))

    def settle(self, group: BaseExceptionGroup[BaseException]) -> BaseException | None:
        """What the reader task's failure means: nothing once the exchange is out (its reads
        saw the end), else the refusal as a reply, or an `UpstreamError` to raise."""
        rejected, _ = group.split(trio_websocket.ConnectionRejected)
        if rejected is not None and not self.done:
            first = _leaf(rejected)
            assert isinstance(first, trio_websocket.ConnectionRejected)
            self.reject(first)
            return None
        _, other = group.split((trio_websocket.ConnectionRejected, *_BROKEN))
        if other is not None:
            raise group  # a cancel, or a failure that is not the socket's: not ours to hide
        return None if self.done else _upstream_error(_leaf(group))


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


@asynccontextmanager
async def open_websocket_upstream(**options: int) -> AsyncIterator[WebSocketUpstream]:
    """A WebSocket upstream for the block (its sessions end with it)."""
    async with trio.open_nursery() as nursery:
        yield WebSocketUpstream(nursery, **options)
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class SchemeUpstream:
    """The turn's default upstream: `ws://` and `wss://` requests over WebSocket (sessions in
    `nursery`), every other one over `http`.

    Attributes:
        http: the HTTP upstream (over the caller's client, or its own).
        nursery: where WebSocket sessions run.
    """

    http: Upstream
    nursery: trio.Nursery
    _ws: WebSocketUpstream | None = None

    async def open(self, request: HttpRequest) -> Exchange:
        """Route by the URL's scheme."""
        if request.url[:4].lower() in ("ws:/", "wss:"):
            if self._ws is None:
                self._ws = WebSocketUpstream(self.nursery)
            return await self._ws.open(request)
        return await self.http.open(request)

    async def aclose(self) -> None:
        """Close the HTTP upstream (WebSocket sessions end with their exchanges)."""
        await self.http.aclose()
