"""HTTP/1.1 for the server: h11 (sans-I/O) on one trio socket per connection.

Two things here are not what `trio.SocketStream` gives by itself:

- `ConnectionStream.send_all` survives cancellation. It parks what it was asked to send and
  writes from there with the socket's `send`, which is atomic under cancellation (either some
  bytes went out, and are accounted for, or none did). A write cancelled half-way through a
  frame (a subscriber dropped while its client stopped reading) leaves the rest parked, and the
  next write sends it first: the byte stream stays whole, so a dropped SSE stream can still end
  its chunked body and a dropped WebSocket can still send its close frame, if the client reads
  again within the grace period.
- `ConnectionStream.try_send` writes without waiting (a fan-out hands the same bytes to many
  connections in one go); writes of several tasks (a WebSocket's pong and its events) go out
  one after the other, never interleaved.
- `ConnectionStream.unread` puts bytes back in front of the socket's: on a WebSocket upgrade the
  request h11 already parsed is replayed, with whatever followed it, to trio-websocket.

`HttpConnection` reads requests (a deadline for the head, a size cap and a deadline for the
body) and writes responses, whole or streamed; keep-alive is h11's. What h11 lets through and
a server must not is refused here (`RequestRefused`): a head over 16 KiB however it arrived
(431), `Content-Length` next to `Transfer-Encoding`, or `Transfer-Encoding` from an HTTP/1.0
client (400, RFC 9112 §6.1), an HTTP version other than 1.0 and 1.1 (505), a method HTTP does not
define, in the case it defines it (501: `get` is not `GET`), a `Host` that is not `host[:port]`
(400), a head line ending in a bare LF or a field folded onto the next line (400: a proxy in
front may read either otherwise). A body costs bounded work: the
reader yields every `_YIELD_EVERY` h11 events, and a body cut into more than `_MAX_PIECES`
pieces is refused (400), and one whose bytes on the wire (chunk sizes, extensions, trailers) pass
twice the limit is refused as too large (413).

Every write has a deadline for progress (`write_timeout`): a client that stops reading is cut
off once the socket took nothing for that long, whatever the server was writing.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import re
import socket
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

import attrs
import h11
import trio

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "BodyTooLarge",
    "ConnectionStream",
    "HttpConnection",
    "Request",
    "RequestRefused",
    "RequestTimeout",
]

_RECEIVE_SIZE = 64 * 1024
_SEND_SIZE = 256 * 1024
_MAX_HEAD = 16 * 1024  # h11 answers 431 past this
_MAX_UNREAD = 64 * 1024  # bytes a streaming response reads ahead of the next request
_MAX_LINGER = 1024 * 1024  # bytes read and dropped before a refused client is closed
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
_CHUNKED = b"\r\ntransfer-encoding: chunked\r\n"
_CONTINUE = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
_PROBE_WAIT = 0.05  # seconds for a reset to come back over loopback or a LAN
_WRITE_TIMEOUT = 30.0  # seconds a write may make no progress before the connection is cut
_YIELD_EVERY = 16  # h11 events a body reader handles before letting other tasks run
_MAX_PIECES = 8192  # h11 data events one request body may take (1-byte chunks are refused)
_VERSIONS = (b"1.0", b"1.1")
# the methods HTTP defines (RFC 9110 §9, RFC 5789): case-sensitive, so `get` is none of them
_METHODS = frozenset(
    (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH")
)
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]{0,5})?")


class BodyTooLarge(Exception):
    """The request body is over the server's limit (answered 413, connection closed)."""


class RequestTimeout(Exception):
    """The request (head or body) did not arrive in time: a slow or stalled client."""


class RequestRefused(Exception):
    """A request the server will not answer but with `status` and a closed connection: what
    h11 parses but HTTP forbids, or what would cost the server unbounded work."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConnectionStream(trio.abc.Stream):
    """A client connection: writes that survive cancellation, reads that can replay bytes.

    `aclose` only marks the stream closed for its users (trio-websocket closes the stream it
    wraps when it thinks it is done); the socket is closed by `close_transport`, which the
    connection's task calls last, so a close frame can still be sent after trio-websocket let go.
    """

    def __init__(self, stream: trio.SocketStream, *, write_timeout: float = _WRITE_TIMEOUT) -> None:
        self._stream = stream
        self.write_timeout = write_timeout
        self._socket = stream.socket
        self._unread = bytearray()
        self._pending: collections.deque[memoryview] = collections.deque()
        self._closed = False
        self._flushing = False  # a task is writing out what is parked
        self._flushed = trio.lowlevel.ParkingLot()  # the tasks waiting for it to finish
        self._fd = self._socket.fileno()
        self.peer = _peer_address(stream)
        self.sent = 0  # bytes the socket took, for the access log and the metrics
        self.stalled_since: float | None = None  # since when a write waits for the socket

    def local_address(self) -> str:
        """`host:port` the client reached (`[host]:port` for IPv6): what a URL for it names
        when the request has no `Host`."""
        try:
            name = self._socket.getsockname()
        except OSError:
            return ""
        host, port = str(name[0]), int(name[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def parked(self) -> bool:
        """Whether bytes are waiting to be written (`flush` writes them)."""
        return bool(self._pending)

    def unread(self, data: bytes) -> None:
        """Put bytes back: the next reads return them before the socket's."""
        self._unread[:0] = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Replayed bytes first, then the socket's. Once closed, waits until cancelled (the
        reader of a closed WebSocket then stays put instead of recording an abort)."""
        if self._closed:
            await trio.sleep_forever()
        size = max_bytes or _RECEIVE_SIZE
        if self._unread:
            await trio.lowlevel.checkpoint()
            data = bytes(self._unread[:size])
            del self._unread[:size]
            return data
        return await self._stream.receive_some(size)

    async def receive_ahead(self) -> bool | None:
        """Read from the socket into the replay buffer (a pipelined request, while a response
        streams). True while bytes come; None at the peer's end of stream (which may be a
        half-close: it still reads); False once the connection is reset or failed, or the
        client sent more than `_MAX_UNREAD` ahead. Such a client is cut off rather than no
        longer read: a socket nobody reads never tells that its client left, and the reply
        (a turn, a provider stream) would go on for nobody."""
        if len(self._unread) >= _MAX_UNREAD:
            return False
        try:
            data = await self._stream.receive_some(_RECEIVE_SIZE)
        except _GONE:
            return False
        self._unread += data
        return True if data else None

    async def reset_by_peer(self) -> bool:
        """Whether the peer has reset the connection (it closed it and refused what followed).
        Only after `receive_ahead` saw its end of stream, when a read returns at once: this
        tells a client that closed from one that only half-closed and still reads."""
        if self._fd < 0:
            return True
        try:
            # a reset that came after the peer's end of stream is not raised by a read, which
            # returns that end of stream first: it is the socket's pending error (EPIPE)
            if self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                return True
            await self._socket.recv(1, socket.MSG_PEEK)
        except OSError:
            return True
        return False

    async def reset_after_probe(self) -> bool:
        """Whether the peer, after its end of stream and a probe just sent to it (bytes it
        would read as nothing), reset the connection within a moment: a client that closed
        answers the probe so; one that only half-closed reads it and stays."""
        await trio.sleep(_PROBE_WAIT)
        return await self.reset_by_peer()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` after anything still parked; if cancelled, what is unsent stays parked."""
        if self._closed:
            raise trio.ClosedResourceError("the connection is closed")
        if data:
            self._pending.append(memoryview(bytes(data)))
        await self.flush()

    async def send_raw(self, data: bytes) -> None:
        """Send even after `aclose` (a close frame written on trio-websocket's behalf)."""
        self._pending.append(memoryview(data))
        await self.flush()

    def try_send(self, data: bytes) -> bool:
        """Write `data` now, without waiting: True when the socket took it (what it did not
        take at once is parked for `flush`); False, with nothing written, when bytes are
        already parked, the socket is full or failed, or the stream is closed (write it with
        `send_all`, which waits, or reports the failure)."""
        if self._closed or self._pending or self._flushing:
            return False
        try:
            sent = os.write(self._fd, data)
        except OSError:  # full (BlockingIOError), or gone: `send_all` finds out which
            return False
        self.sent += sent
        if sent < len(data):
            self._pending.append(memoryview(data)[sent:])
        return True

    async def flush(self) -> None:
        """Write out what is parked (after another task's writing, if one is under way)."""
        while self._flushing:  # it writes our bytes too, unless it is cancelled first
            await self._flushed.park()
        if not self._pending:
            await trio.lowlevel.checkpoint()
            return
        self._flushing = True
        try:
            while self._pending:
                head = self._pending[0]
                if self.stalled_since is None:
                    self.stalled_since = trio.current_time()
                with trio.move_on_after(self.write_timeout) as stalled:
                    try:
                        sent = await self._socket.send(head[:_SEND_SIZE])
                    except OSError as exc:
                        raise trio.BrokenResourceError(f"the client went away ({exc})") from None
                if stalled.cancelled_caught:  # `send` is atomic: nothing of it went out
                    raise trio.BrokenResourceError("the client stopped reading")
                self.sent += sent
                self.stalled_since = None  # the client reads
                if sent == len(head):
                    self._pending.popleft()
                else:
                    self._pending[0] = head[sent:]
        finally:
            self._flushing = False
            self._flushed.unpark_all()

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until the socket takes more bytes."""
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Mark the stream closed for its users; the socket stays open until
        `close_transport`."""
        self._closed = True
        await trio.lowlevel.checkpoint()

    async def linger(self, within: float, limit: int = _MAX_LINGER) -> None:
        """Before closing on a client still sending (a refused head or body): end our side and
        read, discarding, until it stops, `within` seconds pass or `limit` bytes came. Closing
        with unread bytes would reset the connection, and a reset can destroy the refusal
        before the client reads it."""
        with trio.move_on_after(within), contextlib.suppress(*_GONE, OSError):
            await self.flush()
            self._socket.shutdown(socket.SHUT_WR)
            taken = 0
            while taken < limit:
                data = await self._stream.receive_some(_RECEIVE_SIZE)
                if not data:
                    break
                taken += len(data)

    async def close_transport(self) -> None:
        """Close the socket itself (unsent bytes are dropped)."""
        self._closed = True
        self._pending.clear()
        self._fd = -1
        await trio.aclose_forcefully(self._stream)


def _peer_address(stream: trio.SocketStream) -> str:
    try:
        peer = stream.socket.getpeername()
    except OSError as exc:  # already reset
        return f"?{errno.errorcode.get(exc.errno or 0, '')}"
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


@attrs.frozen
class Request:
    """One parsed request.

    Attributes:
        method: the method, one HTTP defines, as sent (methods are case-sensitive: `GET`).
        path: the path of the target, without its query.
        query: the query parameters (the first of repeated names wins).
        headers: names lower-cased; repeated headers joined with ", ".
        client: the peer's IP address.
        head: the request as h11 parsed it.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    client: str
    head: h11.Request

    @property
    def is_websocket(self) -> bool:
        """Whether it asks for a WebSocket upgrade."""
        upgrade = self.headers.get("upgrade", "").lower()
        return upgrade == "websocket" and "upgrade" in _tokens(self.headers.get("connection", ""))

    def bearer(self) -> str | None:
        """The `Authorization: Bearer` credential, if any."""
        scheme, _, value = self.headers.get("authorization", "").partition(" ")
        return value.strip() or None if scheme.lower() == "bearer" else None

    def raw_head(self) -> bytes:
        """The request head rebuilt from what h11 parsed (for a handover to another parser)."""
        head = self.head
        lines = [head.method + b" " + head.target + b" HTTP/" + head.http_version]
        lines += [name + b": " + value for name, value in head.headers.raw_items()]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _check_head(event: h11.Request) -> None:
    """Refuse what h11 parsed but HTTP forbids (`RequestRefused`)."""
    size = len(event.method) + len(event.target) + 12
    size += sum(len(name) + len(value) + 4 for name, value in event.headers.raw_items())
    if size > _MAX_HEAD:  # h11 only limits a head that is still incomplete
        raise RequestRefused(431, "the request head is too large")
    if event.http_version not in _VERSIONS:
        raise RequestRefused(505, "only HTTP/1.1 and HTTP/1.0 are served")
    if event.method not in _METHODS:  # `get`, say, which a proxy in front takes for another
        raise RequestRefused(501, "the method is not implemented (methods are case-sensitive)")
    names = [name for name, _ in event.headers]
    if b"content-length" in names and b"transfer-encoding" in names:
        raise RequestRefused(400, "Content-Length and Transfer-Encoding together are refused")
    if b"transfer-encoding" in names and event.http_version == b"1.0":  # RFC 9112 §6.1
        raise RequestRefused(400, "Transfer-Encoding in an HTTP/1.0 request is refused")
    hosts = [value for name, value in event.headers if name == b"host"]
    if len(hosts) > 1 or (hosts and not _HOST.fullmatch(hosts[0])):
        raise RequestRefused(400, "the Host header must be one host[:port]")


_HEAD_END = re.compile(rb"\r?\n\r?\n")
_BARE_LF = re.compile(rb"(?<!\r)\n")
_OBS_FOLD = re.compile(rb"\n[ \t]")


def _check_lines(raw: bytes | bytearray) -> None:
    """Refuse a head whose lines h11 read but a server in front may read otherwise (400): a
    line ending in a bare LF, or a field continued on the next line (obs-fold, RFC 9112 §5.2).
    h11 takes both; a proxy that does not would see other fields, or other requests."""
    raw = raw.lstrip(b"\r\n")  # empty lines before a request line are ignored (§2.2)
    end = _HEAD_END.search(raw)
    head = raw[: end.start()] if end else raw
    if _BARE_LF.search(head):
        raise RequestRefused(400, "the request head's lines must end in CRLF")
    if _OBS_FOLD.search(head):
        raise RequestRefused(400, "a header field continued on another line is refused")


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def _request(event: h11.Request, client: str) -> Request:
    target = event.target.decode("latin-1")
    path, _, query = target.partition("?")
    params: dict[str, str] = {}
    for param, setting in parse_qsl(query, keep_blank_values=True):
        params.setdefault(param, setting)
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Request(
        method=event.method.decode("latin-1"),
        path=path,
        query=params,
        headers=headers,
        client=client,
        head=event,
    )


Headers = list[tuple[str, str]]


@attrs.define(eq=False)
class HttpConnection:
    """One client connection's HTTP/1.1 exchange, request after request."""

    stream: ConnectionStream
    conn: h11.Connection = attrs.field(
        factory=lambda: h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
    )
    chunked: bool = False  # the streamed response's body is chunked (`body_chunk`)
    streaming: bool = False  # the response going out is streamed (`start_stream`), not whole
    refused: bool = False  # a response with `close` went out: linger before closing
    status: int | None = None  # the status of the response last started (the access log's)
    received: int = 0  # bytes read from the socket for h11
    _raw: bytearray | None = None  # the bytes of the head being read (`next_request`)
    _head: bool = False  # the request being answered is a HEAD: its answers carry no body

    async def next_request(self, within: float) -> Request | None:
        """The next request's head, or None when the client closed the connection between
        requests. Raises `RequestTimeout` when the head is not complete within `within`
        seconds and `h11.RemoteProtocolError` for a request that is not HTTP/1.1."""
        # what came after the last request (a head past the limit is refused anyway)
        self._raw = bytearray(self.conn.trailing_data[0][: _MAX_HEAD + 4])
        self._head = False
        try:
            with trio.move_on_after(within):
                event = await self._next_event()
                if isinstance(event, h11.ConnectionClosed):
                    return None
                assert isinstance(event, h11.Request)  # h11 yields nothing else here
                self._head = event.method == b"HEAD"  # a refusal of it too has no body
                _check_head(event)
                _check_lines(self._raw)
                return _request(event, self.stream.peer)
        finally:
            self._raw = None
        raise RequestTimeout

    async def read_body(self, request: Request, limit: int, within: float) -> bytes:
        """The request body, at most `limit` bytes, within `within` seconds. A declared
        length over the limit is refused before a byte of the body is read."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:  # h11 checked it is one number
            raise BodyTooLarge
        with trio.move_on_after(within):
            if self.conn.they_are_waiting_for_100_continue:
                await self._send(_CONTINUE)
            body = bytearray()
            pieces = 0
            start = self.received
            while True:
                event = await self._next_event()
                if self.received - start > _wire_limit(limit):  # framing, not data: extensions
                    raise BodyTooLarge
                pieces += 1
                if pieces % _YIELD_EVERY == 0:  # a body in tiny pieces: others run meanwhile
                    await trio.lowlevel.checkpoint()
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limit:
                        raise BodyTooLarge
                    if pieces > _MAX_PIECES:
                        raise RequestRefused(400, "the request body is cut into too many chunks")
                elif event is h11.PAUSED or isinstance(event, h11.EndOfMessage):
                    return bytes(body)
                else:  # the client closed mid-body
                    raise trio.BrokenResourceError("the client closed mid-request")
        raise RequestTimeout

    def trailing_data(self) -> bytes:
        """Bytes received after the request that h11 did not parse (after an upgrade)."""
        return self.conn.trailing_data[0]

    async def respond(
        self,
        status: int,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        *,
        content_type: str = "application/json",
        head_only: bool = False,
        close: bool = False,
    ) -> None:
        """A whole response with a `Content-Length`; `close` ends the connection after it. A
        body is sent with `X-Content-Type-Options: nosniff`: an error that echoes input stays
        JSON to a browser. The answer to a HEAD is the head alone, whatever `head_only` says
        (h11 refuses a body there, and a refusal made before routing does not know the
        method)."""
        extra = list(headers)
        if content_type:
            extra.insert(0, ("content-type", content_type))
            if not any(name.lower() == "x-content-type-options" for name, _ in extra):
                extra.insert(1, ("x-content-type-options", "nosniff"))  # a body is what it says
        if status >= 200 and status not in (204, 304):  # those have no body, and no length
            extra.append(("content-length", str(len(body))))
        if close:
            extra.append(("connection", "close"))
            self.refused = True
        self.streaming = False
        await self._send(_response(status, extra))
        if body and not head_only and not self._head:
            await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def start_stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """The head of a streamed response (chunked, for HTTP/1.1 clients)."""
        head = self.conn.send(_response(status, headers))
        self.status = status
        self.streaming = True
        self.chunked = _CHUNKED in (head or b"").lower()
        if head:
            await self.stream.send_all(head)

    def body_chunk(self, data: bytes) -> bytes:
        """The bytes `send_data(data)` writes to a chunked streamed body (`chunked`): the same
        for every connection, so one encoding serves many (write them with the stream's
        `try_send` or `send_all`)."""
        assert self.chunked
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def send_continue(self) -> bool:
        """A `100 Continue`, while no response has begun, to an HTTP/1.1 client (which must
        read any 1xx before its response; HTTP/1.0 has none): whether it went out."""
        if self.conn.our_state is not h11.SEND_RESPONSE or self.conn.their_http_version != b"1.1":
            return False
        await self._send(_CONTINUE)
        return True

    async def send_data(self, data: bytes) -> None:
        """A piece of a streamed body."""
        if data:
            await self._send(h11.Data(data=data))

    async def end_stream(self) -> None:
        """End a streamed body."""
        await self._send(h11.EndOfMessage())

    def request_read(self) -> bool:
        """Whether the request has been read to its end, taking what is already received of a
        body nobody read (a GET's empty one, a refused POST's); no I/O."""
        while self.conn.their_state is h11.SEND_BODY:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                return False
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
        return self.conn.their_state is h11.DONE

    @property
    def reusable(self) -> bool:
        """Whether another request may follow on this connection."""
        return self.conn.our_state is h11.DONE and self.request_read()

    def next_cycle(self) -> None:
        """Get ready for the next request."""
        self.conn.start_next_cycle()
        self.streaming = False

    @property
    def responding(self) -> bool:
        """Whether a response may still be started (none began yet)."""
        return self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE)

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.conn.next_event()
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:
                return h11.PAUSED
            data = await self.stream.receive_some(_RECEIVE_SIZE)
            self.received += len(data)
            if self._raw is not None and len(self._raw) < _MAX_HEAD + _RECEIVE_SIZE:
                self._raw += data  # a head being read: its lines are checked as they came
            self.conn.receive_data(data)

    async def _send(self, event: h11.Event) -> None:
        if isinstance(event, h11.Response):
            self.status = event.status_code
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)


def _wire_limit(limit: int) -> int:
    """The most bytes a body of at most `limit` bytes may take on the wire: its chunks' sizes,
    extensions and trailers are bytes to read too, and a chunked body of a few bytes could
    otherwise bring hundreds of megabytes of extensions (8,192 pieces of up to 80 KiB each).
    Twice the limit, and one read more (what follows the body), is far more than any real
    chunking takes."""
    return 2 * limit + _RECEIVE_SIZE


def _response(status: int, headers: Iterable[tuple[str, str]]) -> h11.Response:
    try:
        reason = HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        reason = b""
    encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    return h11.Response(status_code=status, headers=encoded, reason=reason)
