"""The loopback provider's replies and plumbing (`rillet.transports.testing`): a scripted reply
(`Reply`), h11 events read from and written to one trio socket, the waits of a stalled reply,
and a dropped connection."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Mapping
from http import HTTPStatus

import attrs
import h11
import trio
from rillet._core._encode import encode_sse

__all__ = [
    "PING",
    "Reply",
    "drop",
    "header_dict",
    "phrase",
    "receive",
    "response_head",
    "send",
    "send_error",
    "stall",
    "until_client_leaves",
]

PING = encode_sse(comment="ping")
"""The SSE comment a stalled reply sends every `Reply.ping_every` seconds."""

_RECEIVE_SIZE = 64 * 1024


async def receive(stream: trio.SocketStream, conn: h11.Connection) -> object:
    """The next h11 event, reading from the socket as needed (end of input included)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(_RECEIVE_SIZE))


async def send(stream: trio.SocketStream, conn: h11.Connection, event: h11.Event) -> None:
    """Write what h11 makes of `event`."""
    if data := conn.send(event):
        await stream.send_all(data)


async def send_error(stream: trio.SocketStream, conn: h11.Connection, reply: Reply) -> None:
    """A short error reply, whole (one that closes the connection, from `status_reply`)."""
    await send(stream, conn, response_head(reply))
    for chunk in reply.chunks:
        await send(stream, conn, h11.Data(data=chunk))
    await send(stream, conn, h11.EndOfMessage())


async def until_client_leaves(stream: trio.SocketStream) -> None:
    """Wait, discarding anything read, until the client closes or resets the connection."""
    try:
        while await stream.receive_some(_RECEIVE_SIZE):
            pass
    except trio.BrokenResourceError:
        pass


async def stall(stream: trio.SocketStream, conn: h11.Connection, ping_every: float | None) -> None:
    """Go silent (but for pings) until the client goes away."""
    async with trio.open_nursery() as nursery:
        if ping_every is not None:
            nursery.start_soon(_ping, stream, conn, ping_every)
        await until_client_leaves(stream)
        nursery.cancel_scope.cancel()


async def _ping(stream: trio.SocketStream, conn: h11.Connection, every: float) -> None:
    while True:
        await trio.sleep(every)
        await send(stream, conn, h11.Data(data=PING))


async def drop(stream: trio.SocketStream, *, reset: bool) -> None:
    """Close the connection mid-body; with `reset`, as a TCP reset (SO_LINGER 0)."""
    if reset:
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


def response_head(reply: Reply) -> h11.Response:
    """A reply's status line and headers, its content type first unless it sets its own."""
    names = {name.lower() for name, _ in reply.headers}
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers]
    if reply.content_type and "content-type" not in names:
        headers.insert(0, (b"content-type", reply.content_type.encode("latin-1")))
    reason = phrase(reply.status).encode("latin-1")
    return h11.Response(status_code=reply.status, headers=headers, reason=reason)


def phrase(status: int) -> str:
    """A status code's reason phrase; empty for a code with none."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def header_dict(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers as text, a repeated one's values joined with commas."""
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


_non_negative = attrs.validators.ge(0)
_non_negative_float = attrs.validators.ge(0.0)


def _header_pairs(
    value: Mapping[str, str] | Iterable[tuple[str, str]],
) -> tuple[tuple[str, str], ...]:
    """Headers as (name, value) pairs, from a mapping or from pairs; a `TypeError` naming what
    is neither."""
    pairs = tuple(value.items() if isinstance(value, Mapping) else value)
    for pair in pairs:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(part, str) for part in pair)
        ):
            raise TypeError(f"a header must be a (name, value) pair of strings, not {pair!r:.60}")
    return pairs


def _body_chunks(value: bytes | Iterable[bytes]) -> tuple[bytes, ...]:
    """The body as chunks: one bytes value is one chunk; a `TypeError` for a chunk that is not
    bytes."""
    chunks = (value,) if isinstance(value, bytes | bytearray) else tuple(value)
    for chunk in chunks:
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError(f"a body chunk must be bytes, not {type(chunk).__name__}")
    return tuple(bytes(chunk) for chunk in chunks)


@attrs.frozen
class Reply:
    """One scripted response: status, headers and body chunks, with pacing and faults.

    Attributes:
        status: the HTTP status code.
        headers: extra response headers (`Retry-After`, `retry-after-ms`, `x-should-retry`...),
            as (name, value) pairs or a mapping; a `content-type` here replaces
            `content_type`, `connection: close` closes the connection after the reply.
        chunks: the body, each written as its own chunk of a chunked transfer encoding (one
            bytes value is one chunk).
        content_type: the `Content-Type` header; empty for none.
        headers_delay: seconds before the status line is sent.
        chunk_delay: seconds before each chunk (pacing).
        stall_after: after this many chunks, go silent with the connection open until the client
            goes away; at or past `len(chunks)`, stall after the whole body, without its end.
        stall_headers: never send the status line at all: hang once the request is read.
        drop_after_bytes: close the connection abruptly after this many body bytes, without the
            terminating chunk (at or past the body's length: the whole body, then the drop).
        drop_with_reset: drop with a TCP reset instead of an orderly close, so the client's read
            fails with a connection reset (httpx.ReadError) rather than an early end of stream.
        ping_every: while stalled after the headers, send the SSE comment `PING` every N seconds.
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_header_pairs)
    chunks: tuple[bytes, ...] = attrs.field(default=(), converter=_body_chunks)
    content_type: str = "text/event-stream"
    headers_delay: float = attrs.field(default=0.0, validator=_non_negative_float)
    chunk_delay: float = attrs.field(default=0.0, validator=_non_negative_float)
    stall_after: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_non_negative)
    )
    stall_headers: bool = False
    drop_after_bytes: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_non_negative)
    )
    drop_with_reset: bool = False
    ping_every: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0))
    )
