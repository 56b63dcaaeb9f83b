"""WebSocket for the server: the hand-over from h11 to trio-websocket, closing with a code, and
the token bucket that limits what a client may send.

The upgrade request has already been parsed by h11 when the route is known. Its head is rebuilt
from what h11 parsed and replayed in front of the socket's (`ConnectionStream.unread`);
trio-websocket's server side (`wrap_server_stream`) then reads the handshake as if it came
straight from the socket. Bytes that followed the head (frames the client sent without waiting
for the 101) reach it once the 101 went out: wsproto would drop them before. The handshake is
checked here first, because trio-websocket waits forever for a request wsproto refuses.

Events go out as text frames built here (`text_frame`): a server's frames are not masked, so a
run's frame is the same bytes for every subscriber, built once and written straight to each
connection's stream, next to trio-websocket's own writes (the stream keeps writes whole).

What the client sends reaches trio-websocket through `ClientFrames` (`_ws_frames`), which counts
its frames: messages, pings and pongs against the client's rate, fragments against a cap.

Two close paths trio-websocket leaves to its caller are completed here: a close cut short by the
grace period (the client stopped reading) drops the connection, and a frame wsproto could not
parse (invalid UTF-8 in a text message: 1007) gets the close frame trio-websocket does not send.
"""

from __future__ import annotations

import base64
import binascii
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio
import trio_websocket
from rillet._core._encode import close_frame
from rillet._core._encode import (
    text_frame as text_frame,  # the frames live with the other wire encoders
)
from wsproto.connection import ConnectionState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ._http11 import ConnectionStream, HttpConnection, Request
    from ._ws_frames import ClientFrames

__all__ = ["close_websocket", "handshake_problem", "open_websocket", "text_frame"]


def handshake_problem(request: Request) -> tuple[int, str] | None:
    """Why an upgrade request cannot become a WebSocket (an HTTP status and a message), or
    None when it can."""
    headers = request.headers
    if request.method != "GET":
        return 400, "a WebSocket handshake is a GET"
    if headers.get("sec-websocket-version", "").strip() != "13":
        return 426, "Sec-WebSocket-Version must be 13"
    key = headers.get("sec-websocket-key", "").strip()
    if not key:
        return 400, "Sec-WebSocket-Key is missing"
    if not _nonce(key):
        return 400, "Sec-WebSocket-Key must be 16 bytes in base64"
    if "host" not in headers:
        return 400, "Host is missing"
    names = [name for name, _ in request.head.headers]
    if any(names.count(name) > 1 for name in _ONCE):  # wsproto reads the last one only
        return 400, "a handshake header is repeated"
    try:  # as wsproto reads it (a punycode label that does not decode would fail its reader)
        headers["host"].encode("latin-1").decode("idna")
    except UnicodeError:
        return 400, "Host is not a host name"
    return None


def _nonce(key: str) -> bool:
    """Whether `key` is 16 bytes in base64 (RFC 6455 §4.2.1: 24 characters)."""
    if len(key) != 24:
        return False
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except binascii.Error:
        return False


# handshake headers wsproto takes once: a repeat would make it read another request than ours
_ONCE = (b"host", b"connection", b"upgrade", b"sec-websocket-key", b"sec-websocket-version")

# codes that say no close frame came (none, an abnormal closure, a TLS failure): never sent
_NEVER_SENT = frozenset({1005, 1006, 1015})


@asynccontextmanager
async def open_websocket(
    http: HttpConnection,
    request: Request,
    frames: ClientFrames,
    *,
    max_message: int,
    within: float,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """Accept the upgrade `request` on `http`'s connection: the open WebSocket for the block,
    which reads the client through `frames` (its frames counted against its limits).

    trio-websocket's reader task runs in a nursery of this block, cancelled when it ends (close
    the WebSocket inside the block). Raises `trio.TooSlowError` (itself, not in a group) if the
    handshake does not complete within `within` seconds, `trio_websocket.ConnectionClosed` if
    the client left.
    """
    head = request.raw_head()
    http.stream.unread(head)
    frames.handshake(len(head), early=http.trailing_data())
    ws: trio_websocket.WebSocketConnection | None = None
    async with trio.open_nursery() as nursery:
        try:
            with trio.move_on_after(within):
                proposal = await trio_websocket.wrap_server_stream(
                    nursery, frames, max_message_size=max_message
                )
                ws = await proposal.accept()
            if ws is not None:
                yield ws
        finally:
            nursery.cancel_scope.cancel()
    if ws is None:  # raised out here: in the nursery it would come wrapped in a group
        raise trio.TooSlowError


async def close_websocket(
    ws: trio_websocket.WebSocketConnection,
    stream: ConnectionStream,
    code: int | None,
    reason: str | None,
    *,
    within: float,
) -> None:
    """Close with `code` (None: the peer already closed) within `within` seconds.

    Bytes of a frame cut short by a cancelled write go out first (the stream keeps them), so
    the close frame arrives intact; a client that does not read in time just loses the
    connection. After a frame wsproto refused, the close frame with wsproto's code is sent on
    trio-websocket's behalf; not after the client's end of stream, which trio-websocket calls
    1006, a code no close frame may carry (RFC 6455 §7.4.1): that client just loses the
    connection.
    """
    with trio.move_on_after(within):
        if ws.closed is None:
            if code is not None:
                await ws.aclose(code, reason)
        elif _unanswered(ws) and ws.closed.code not in _NEVER_SENT:
            await stream.send_raw(close_frame(ws.closed.code))


def _unanswered(ws: trio_websocket.WebSocketConnection) -> bool:
    """Closed by wsproto's parser: no close frame was exchanged (the protocol state is still
    open), so the client was never told why."""
    state = getattr(getattr(ws, "_wsproto", None), "state", None)
    return state is ConnectionState.OPEN
