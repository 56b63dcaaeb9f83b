"""A run's events fanned out to its subscribers, over SSE (`GET /v1/runs/{id}/events`) and
WebSocket (`GET /v1/runs/{id}/ws`), by one pump parameterised by how its connection carries
them (`Wire`).

A batch is encoded once for every connection of a kind (`LastBatch`: the hub hands every
subscriber it pushes to in one sweep the same list), and written by the hub straight to each
connection while its task waits (`Pusher`); a connection that cannot take it at once gets it
from its own task, which also flushes what a push left parked and sends the heartbeats.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import attrs
import msgspec
import trio
import trio_websocket
from rillet._core._encode import SSE_HEARTBEAT, SSE_RETRY, sse_run_events, ws_text_frames
from rillet._core._errors import CursorExpired, SubscriberDropped
from rillet._hub._hub import Entry, Subscription

from ._http11 import ConnectionStream
from ._replies import GONE, CloseConnection, ErrorReply, Refused, not_found
from ._runs import Runs
from ._shared import Shared
from ._streamed import SSE_HEADERS, end_stream, until_gone
from ._ws import close_websocket, handshake_problem, open_websocket
from ._ws_frames import ClientFrames, TokenBucket

if TYPE_CHECKING:
    from ._http11 import HttpConnection, Request

__all__ = ["Fanout", "LastBatch", "Pusher", "Wire", "pump"]


@attrs.define(eq=False)
class LastBatch:
    """The bytes of the batch encoded last, and when: a run's events are encoded once for all
    the connections of a kind handed the same list."""

    batch: list[Entry] | None = None
    data: bytes = b""
    at: float = 0.0


@attrs.define(eq=False)
class Pusher:
    """A subscriber's `push` writer: new events written straight to its connection, without
    waiting and without waking its task, while the task waits in `next_batch`.

    Attributes:
        stream: the connection.
        encode: a batch's bytes as they go on the wire, the same for every connection that
            shares `last`.
        last: the last batch encoded, shared by the connections of that kind.
        ws: the WebSocket, if it is one (nothing is pushed once it is closing).
        scope: the task's wait, cancelled when a push left bytes parked (the task flushes them).
        written_at: when bytes last went out (a heartbeat is due `heartbeat` s after it).
    """

    stream: ConnectionStream
    encode: Callable[[list[Entry]], bytes]
    last: LastBatch
    ws: trio_websocket.WebSocketConnection | None = None
    scope: trio.CancelScope | None = None
    written_at: float = attrs.field(factory=trio.current_time)

    def wire(self, batch: list[Entry]) -> bytes:
        """The batch's bytes: encoded once for every connection handed the same list."""
        last = self.last
        if batch is not last.batch:
            last.data, last.batch, last.at = self.encode(batch), batch, trio.current_time()
        return last.data

    def __call__(self, batch: list[Entry]) -> bool:
        if self.ws is not None and self.ws.closed is not None:
            return False
        if not self.stream.try_send(self.wire(batch)):
            return False
        self.written_at = self.last.at
        if self.scope is not None and self.stream.parked:
            self.scope.cancel()
        return True


@attrs.frozen
class Wire:
    """How one connection carries a run's events.

    Attributes:
        encode: a batch's bytes on this connection.
        last: the cache `encode`'s results are shared through (one per kind of connection
            whose bytes are alike; a connection of its own kind gets its own).
        heartbeat: sends what keeps a silent connection alive (an SSE comment, a pong).
        write: writes a batch's bytes, waiting as long as it takes.
        push: whether the hub may write to the connection itself (`Pusher`).
        ws: the WebSocket, if it is one.
    """

    encode: Callable[[list[Entry]], bytes]
    last: LastBatch
    heartbeat: Callable[[], Awaitable[object]]
    write: Callable[[bytes], Awaitable[None]]
    push: bool = True
    ws: trio_websocket.WebSocketConnection | None = None


async def pump(
    sub: Subscription, stream: ConnectionStream, wire: Wire, heartbeat: float
) -> Literal["done", "closing", "dropped"]:
    """Write the run's events to the connection until the run is done (`"done"`), the
    WebSocket is closing (`"closing"`) or the subscriber was dropped (`"dropped"`: it fell
    behind; its scope was cancelled). Raises `SubscriberDropped` for a subscriber dropped
    before, `CursorExpired` when the log forgot what it needed, and the connection's errors."""
    pusher = Pusher(stream, wire.encode, wire.last, wire.ws)
    try:
        with sub.cancel_scope:
            if wire.push:
                sub.push = pusher
            while True:
                with trio.move_on_at(pusher.written_at + heartbeat) as idle:
                    pusher.scope = idle
                    batch = await sub.next_batch()
                pusher.scope = None
                if idle.cancelled_caught:
                    if stream.parked:  # a push left part of its bytes
                        await stream.flush()
                    elif pusher.written_at + heartbeat <= trio.current_time():
                        await wire.heartbeat()
                        pusher.written_at = trio.current_time()
                    continue
                if not batch:
                    return "done"
                if wire.ws is not None and wire.ws.closed is not None:  # no more messages
                    return "closing"
                await wire.write(pusher.wire(batch))
                pusher.written_at = trio.current_time()
    finally:
        sub.push = None
    return "dropped"


@attrs.define(eq=False)
class WsState:
    """How a WebSocket session ends: the close to send, or the client already gone."""

    code: int | None = None
    reason: str | None = None

    def close(self, code: int, reason: str) -> None:
        """Close with `code` and `reason`, unless a close was already decided."""
        if self.code is None:
            self.code, self.reason = code, reason


@attrs.define(eq=False)
class Fanout:
    """The SSE and WebSocket routes of a run."""

    shared: Shared
    runs: Runs
    _sse_last: LastBatch = attrs.field(factory=LastBatch)
    _ws_last: LastBatch = attrs.field(factory=LastBatch)

    # --- SSE --------------------------------------------------------------------------------

    async def events(self, http: HttpConnection, request: Request, run_id: str) -> None:
        """`GET /v1/runs/{id}/events`: the run events as SSE, resumable by `Last-Event-ID`
        (which wins) or `?after=`; 204 at the end of a finished run."""
        cursor = request.headers.get("last-event-id") or request.query.get("after")
        try:
            if await self.runs.authorized(request, run_id) is None:
                raise not_found()
            async with self.runs.subscription(
                run_id, cursor, self.shared.client_id(request)
            ) as sub:
                if sub.at_end:
                    await http.respond(204, content_type="")
                    return
                await http.start_stream(200, SSE_HEADERS)
                body = functools.partial(self._sse, http, sub, run_id)
                completed = await until_gone(http, body)
        except Refused as refused:
            raise refused.reply() from None  # an unknown run: the same bytes as above
        await end_stream(http, completed, self.shared.limits.close_timeout)

    async def _sse(self, http: HttpConnection, sub: Subscription, run_id: str) -> None:
        """Write the run's events until `run.done`, or until the subscriber is dropped (the
        stream then just ends: the client resumes from its `Last-Event-ID`)."""
        await http.send_data(SSE_RETRY)
        heartbeat = functools.partial(http.send_data, SSE_HEARTBEAT)
        if http.chunked:  # the same bytes for every chunked stream: encoded once, pushed
            wire = Wire(
                encode=lambda batch: http.body_chunk(sse_run_events(run_id, batch)),
                last=self._sse_last,
                heartbeat=heartbeat,
                write=http.stream.send_all,
            )
        else:  # an HTTP/1.0 client's body goes through h11 only
            wire = Wire(
                encode=functools.partial(sse_run_events, run_id),
                last=LastBatch(),
                heartbeat=heartbeat,
                write=http.send_data,
                push=False,
            )
        with contextlib.suppress(SubscriberDropped, CursorExpired):
            await pump(sub, http.stream, wire, self.shared.limits.heartbeat)

    # --- WebSocket --------------------------------------------------------------------------

    async def websocket(self, http: HttpConnection, request: Request, run_id: str) -> None:
        """`GET /v1/runs/{id}/ws`: the run events as WebSocket text frames, resumable by
        `?after=`; the close code says how it ended."""
        if not request.is_websocket:
            raise ErrorReply(
                426,
                "upgrade_required",
                "this route speaks WebSocket",
                headers=[("upgrade", "websocket")],
                close=True,
            )
        problem = handshake_problem(request)
        if problem is not None:
            status, message = problem
            raise ErrorReply(
                status,
                "bad_handshake",
                message,
                headers=[("sec-websocket-version", "13")],
                close=True,
            )
        limits = self.shared.limits
        bucket = TokenBucket(limits.ws_rate, limits.ws_burst)
        frames = ClientFrames(http.stream, bucket, max_message=limits.max_ws_message)
        try:
            async with open_websocket(
                http, request, frames, max_message=limits.max_ws_message, within=limits.head_timeout
            ) as ws:
                state = WsState()
                await self._ws_session(ws, http.stream, frames, request, run_id, state)
                await close_websocket(
                    ws, http.stream, state.code, state.reason, within=limits.close_timeout
                )
        except (trio.TooSlowError, trio_websocket.HandshakeError):
            pass
        finally:
            # a client past its frame limits may still be sending: linger, so that closing with
            # its bytes unread does not reset the connection before it reads why
            if frames.breached.is_set():
                http.refused = True
        raise CloseConnection

    async def _ws_session(
        self,
        ws: trio_websocket.WebSocketConnection,
        stream: ConnectionStream,
        frames: ClientFrames,
        request: Request,
        run_id: str,
        state: WsState,
    ) -> None:
        try:
            if await self.runs.authorized(request, run_id) is None:
                state.close(1008, "not_found")
                return
            cursor = request.query.get("after")
            async with (
                self.runs.subscription(run_id, cursor, self.shared.client_id(request)) as sub,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(self._ws_limits, frames, state, nursery.cancel_scope)
                nursery.start_soon(self._ws_reader, ws, state, nursery.cancel_scope)
                await self._ws_sender(ws, stream, sub, state)
                nursery.cancel_scope.cancel()
        except Refused as refused:
            state.close(1013 if refused.status == 503 else 1008, refused.kind)

    async def _ws_sender(
        self,
        ws: trio_websocket.WebSocketConnection,
        stream: ConnectionStream,
        sub: Subscription,
        state: WsState,
    ) -> None:
        """Write the run's events as text frames until `run.done` (1000), a drop (1013), or
        the client's close."""
        wire = Wire(
            encode=ws_text_frames,
            last=self._ws_last,
            heartbeat=ws.pong,  # an unsolicited pong: a heartbeat needing no answer
            write=stream.send_all,
            ws=ws,
        )
        try:
            end = await pump(sub, stream, wire, self.shared.limits.heartbeat)
        except SubscriberDropped:
            end = "dropped"
        except CursorExpired:
            state.close(1008, "cursor_expired")
            return
        except (trio_websocket.ConnectionClosed, *GONE):
            return
        if end == "done":
            state.close(1000, "done")
        elif end == "dropped" and sub.drop_reason is not None:
            state.close(1013, sub.drop_reason)

    @staticmethod
    async def _ws_limits(frames: ClientFrames, state: WsState, scope: trio.CancelScope) -> None:
        """Close as the frames' limits say once the client went past one (`ClientFrames`)."""
        await frames.breached.wait()
        state.close(frames.code, frames.reason)
        scope.cancel()

    @staticmethod
    async def _ws_reader(
        ws: trio_websocket.WebSocketConnection, state: WsState, scope: trio.CancelScope
    ) -> None:
        """Read what the client sends: JSON text (its rate is counted by `ClientFrames`);
        anything else closes."""
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                break
            if isinstance(message, bytes):
                state.close(1003, "binary messages are not accepted")
                break
            try:
                msgspec.json.decode(message)
            except msgspec.DecodeError:
                state.close(1008, "not_json")
                break
            except RecursionError:  # nested deeper than the decoder follows: refused, no crash
                state.close(1008, "nested_too_deeply")
                break
        scope.cancel()
