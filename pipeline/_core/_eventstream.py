"""AWS event-stream framing (`application/vnd.amazon.eventstream`), sans-I/O: bytes in, whole
messages out. Amazon Bedrock's ConverseStream sends its events so.

A message is a 12-byte prelude (total length, headers length, both big-endian uint32, then the
CRC32 of those 8 bytes), the headers, the payload, and the CRC32 of everything before it. Each
header is a name (1-byte length, UTF-8), a type byte (0 true, 1 false, 2 byte, 3 short, 4 int,
5 long, 6 bytes, 7 string, 8 timestamp in ms, 9 UUID) and its value. Both CRCs are checked: a
bad one, a length no message can have, or a header named twice raises `EventStreamFrameError`
at once and for every call after it, so a broken stream never waits for bytes that cannot come.
The decoder holds at most one message: one whose total length is past `max_frame` raises
`FrameTooLarge` before its bytes are held. Bytes cut anywhere decode to the same messages.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

import attrs

from ._errors import EventStreamFrameError, FrameError, FrameTooLarge
from ._sse import DEFAULT_MAX_FRAME

__all__ = ["EventStreamDecoder", "EventStreamMessage"]

_PRELUDE = 12
_MIN = _PRELUDE + 4  # a message with no headers and no payload
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}  # type -> value size (6, 7: sized)
_INTS = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}


@attrs.frozen
class EventStreamMessage:
    """One decoded message: its headers (name -> value: bool, int, bytes, str, UUID) and its
    payload bytes."""

    headers: dict[str, Any]
    payload: bytes

    @property
    def message_type(self) -> str:
        """`:message-type`: `event`, `exception` or `error` (`event` when absent)."""
        value = self.headers.get(":message-type", "event")
        return value if isinstance(value, str) else "event"

    def header(self, name: str) -> str:
        """A string header's value, or "" when it is absent or not a string."""
        value = self.headers.get(name, "")
        return value if isinstance(value, str) else ""


class EventStreamDecoder:
    """Bytes in, whole `EventStreamMessage`s out.

    Attributes:
        frames: how many messages were returned so far.
        offset: how many bytes were fed so far.
    """

    __slots__ = ("_buf", "_error", "_start", "frames", "max_frame", "offset")

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._start = 0  # the stream offset of `_buf[0]`
        self._error: FrameError | None = None
        self.frames = 0
        self.offset = 0

    def feed(self, chunk: bytes) -> list[EventStreamMessage]:
        """Take the next bytes; return the messages they complete, in order. Messages before a
        broken one are returned; the error is raised by the next call (and every one after)."""
        if self._error is not None:
            raise self._error
        self.offset += len(chunk)
        self._buf += chunk
        out: list[EventStreamMessage] = []
        buf = self._buf
        at = 0
        try:
            while len(buf) - at >= _PRELUDE:
                total = self._prelude(buf, at)
                if len(buf) - at < total:
                    break
                out.append(self._message(bytes(buf[at : at + total]), self._start + at))
                at += total
        except FrameError as exc:
            self._error = exc
            self._buf = bytearray()
            if not out:
                raise
            return out
        del buf[:at]
        self._start += at
        self.frames += len(out)
        return out

    def close(self) -> list[EventStreamMessage]:
        """End of input. A message cut short is a truncation, not data: nothing comes of it (the
        dialect sees a stream that ended early). Raises the error a previous call deferred."""
        if self._error is not None:
            raise self._error
        self._buf = bytearray()
        return []

    def _prelude(self, buf: bytearray, at: int) -> int:
        total, head_len, crc = struct.unpack_from(">III", buf, at)
        where = self._start + at
        if zlib.crc32(buf[at : at + 8]) != crc:
            raise EventStreamFrameError(
                "event-stream prelude CRC does not match", offset=where, frame_index=self.frames
            )
        if total < _MIN or head_len > total - _MIN:
            raise EventStreamFrameError(
                f"event-stream message length {total} cannot hold {head_len} bytes of headers",
                offset=where,
                frame_index=self.frames,
            )
        if total > self.max_frame:
            raise FrameTooLarge(self.max_frame, total, offset=where)
        return int(total)

    def _message(self, raw: bytes, where: int) -> EventStreamMessage:
        (crc,) = struct.unpack_from(">I", raw, len(raw) - 4)
        if zlib.crc32(raw[:-4]) != crc:
            raise EventStreamFrameError(
                "event-stream message CRC does not match", offset=where, frame_index=self.frames
            )
        (head_len,) = struct.unpack_from(">I", raw, 4)
        headers = _headers(raw[_PRELUDE : _PRELUDE + head_len], where, self.frames)
        return EventStreamMessage(headers, raw[_PRELUDE + head_len : -4])


def _headers(raw: bytes, where: int, index: int) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    at = 0
    try:
        while at < len(raw):
            size = raw[at]
            named = raw[at + 1 : at + 1 + size]
            if len(named) != size:
                raise IndexError
            name = named.decode("utf-8")
            at += 1 + size
            kind = raw[at]
            at += 1
            value: Any
            if kind in (0, 1):
                value = kind == 0
            elif kind in _INTS:
                width = _FIXED[kind]
                (value,) = struct.unpack_from(_INTS[kind], raw, at)
                at += width
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", raw, at)
                data = raw[at + 2 : at + 2 + length]
                if len(data) != length:
                    raise IndexError
                value = data if kind == 6 else data.decode("utf-8")
                at += 2 + length
            elif kind == 9:
                data = raw[at : at + 16]
                if len(data) != 16:
                    raise IndexError
                value = uuid.UUID(bytes=data)
                at += 16
            else:
                raise EventStreamFrameError(
                    f"event-stream header {name!r} has unknown type {kind}",
                    offset=where,
                    frame_index=index,
                )
            if at > len(raw):
                raise IndexError
            if name in headers:  # which one would count is anyone's guess: refused
                raise EventStreamFrameError(
                    f"event-stream header {name!r} appears twice", offset=where, frame_index=index
                )
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        raise EventStreamFrameError(
            "event-stream headers do not parse", offset=where, frame_index=index
        ) from None
    return headers
