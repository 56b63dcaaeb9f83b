"""Server-sent events, sans-I/O: a decoder that keeps every WHATWG event-stream rule, and (from
`_encode`, where every wire encoder lives) an encoder that cannot be tricked into splitting a frame.

The decoder takes bytes as they arrive, split anywhere, and returns the events each chunk
completes. It decodes UTF-8 incrementally (a character split across chunks is reassembled;
invalid bytes become U+FFFD, as the standard says, never an exception), strips one leading BOM,
ends lines at CR, LF or CRLF (a CRLF split across chunks counts once), skips comments, removes
one leading space from a value, joins multi-line data with LF, ignores an `id` containing NUL,
resets the id on an empty `id`, accepts `retry` only when all ASCII digits (a `retry` line whose
line ended counts even in an event that never completes: at end of input), commits the id of a
block even when it has no data, resets the event name after each dispatch, and discards an
unfinished event at end of input. Comment lines are dropped as they arrive (those at the
unfinished end of a chunk wait with it), so keep-alives never pile up in a pending event.

One field the standard ignores is read: `error:`, which llama.cpp-family servers write instead
of an event when a stream fails (`error: {"code":400,"message":...}`, `error: {"detail":...}`,
or plain text). Dropped, it would leave a stream that looks cut and no cause; read, it ends the
stream with `SSEErrorField` carrying the text. It is looked for only where a line's field name
is not one the standard knows, off the fast paths.

It holds at most one frame: a pending event larger than `max_frame` bytes (32 MiB by default)
raises `FrameTooLarge`, and the rest is never looked at. The events completed before the
oversized one in the same chunk are still returned; the error is raised by the next call (and
every one after it), so what a caller receives does not depend on how the bytes were cut.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._encode import encode_sse as encode_sse  # the encoder lives with the other wire encoders
from ._errors import FrameTooLarge, SSEErrorField

__all__ = ["DEFAULT_MAX_FRAME", "SSEDecoder", "SSEEvent", "encode_sse"]

DEFAULT_MAX_FRAME = 32 * 1024 * 1024
"""The cap on one incoming frame: real frames repeat a whole answer or carry an inline image."""
_BOM = b"\xef\xbb\xbf"
_NAMES: dict[bytes, str] = {}  # `event: name` lines seen, names decoded once (bounded: few)


class SSEEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event: its data, its type (`message` unless named), and the last event id."""

    data: str
    event: str = "message"
    id: str = ""


class SSEDecoder:
    """Bytes in, `SSEEvent`s out. No sockets, no clock, no trio.

    Attributes:
        raw: hand on the commonest events (one `data:` line, after an `event:` line or not)
            as their data's bytes (`(name, bytes)` for a named one), not as `SSEEvent`s: for a
            JSON decoder that reads bytes, one copy, one object and one UTF-8 round trip fewer.
            Its reader reads no id, and applies the standard's rule itself: bytes that are not
            UTF-8 read as decoded with replacement (`sse_text`). Off by default.
        last_event_id: the id committed by the last dispatched block.
        retry: the last valid reconnection time the stream asked for, in milliseconds.
        frames: how many events were dispatched so far.
        comments: how many comment lines were seen (keep-alives; they are not events).
        offset: how many bytes were fed so far.
    """

    __slots__ = (
        "_data",
        "_error",
        "_event",
        "_held",
        "_held_lf",
        "_held_size",
        "_id",
        "_in_comment",
        "_said",
        "_skip_lf",
        "_started",
        "comments",
        "frames",
        "last_event_id",
        "max_frame",
        "offset",
        "raw",
        "retry",
    )

    def __init__(self, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self._held: list[bytes] = []  # the unfinished block (event), as the pieces that came
        self._held_size = 0
        self._held_lf = False  # the held bytes end in LF: a LF next would end the block
        self._skip_lf = False  # the last chunk ended in CR: a LF starting the next one is its pair
        self._in_comment = False  # the last chunk ended inside a comment line (being dropped)
        self._error: Exception | None = None  # an oversized frame, raised by every later call
        self._said: str | None = None  # an `error:` line's value, in the block being parsed
        self._started = False  # the stream's first bytes were seen (and a BOM stripped)
        self._data: list[bytes] = []
        self._event = ""
        self._id = ""
        self.last_event_id = ""
        self.retry: int | None = None
        self.frames = 0
        self.comments = 0
        self.offset = 0
        self.raw = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes; return the events they complete, in order."""
        # Theory: line ends are normalised to LF, and the bytes are cut into blocks at each blank
        # line ("\n\n"); only complete blocks are parsed, so an event's lines are always parsed
        # together and the commonest block, a lone `data:` line, takes one fast step. Each value
        # is decoded on its own, which is the standard's stream-wide UTF-8 decode with
        # replacement: LF is ASCII, so no character spans a line end, and an invalid sequence cut
        # by one is replaced the same either way.
        self.offset += len(chunk)
        if self._skip_lf:
            if not chunk:
                return []
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        if not self._started:
            if self._error is not None:  # a failed decoder is never started (off the hot path)
                raise self._error
            chunk = b"".join(self._held) + chunk
            self._held.clear()
            self._held_size = 0
            if len(chunk) < 3 and _BOM.startswith(chunk):
                if chunk:
                    self._held.append(chunk)  # maybe the start of a BOM: wait for more
                    self._held_size = len(chunk)
                return []
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if not chunk:
            return []
        blocks: list[bytes] | None = None
        if 0x0D in chunk:
            if not self._held_lf and not self._in_comment:
                # CRLF throughout (Gemini's): where no line end but the blank lines' is in
                # the chunk, cutting at "\r\n\r\n" gives the very blocks normalising would
                blocks = chunk.split(b"\r\n\r\n")
                for block in blocks:
                    if 0x0D in block or 0x0A in block:
                        blocks = None
                        break
            if blocks is None:
                self._skip_lf = chunk[-1] == 0x0D
                chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._in_comment:  # the rest of a comment line: dropped up to its end
            nl = chunk.find(b"\n")
            if nl < 0:
                return []
            self._in_comment = False
            self.comments += 1  # a comment counts once its line ends
            chunk = chunk[nl + 1 :]
            if not chunk:
                return []
        held = self._held
        if blocks is None:
            # split first: a search for a blank line before the split scans the bytes twice
            blocks = chunk.split(b"\n\n")
        if len(blocks) == 1 and not (self._held_lf and chunk[0] == 0x0A):
            # no block ends here: hold the piece (joined once when the block ends, so a long
            # event arriving in many small chunks costs linear time), without its comment lines
            if chunk[0] == 0x3A or b"\n:" in chunk:
                chunk = self._uncommented(chunk, self._held_lf or not held)
                if not chunk:
                    return []
            held.append(chunk)
            self._held_size += len(chunk)
            self._held_lf = chunk[-1] == 0x0A
            if self._held_size > self.max_frame:
                raise self._fail(self._too_large(self._held_size))
            return []
        size = len(chunk) + self._held_size
        if held:
            if self._held_lf and chunk[0] == 0x0A:  # the blank line spans the two pieces
                blocks = (b"".join(held) + chunk).split(b"\n\n")
            else:  # no blank line spans them: the held piece starts the first block
                blocks[0] = held[0] + blocks[0] if len(held) == 1 else b"".join(held) + blocks[0]
            held.clear()
        tail = blocks.pop()  # its comment lines, if any, are bounded by this chunk
        if tail:
            held.append(tail)
            self._held_lf = tail[-1] == 0x0A
        else:
            self._held_lf = False
        self._held_size = len(tail)
        out: list[Any] = []
        cap = self.max_frame
        event_id = self._id
        names = _NAMES
        raw = self.raw
        fast = 0  # events dispatched by the fast paths (they change no state but the count)
        failed: Exception | None = None
        small = size <= cap  # then no block in it is over the cap
        for block in blocks:
            if not small and len(block) > cap and _uncommented_size(block) > cap:
                failed = self._too_large(len(block))
                break
            if block[:6] == b"data: ":
                if 0x0A not in block:
                    # the commonest block by far: one `data:` line, no name, no id
                    if raw:
                        out.append(block[6:])  # its data as it came (`raw`)
                    else:
                        out.append(
                            SSEEvent(block[6:].decode("utf-8", "replace"), "message", event_id)
                        )
                    fast += 1
                    continue
            else:
                # the next commonest: `event: name` then one `data:` line
                head, sep, data = block.partition(b"\ndata: ")
                if sep and 0x0A not in data:
                    name = names.get(head)
                    if name is None and head[:7] == b"event: " and 0x0A not in head:
                        name = head[7:].decode("utf-8", "replace") or "message"
                        if len(names) < 256:
                            names[head] = name
                    if name is not None:
                        if raw:
                            out.append((name, data))  # its name and data as it came (`raw`)
                        else:
                            out.append(SSEEvent(data.decode("utf-8", "replace"), name, event_id))
                        fast += 1
                        continue
            self.frames += fast
            fast = 0
            self._block(block, out)
            event_id = self._id
            if self._said is not None:  # the server's report of a failed stream: it ends here
                failed = SSEErrorField(self._said, offset=self.offset)
                break
        if fast:
            self.frames += fast
            self.last_event_id = event_id
        if self._held_size > cap and failed is None:
            failed = self._too_large(self._held_size)
        if failed is not None:
            self._fail(failed)
            if not out:
                raise failed
        return out

    @property
    def held_size(self) -> int:
        """How many bytes of an unfinished event are held (its comment lines aside)."""
        return self._held_size

    def end_block(self) -> list[Any]:
        """The held event as if its last line had ended and its blank line had come: for a
        reader that, at end of input, takes such an event whose data is whole rather than
        discarding it (`WireDecoder.close`). Nothing when no event is held. Call it just before
        `close`; feeding more after it reads on from an empty block."""
        if self._error is not None or not self._held:
            return []
        if self._in_comment or not self._held_lf:  # a line (or a comment line) to end first
            end = b"\n\n"
        else:  # the last line ended (a CR that ended it waits for its LF)
            end = b"\r" if self._skip_lf else b"\n"
        events = self.feed(end)
        self.offset -= len(end)  # those bytes never came
        return events

    def close(self) -> list[SSEEvent]:
        """End of input: an event not ended by a blank line is discarded, as the standard says,
        but a `retry` line of it whose line ended still sets the reconnection time (and a comment
        line that ended counts), and an `error:` line that ended raises `SSEErrorField`. Raises
        the `FrameTooLarge` a previous call deferred."""
        if self._error is not None:
            raise self._error
        held = b"".join(self._held)
        for line in held[: held.rfind(b"\n") + 1].split(b"\n"):
            if line.startswith((b"retry:", b":", b"error:")):
                # sets the time, counts a comment, keeps a failed stream's report
                self._field(line.decode("utf-8", "replace"))
        self._held.clear()
        self._held_size = 0
        self._held_lf = False
        self._in_comment = False
        self._data.clear()
        self._event = ""
        if self._said is not None:  # a failed stream's report, its line ended: not discarded
            raise self._fail(SSEErrorField(self._said, offset=self.offset))
        return []

    def _uncommented(self, piece: bytes, line_start: bool) -> bytes:
        """`piece` (no blank line in it) without its comment lines, counted; `line_start` says
        whether it starts a line. A comment line it does not end is dropped as it goes on."""
        kept: list[bytes] = []
        at = 0
        end = len(piece)
        while at < end:
            nl = piece.find(b"\n", at)
            if line_start and piece[at] == 0x3A:
                if nl < 0:
                    self._in_comment = True
                    break
                self.comments += 1
            else:
                kept.append(piece[at:] if nl < 0 else piece[at : nl + 1])
                if nl < 0:
                    break
            at = nl + 1
            line_start = True
        return b"".join(kept)

    def _block(self, block: bytes, out: list[SSEEvent]) -> None:
        """Parse a complete block's lines, then dispatch it (a blank line ended it)."""
        data = self._data
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                value = line[7:] if line[6:7] == b" " else line[6:]
                self._event = value.decode("utf-8", "replace")
            elif not line:
                self._dispatch(out)  # a blank line inside: three or more line ends in a row
            else:
                self._field(line.decode("utf-8", "replace"))
        self._dispatch(out)

    def _dispatch(self, out: list[SSEEvent]) -> None:
        self.last_event_id = self._id
        data = self._data
        if data:
            text = (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace")
            out.append(SSEEvent(text, self._event or "message", self._id))
            self.frames += 1
            data.clear()
        self._event = ""

    def _field(self, line: str) -> None:
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
            self._data.append(value.encode("utf-8"))
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        elif name == "error" and self._said is None:  # not SSE's: see the module docstring
            self._said = value

    def _fail(self, error: Exception) -> Exception:
        """Refuse the rest: every later call raises `error`, and nothing more is held."""
        self._error = error
        self._started = False  # routes the next call to the check for `_error`
        self._skip_lf = False
        self._held.clear()
        self._held_size = 0
        return error

    def _too_large(self, size: int) -> Exception:
        error: Exception = FrameTooLarge(self.max_frame, size, offset=self.offset)
        return error


def _uncommented_size(block: bytes) -> int:
    """A block's size without its comment lines: what the cap counts, however it was chunked."""
    return sum(len(line) + 1 for line in block.split(b"\n") if line[:1] != b":")
