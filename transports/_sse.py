"""Server-sent events, sans-I/O: a decoder that keeps every WHATWG event-stream rule, and an
encoder that cannot be tricked into splitting a frame.

The decoder takes bytes as they arrive, split anywhere, and returns the events each chunk
completes. It decodes UTF-8 incrementally (a character split across chunks is reassembled;
invalid bytes become U+FFFD, as the standard says, never an exception), strips one leading BOM,
ends lines at CR, LF or CRLF (a CRLF split across chunks counts once), skips comments, removes
one leading space from a value, joins multi-line data with LF, ignores an `id` containing NUL,
resets the id on an empty `id`, accepts `retry` only when all ASCII digits, commits the id of a
block even when it has no data, resets the event name after each dispatch, and discards an
unfinished event at end of input. It holds at most one frame: a pending line or event larger
than `max_frame` characters raises `FrameTooLarge`.
"""

from __future__ import annotations

import codecs
import re
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["DEFAULT_MAX_FRAME", "SSEDecoder", "SSEEvent", "encode_sse"]

DEFAULT_MAX_FRAME = 64 * 1024
_LINE_END = re.compile(r"\r\n|\r|\n")
_FORBIDDEN = re.compile(r"[\r\n\x00]")


def _errors() -> ModuleType:
    """The error module, imported when first needed: `pipeline` imports this package while it
    initialises, so a module-level import would be circular."""
    import pipeline.errors

    return pipeline.errors


class SSEEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event: its data, its type (`message` unless named), and the last event id."""

    data: str
    event: str = "message"
    id: str = ""


class SSEDecoder:
    """Bytes in, `SSEEvent`s out. No sockets, no clock, no trio.

    Attributes:
        last_event_id: the id committed by the last dispatched block.
        retry: the last valid reconnection time the stream asked for, in milliseconds.
        frames: how many events were dispatched so far.
        comments: how many comment lines were seen (keep-alives; they are not events).
        offset: how many bytes were fed so far.
    """

    __slots__ = (
        "_data",
        "_data_size",
        "_event",
        "_id",
        "_line",
        "_skip_lf",
        "_started",
        "_utf8",
        "comments",
        "frames",
        "last_event_id",
        "max_frame",
        "offset",
        "retry",
    )

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._line = ""  # the unfinished line
        self._skip_lf = False  # the last chunk ended in CR: a LF starting the next one is its pair
        self._started = False  # the first character was seen (and a BOM stripped)
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._id = ""
        self.last_event_id = ""
        self.retry: int | None = None
        self.frames = 0
        self.comments = 0
        self.offset = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes; return the events they complete, in order."""
        self.offset += len(chunk)
        text = self._utf8.decode(chunk)
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
                if not text:
                    return []
        self._skip_lf = text[-1] == "\r"
        if self._line:
            text = self._line + text
        lines = _LINE_END.split(text)
        self._line = lines.pop()
        out: list[SSEEvent] = []
        for line in lines:
            if line:
                self._field(line)
            else:
                self._dispatch(out)
        if len(self._line) + self._data_size > self.max_frame:
            self._too_large(len(self._line) + self._data_size)
        return out

    def close(self) -> list[SSEEvent]:
        """End of input: an event not ended by a blank line is discarded, as the standard says."""
        self._line = ""
        self._data = []
        self._data_size = 0
        self._event = ""
        return []

    def _field(self, line: str) -> None:
        if len(line) > self.max_frame:
            self._too_large(len(line))
        colon = line.find(":")
        if colon == 0:
            self.comments += 1
            return
        if colon < 0:
            name, value = line, ""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == " " else line[colon + 1 :]
        if name == "data":
            self._data.append(value)
            self._data_size += len(value) + 1
            if self._data_size > self.max_frame:
                self._too_large(self._data_size)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)

    def _dispatch(self, out: list[SSEEvent]) -> None:
        self.last_event_id = self._id
        if self._data:
            data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
            out.append(SSEEvent(data, self._event or "message", self._id))
            self.frames += 1
            self._data = []
            self._data_size = 0
        self._event = ""

    def _too_large(self, size: int) -> None:
        raise _errors().FrameTooLarge(self.max_frame, size, offset=self.offset)


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
            raise _errors().SSEEncodeError("event")
        parts.append(f"event: {event}\n")
    if id is not None:
        if _FORBIDDEN.search(id):
            raise _errors().SSEEncodeError("id")
        parts.append(f"id: {id}\n")
    if retry is not None:
        if retry < 0:
            raise ValueError("retry must not be negative")
        parts.append(f"retry: {retry}\n")
    if data is not None:
        parts.extend(f"data: {line}\n" for line in _LINE_END.split(data))
    parts.append("\n")
    return "".join(parts).encode("utf-8")
