"""Every wire encoder rillet writes with, in one place: SSE events and comments, MMSP's `data:`
lines and `[DONE]`, run events as SSE with resumable ids, WebSocket frames, JSON Lines.

The server, the sinks and the test servers all write through these, so a frame is built one way
wherever it goes out. Sans-I/O: each returns the bytes; the caller writes them.

`encode_sse` is the general encoder (it refuses what would split a frame); the others are fast
paths for bytes already known to be safe: the JSON msgspec writes never holds a raw line break,
so a `data:` line of it is one line.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING

import msgspec

from ._errors import SSEEncodeError
from ._events import UniEvent

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ._markers import AttemptReset
    from ._runevents import Entry

__all__ = [
    "SSE_DONE",
    "SSE_HEARTBEAT",
    "SSE_PROBE",
    "SSE_RETRY",
    "WS_PONG",
    "close_frame",
    "encode_sse",
    "jsonl_lines",
    "sse_data",
    "sse_json",
    "sse_run_events",
    "text_frame",
    "uni_jsonl",
    "ws_text_frames",
]

_LINE_END = re.compile(r"\r\n|\r|\n")
_FORBIDDEN = re.compile(r"[\r\n\x00]")


# --- SSE ------------------------------------------------------------------------------------------


def encode_sse(
    data: str | None = None,
    *,
    event: str | None = None,
    id: str | None = None,
    retry: int | None = None,
    comment: str | None = None,
) -> bytes:
    """One SSE frame as bytes, ended by a blank line.

    Data with line breaks becomes several `data:` lines, so the reader rebuilds it exactly; a
    comment likewise. CR, LF or NUL in an event name or id would split or corrupt the frame and
    raises `SSEEncodeError`.
    """
    parts: list[str] = []
    if comment is not None:
        parts.extend(f": {line}\n" for line in _LINE_END.split(comment))
    if event is not None:
        if _FORBIDDEN.search(event):
            raise SSEEncodeError("event")
        parts.append(f"event: {event}\n")
    if id is not None:
        if _FORBIDDEN.search(id):
            raise SSEEncodeError("id")
        parts.append(f"id: {id}\n")
    if retry is not None:
        if retry < 0:
            raise ValueError("retry must not be negative")
        parts.append(f"retry: {retry}\n")
    if data is not None:
        parts.extend(f"data: {line}\n" for line in _LINE_END.split(data))
    parts.append("\n")
    return "".join(parts).encode("utf-8")


SSE_HEARTBEAT = encode_sse(comment="keep-alive")
"""The comment a silent stream sends so proxies and clients know it is alive."""

SSE_PROBE = encode_sse(comment="")
"""An empty comment: sent to a client that ended its side, whose kernel answers it with a
reset if the client closed rather than half-closed."""

SSE_RETRY = encode_sse(retry=1000)
"""An EventSource reconnects after a second."""

SSE_DONE = encode_sse("[DONE]")
"""MMSP's (and OpenAI's) end of stream."""


def sse_data(payload: bytes) -> bytes:
    """One `data:` event of JSON as msgspec writes it (no raw line break in it): an MMSP
    UniEvent or error."""
    return b"data: %s\n\n" % payload


def sse_json(value: object) -> bytes:
    """One `data:` event of any JSON value (msgspec's JSON holds no raw line break): OpenAI's
    chunks and the AI SDK's UI message stream parts."""
    return b"data: %s\n\n" % _encoder.encode(value)


def sse_run_events(run_id: str, batch: Iterable[Entry]) -> bytes:
    """Run events as SSE, `id: <run_id>:<seq>` (a cursor to resume from) and the hub's JSON."""
    prefix = b"id: %s:" % run_id.encode("ascii")
    return b"".join(b"%s%d\ndata: %s\n\n" % (prefix, entry.seq, entry.data) for entry in batch)


# --- WebSocket ------------------------------------------------------------------------------------


def text_frame(payload: bytes) -> bytes:
    """One whole, unmasked (server to client) WebSocket text frame carrying `payload`, which
    must be UTF-8 (RFC 6455 §5.2: FIN, opcode 1, the shortest length encoding)."""
    size = len(payload)
    if size < 126:
        head = bytes((0x81, size))
    elif size < 0x10000:
        head = struct.pack("!BBH", 0x81, 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 127, size)
    return head + payload


def ws_text_frames(batch: Sequence[Entry]) -> bytes:
    """Run events as WebSocket text frames, one an event, to go out in one write."""
    return b"".join([text_frame(entry.data) for entry in batch])


def close_frame(code: int) -> bytes:
    """An unmasked WebSocket close frame with `code` and no reason."""
    return struct.pack("!BBH", 0x88, 2, code)


WS_PONG = b"\x8a\x00"
"""An unmasked, empty, unsolicited WebSocket pong: a heartbeat that asks no answer (RFC 6455
§5.5.3)."""


# --- JSON Lines -----------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def jsonl_lines(items: Sequence[object]) -> bytes:
    """Structs as JSON Lines, each exactly as msgspec encodes it, in one call."""
    return _encoder.encode_lines(items)


def uni_jsonl(items: Sequence[UniEvent | AttemptReset]) -> bytes:
    """An MMSP stream as JSON Lines: each UniEvent as `encode_json` writes it, each
    `AttemptReset` as `{"type":"attempt.reset","attempt":n}`."""
    if all(type(item) is UniEvent for item in items):
        return _encoder.encode_lines(items)
    lines = []
    for item in items:
        if type(item) is UniEvent:
            lines.append(_encoder.encode(item))
        else:
            assert not isinstance(item, UniEvent)
            lines.append(b'{"type":"attempt.reset","attempt":%d}' % item.attempt)
    return b"\n".join(lines) + b"\n"
