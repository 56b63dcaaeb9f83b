"""A streamed response's body, run while its connection is watched: a client that leaves
cancels it, one that only half-closed keeps reading to the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import h11
import trio
from rillet._core._encode import SSE_HEARTBEAT, SSE_PROBE

from ._replies import GONE, CloseConnection

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._http11 import HttpConnection

__all__ = ["SSE_HEADERS", "HeldHead", "end_stream", "until_gone"]

T = TypeVar("T")

SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-cache, no-transform"),
    ("x-accel-buffering", "no"),
)
"""The head of every event stream the server sends (run events, MMSP)."""


class HeldHead:
    """An event stream whose head waits for its first data up to one heartbeat, so a refusal
    upstream can still get its HTTP status; while nothing comes, a heartbeat comment goes out
    every `heartbeat` seconds (the first of them sends the head). A wire whose clients read a
    sign of life as an event of its own (Anthropic's `ping`) sets `beat`.

    Once the head is out, data may also be written from another task without waiting
    (`write_nowait`: a turn's own task, no hop to the wire's pump); the heartbeat then counts
    from that write too."""

    beat = SSE_HEARTBEAT  # what a heartbeat sends

    def __init__(
        self, http: HttpConnection, heartbeat: float, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.http = http
        self.heartbeat = heartbeat
        self.headers = [*SSE_HEADERS, *headers]  # the head's, after the event stream's own
        self.started = False  # the head went out
        self.wrote = False  # data went out after it (a heartbeat is not data)
        self._deadline = trio.current_time() + heartbeat

    async def receive(self, channel: trio.MemoryReceiveChannel[T]) -> T | None:
        """The channel's next item, or None once it has ended; heartbeats meanwhile."""
        while True:
            with trio.move_on_at(self._deadline):
                try:
                    return await channel.receive()
                except trio.EndOfChannel:
                    return None
            if trio.current_time() < self._deadline:
                continue  # data went out meanwhile (`write_nowait`): no heartbeat is due
            if self.started:
                await self.http.send_data(self.beat)
            else:
                await self.start()
            self._deadline = trio.current_time() + self.heartbeat

    async def start(self) -> None:
        """Send the head, if it has not gone out."""
        if not self.started:
            await self.http.start_stream(200, self.headers)
            self.started = True

    async def send(self, data: bytes) -> None:
        """Send data (the head first, if it has not gone out); the next heartbeat is due one
        heartbeat from now. Empty data writes out what `write_nowait` left parked."""
        await self.start()
        if not data:
            await self.http.stream.flush()
            return
        await self.http.send_data(data)
        self.wrote = True
        self._deadline = trio.current_time() + self.heartbeat

    def write_nowait(self, data: bytes) -> bytes | None:
        """Write data now, without waiting, after a head that has gone out: None when the
        socket took it all; `b""` when it took part and the rest is parked (`send(b"")`
        writes it out); `data` itself, with nothing written, when it must be sent the waiting
        way (no head yet, bytes already parked, a full or failed socket)."""
        http = self.http
        if not self.started or not http.streaming:
            return data
        if not http.stream.try_send(http.body_chunk(data) if http.chunked else data):
            return data
        self.wrote = True
        self._deadline = trio.current_time() + self.heartbeat
        return b"" if http.stream.parked else None


_PROBE_EVERY = 1.0  # seconds between looks at whether the head went out, to probe after it


async def until_gone(
    http: HttpConnection, body: Callable[[], Awaitable[None]], *, waiting: bool = False
) -> bool:
    """Run a streamed response's body while watching the connection: True when the body
    finished, False when the client went away first (the body is then cancelled).

    The client's end of stream alone is not its leaving (it may have half-closed and still
    read): the server then sends an SSE comment, and only a reset in answer counts. Before the
    response's head there is no comment to send; `waiting` (a request waiting for a slot, whose
    head will not come until it has one) probes with a `100 Continue` instead, so a client that
    gave up leaves the queue before its provider request is ever sent."""
    gone = False

    async def watch(scope: trio.CancelScope) -> None:
        nonlocal gone
        stream = http.stream
        while (more := await stream.receive_ahead()) is True:
            pass
        if more is None:  # the end of its requests: a close, or a half-close
            while not await _probe(http, waiting):  # noqa: ASYNC110 (no event says the head went)
                await trio.sleep(_PROBE_EVERY)
            if not await stream.reset_after_probe():
                await trio.sleep_forever()  # it half-closed: it still reads; stream on
        gone = True
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        try:
            await body()
        except GONE:
            gone = True
        nursery.cancel_scope.cancel()
    return not gone


async def _probe(http: HttpConnection, waiting: bool) -> bool:
    """Send an SSE comment, if a streamed body has begun, or (`waiting`) a `100 Continue`
    before any response; False when neither can go out. A client that closed its connection
    answers either with a reset; one that half-closed reads the comment as nothing, the 1xx as
    the interim answer every HTTP/1.1 client knows.

    A whole response being written (`respond`: a `Content-Length` body) takes no comment:
    its client may well close as soon as it has read it, while the body's last step is still
    to run, and a comment there would be bytes past the length it declared."""
    if http.streaming and http.conn.our_state is h11.SEND_BODY:
        await http.send_data(SSE_PROBE)
        return True
    return waiting and await http.send_continue()


async def end_stream(http: HttpConnection, completed: bool, within: float) -> None:
    """End a streamed body within `within` seconds (the close grace); otherwise, or when the
    body did not complete, the connection closes (`CloseConnection`)."""
    if completed:
        with trio.move_on_after(within):
            if http.conn.our_state is h11.SEND_BODY:
                await http.end_stream()
            return
    raise CloseConnection
