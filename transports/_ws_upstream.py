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

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio
import trio_websocket
from rillet._upstream import Upstream, UpstreamError

from ._http_upstream import _tls_context
from ._memory_upstream import MemoryExchange

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from rillet._upstream import Exchange
    from rillet.providers._base import HttpRequest

__all__ = ["SchemeUpstream", "WebSocketExchange", "WebSocketUpstream", "open_websocket_upstream"]

_NORMAL_CLOSURE = (1000, 1001)  # normal, going away


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
        url = request.url
        context = _tls_context() if url.lower().startswith("wss:") else None
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        started = False
        try:
            async with trio_websocket.open_websocket_url(
                url,
                context,
                extra_headers=headers,
                message_queue_size=self.queue,
                max_message_size=self.max_message,
                connect_timeout=math.inf,  # waits on the provider are the handler's deadlines
                disconnect_timeout=5,
            ) as ws:
                for message in request.messages:
                    await ws.send_message(message.decode("utf-8"))
                exchange = WebSocketExchange(ws)
                task_status.started(exchange)
                started = True
                await exchange.wait_closed()
        except trio_websocket.ConnectionRejected as exc:
            if started:
                return
            body = exc.body or b""
            head = {k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers}
            task_status.started(MemoryExchange([body] if body else [], exc.status_code, head, 0.0))
        except (
            trio_websocket.HandshakeError,
            trio_websocket.ConnectionClosed,
            OSError,
            trio.BrokenResourceError,
        ) as exc:
            if started:
                return  # the exchange already saw the end, or its closer did not care
            raise UpstreamError(type(exc).__name__, str(exc)) from exc


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
