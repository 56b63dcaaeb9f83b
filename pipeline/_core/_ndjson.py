"""Newline-delimited JSON, sans-I/O: bytes in, one text line per JSON object out.

Lines end at LF (a CR before it is dropped); blank lines are skipped. Every line must be UTF-8:
a line that is not raises `FrameEncodingError` (unlike SSE, NDJSON has no replacement rule, and
a corrupted JSON object must not pass as data). At end of input a final line without its LF is
kept only if it parses as JSON; otherwise it is a truncated line and is discarded, so the dialect
sees a stream that ended early. The decoder holds at most one line: a line longer than
`max_frame` bytes (32 MiB by default) raises `FrameTooLarge`, and the rest is never looked at.

A chunk whose lines end in an error (an oversized line, invalid UTF-8) still returns the lines
before it; the error is raised by the next call (and every one after it), so what a caller
receives does not depend on how the bytes were cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._errors import FrameEncodingError, FrameError, FrameTooLarge
from ._sse import DEFAULT_MAX_FRAME

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["NDJSONDecoder"]

_parse = msgspec.json.decode


def utf8(buf: bytes, end: int) -> bool:
    """Whether `buf[:end]` is UTF-8."""
    try:
        buf[:end].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class NDJSONDecoder:
    """Bytes in, complete NDJSON lines (as text) out.

    Attributes:
        frames: how many lines were returned so far.
        offset: how many bytes were fed so far.
    """

    __slots__ = (
        "_error",
        "_held",
        "_held_size",
        "_tail",
        "_tail_offset",
        "frames",
        "max_frame",
        "offset",
    )

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self._tail = b""
        self._tail_offset = 0  # the stream offset of the first byte of `_tail`
        self._held: list[bytes] = []  # later pieces of the tail, from chunks without a LF
        self._held_size = 0
        self._error: Exception | None = None  # raised by every call once the lines broke
        self.frames = 0
        self.offset = 0

    def feed(self, chunk: bytes) -> list[str]:
        """Take the next bytes; return the lines they complete, in order."""
        lines = self.feed_bytes(chunk)
        return [line.decode("utf-8") for line in lines]

    def feed_block(
        self, chunk: bytes, block: Callable[[bytes, int, list[Any]], bool], out: list[Any]
    ) -> int:
        """Hand the commonest read to `block` as one block of lines, for a reader that decodes
        them in one call: the line held before it and the read, cut at their last LF, when they
        end lines (nothing held from reads without a LF), hold no CR and nothing over the cap.
        The lines are not checked here: `block` must refuse (return False) a block any line of
        which is not one JSON value in UTF-8, blank lines included. Once `block` has read it
        (appending to `out`), the read is taken as `feed_bytes` takes it, the rest held: how
        many lines it held. 0, with nothing taken, for any other read: `feed_bytes` reads it."""
        if self._held or self._error is not None or 0x0A not in chunk:
            return 0
        buf = self._tail + chunk
        if 0x0D in buf or len(buf) > self.max_frame:
            return 0
        end = buf.rfind(b"\n")
        lines = buf.count(b"\n", 0, end) + 1
        if not block(buf[:end], lines, out):
            return 0
        self.offset += len(chunk)
        self.frames += lines
        self._tail = buf[end + 1 :]
        self._tail_offset += end + 1
        return lines

    def feed_bytes(self, chunk: bytes) -> list[bytes]:
        """`feed`, with each line as its bytes (checked to be UTF-8): what a JSON decoder reads
        without a copy."""
        if self._error is not None:
            raise self._error
        self.offset += len(chunk)
        if 0x0A not in chunk:  # (an int is looked for with memchr, a bytes needle is not)
            # hold the piece: a long line in many small chunks costs linear time, not a copy
            # of all of it per chunk
            self._held.append(chunk)
            self._held_size += len(chunk)
            size = len(self._tail) + self._held_size
            if size > self.max_frame:
                self._error = FrameTooLarge(self.max_frame, size, offset=self._tail_offset)
                self._tail = b""
                self._held.clear()
                raise self._error
            return []
        if self._held:
            self._tail += b"".join(self._held)
            self._held.clear()
            self._held_size = 0
        buf = self._tail + chunk
        lines = buf.split(b"\n")
        tail = lines.pop()
        # the commonest read by far: whole lines of JSON, no CR, no blank line, nothing over the
        # cap, and UTF-8 throughout (checked once for the read): its lines are the frames
        if (
            lines
            # no line is blank or starts with a space or a control byte (the least of them is
            # more than b" "): one C call where looking for such a line costs a scan
            and min(lines)[:1] > b" "
            and 0x0D not in buf
            and len(buf) <= self.max_frame
            and (buf.isascii() or utf8(buf, len(buf) - len(tail)))
        ):
            self.frames += len(lines)
            self._tail = tail
            self._tail_offset += len(buf) - len(tail)
            return lines
        out: list[bytes] = []
        at = self._tail_offset
        cap = self.max_frame
        error: Exception | None = None
        for raw in lines:
            size = len(raw)
            try:
                if size > cap or raw[-1:] == b"\r" or not raw or raw.isspace():
                    out_line = self._line(raw, at, len(out))  # the rare cases, one at a time
                    if out_line is not None:
                        out.append(out_line.encode("utf-8"))
                else:
                    try:
                        raw.decode("utf-8")
                        out.append(raw)
                    except UnicodeDecodeError:
                        self._line(raw, at, len(out))  # raises FrameEncodingError, located
                        raise
            except FrameError as exc:
                error = exc
                break
            at += size + 1
        if error is None and len(tail) > cap:
            error = FrameTooLarge(cap, len(tail), offset=at)
        self.frames += len(out)
        if error is not None:
            self._error = error
            self._tail = b""  # the rest is never looked at
            if not out:
                raise error
            return out
        self._tail = tail
        self._tail_offset = at
        return out

    def close(self) -> list[str]:
        """End of input: the last unterminated line, if it is a whole JSON value. Raises the
        error a previous call deferred."""
        if self._error is not None:
            raise self._error
        tail, self._tail = self._tail + b"".join(self._held), b""
        self._held.clear()
        self._held_size = 0
        if tail.endswith(b"\r"):
            tail = tail[:-1]
        if not tail.strip():
            return []
        try:
            tail.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.end == len(tail) and exc.reason == "unexpected end of data":
                return []  # cut off inside a character: a truncation, not bad data
        line = self._line(tail, self._tail_offset, 0)  # invalid UTF-8 inside it still raises
        if line is None:
            return []
        try:
            _parse(line)
        except msgspec.DecodeError:
            return []  # cut off mid-object: a truncation, not data
        self.frames += 1
        return [line]

    def _line(self, raw: bytes, offset: int, done: int) -> str | None:
        """One line's text (None for a blank one); `done` lines of this chunk came before it."""
        if len(raw) > self.max_frame:
            raise FrameTooLarge(self.max_frame, len(raw), offset=offset)
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameEncodingError(
                f"NDJSON line is not valid UTF-8 (byte {exc.start} of the line)",
                offset=offset,
                frame_index=self.frames + done,
            ) from None
        return line
