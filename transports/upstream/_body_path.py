"""The short way to read a reply's body from httpcore's HTTP/1.1 connection.

Each read of a streamed body through httpx passes five layers before it reaches the socket:
httpx's response stream and the exception mapping around it, the pool's stream, the
connection's stream and its trace, the connection's body generator, and the network stream's
read with a timeout scope and another exception mapping. For a provider's stream, one small
read per token, those layers cost more than decoding the token. `BodyPath` reads the same
body the same way, without them: the connection's own h11 state is fed from the connection's
own trio stream, so the connection ends in the state httpcore expects and goes back to the
pool (or is closed) by the response's `aclose`, as it would have.

Failures leave as the `UpstreamError` httpx's would have become, with the same names
(`ReadError` for a broken or closed socket, `RemoteProtocolError` for a body h11 cannot
read: a peer that closed mid-body).

It applies only where every piece is the one it knows (a response from `PoolPath` on an
HTTP/1.1 connection over trio); anything else (HTTP/2, a mock transport, a proxy's tunnel, an
httpcore whose pieces moved) reads through httpx's layers (`BodyPath.of` says None). No read
timeout is lifted or added: the turn's deadlines rule, as `HttpUpstream` asks of httpx.
"""

from __future__ import annotations

from typing import Any

import h11
import trio
from rillet._core._errors import UpstreamError

try:  # httpcore's own pieces: without them, every body reads through httpx's layers
    from httpcore._async.http11 import HTTP11ConnectionByteStream as _ConnectionStream
    from httpcore._backends.trio import TrioStream as _TrioStream
except ImportError:  # pragma: no cover - an httpcore that moved them
    _ConnectionStream = None  # type: ignore[assignment,misc]
    _TrioStream = None  # type: ignore[assignment,misc]

__all__ = ["BodyPath"]

_READ_SIZE = 64 * 1024  # what httpcore reads at once (`READ_NUM_BYTES`)
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


class BodyPath:
    """Reads one response's body straight from its connection (see the module's docstring)."""

    __slots__ = ("_done", "_h11", "_socket")

    def __init__(self, state: h11.Connection, socket: trio.abc.Stream) -> None:
        self._h11 = state
        self._socket = socket
        self._done = False

    @classmethod
    def of(cls, stream: Any) -> BodyPath | None:
        """The short way for a response's stream (`httpx.Response.stream`), or None."""
        if _ConnectionStream is None or _TrioStream is None:
            return None
        pool_stream = getattr(stream, "_httpcore_stream", None)
        body = getattr(pool_stream, "_stream", None)
        if type(body) is not _ConnectionStream:
            return None
        connection = getattr(body, "_connection", None)
        state = getattr(connection, "_h11_state", None)
        network = getattr(connection, "_network_stream", None)
        if type(state) is not h11.Connection or type(network) is not _TrioStream:
            return None
        socket = getattr(network, "_stream", None)
        if not isinstance(socket, trio.abc.Stream) or state.their_state is not h11.SEND_BODY:
            return None
        return cls(state, socket)

    async def receive(self) -> bytes:
        """The body's next piece; `b""` once it has ended."""
        if self._done:
            return b""
        state = self._h11
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamError("RemoteProtocolError", str(exc)) from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self._socket.receive_some(_READ_SIZE)
                except _GONE as exc:
                    raise UpstreamError("ReadError", str(exc)) from exc
                state.receive_data(bytes(data))
                continue
            if type(event) is h11.Data:
                return bytes(event.data)
            self._done = True
            if type(event) is h11.EndOfMessage or event is h11.PAUSED:
                return b""
            raise UpstreamError("RemoteProtocolError", f"unexpected in a body: {event!r}")

    @property
    def done(self) -> bool:
        """Whether the body has been read to its end."""
        return self._done
