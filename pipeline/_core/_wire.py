"""The whole sans-I/O decode of one attempt: bytes -> frames -> lane events -> UniEvents.

This is what the source and grammar actors do between them, in one pure object: the frame codec
the dialect's framing calls for, the dialect's stream decoder, and the grammar. Tests, the
benchmark, the replay transport and the single-task decode path all use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._errors import FrameEncodingError, FrameError, FrameTooLarge, MalformedFrameError
from ._eventstream import EventStreamDecoder
from ._grammar import Grammar, wall_clock_ms
from ._lanes import MessageStop, ProviderErrorEvent
from ._ndjson import NDJSONDecoder, utf8
from ._sse import DEFAULT_MAX_FRAME, SSEDecoder, SSEEvent

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._dialect import Dialect
    from ._lanes import LaneEvent

__all__ = ["HEAD_BYTES", "HEAD_PIECE", "WireDecoder"]

HEAD_PIECE = 384
"""While the body's first bytes are read, a read is decoded in pieces of about this many bytes,
each cut where a frame ends, and each piece's events are handed on before the next is decoded:
the first delta is not held back while the rest of a big first read (often 1-4 KB, a dozen
frames or more) is decoded (`WireDecoder.head_piece`)."""
HEAD_BYTES = 2048
"""How many of the body's first bytes are read in `HEAD_PIECE` pieces; past them, whole reads."""
_FRAME_ENDS = {"sse": b"\n\n", "ndjson": b"\n"}
_BLOCK_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")  # what ends an SSE block, CRLF or not


class WireDecoder:
    """Decodes one attempt's response body into checked UniEvents.

    With `stream=False` (or a dialect whose framing is `json`) the body is one JSON document,
    decoded at `close()` by the dialect's `decode_response`. With the `message` framing every
    piece fed is one whole frame (a message transport's message), streaming or not.

    With `grammar=False` it stops short of the grammar: `feed` and `close` hand out the lane
    events themselves, for a grammar actor downstream (the actor graph's `hops` mode); it is
    `stopped` once a lane ends the reply (a stop, an in-stream error).

    Attributes:
        grammar: the grammar checking this attempt.
        lane_events: how many lane events the dialect produced (pings included): what deadlines
            count as signs of life; SSE comments are not.
        frames: how many frames were decoded.
    """

    __slots__ = (
        "_body",
        "_body_size",
        "_checks",
        "_dialect",
        "_framer",
        "_lane_stop",
        "_lines",
        "_many",
        "_max_body",
        "_max_frame",
        "_split",
        "_stream",
        "_streamed_split",
        "frames",
        "grammar",
        "lane_events",
    )

    def __init__(
        self,
        dialect: Dialect,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        clock: Callable[[], int] = wall_clock_ms,
        provider: str | None = None,
        stream: bool = True,
        grammar: bool = True,
    ) -> None:
        self._dialect = dialect
        self.grammar = Grammar(provider or dialect.name, clock=clock)
        self._checks = grammar
        self._lane_stop = False
        self._stream = dialect.stream_decoder()
        # a decoder that takes a read's frames in one call (`FramesDecoder`) runs its own loop
        self._many: Callable[[list[Any], list[LaneEvent]], None] | None = getattr(
            self._stream, "feed_frames", None
        )
        self._framer: SSEDecoder | NDJSONDecoder | EventStreamDecoder | _Messages | None
        if dialect.framing == "message":
            self._framer = _Messages(max_frame)
        elif not stream:
            self._framer = None  # a non-streaming reply: one JSON body
        elif dialect.framing == "sse":
            self._framer = SSEDecoder(max_frame=max_frame)
            # a decoder that reads an event's data as bytes gets them so (`SSEDecoder.raw`)
            self._framer.raw = getattr(self._stream, "sse_bytes", False) is True
        elif dialect.framing == "ndjson":
            self._framer = NDJSONDecoder(max_frame=max_frame)
        elif dialect.framing == "eventstream":
            self._framer = EventStreamDecoder(max_frame=max_frame)
        else:
            self._framer = None
        self._split: Callable[[bytes], list[Any]] | None = None
        if self._framer is not None:
            self._split = self._framer.feed
            if self._many is not None and type(self._framer) is NDJSONDecoder:
                self._split = self._framer.feed_bytes  # it takes a line's bytes as its text
        self._streamed_split = self._split
        # a read of whole NDJSON lines, decoded in one call if the dialect can (`feed_block`)
        self._lines: tuple[NDJSONDecoder, Callable[[bytes, int, list[Any]], bool]] | None = None
        block = getattr(self._stream, "feed_block", None)
        if block is not None and grammar and type(self._framer) is NDJSONDecoder:
            self._lines = (self._framer, block)
        self._body: list[bytes] = []
        self._body_size = 0
        self._max_frame = max_frame
        self._max_body = max(max_frame, 64 * 1024 * 1024)
        self.frames = 0
        self.lane_events = 0

    def probe(self) -> WireDecoder:
        """A fresh decoder of the same reply, without the grammar: for reading ahead (a hedged
        race watches it for the first lane event)."""
        return WireDecoder(
            self._dialect, max_frame=self._max_frame, provider=self.provider, grammar=False
        )

    def resume_point(self) -> Any:
        """Where the reply, broken off, could be continued by the provider (its dialect's
        decoder says, for a wire that can: OpenAI's Responses in background mode); None when
        it cannot."""
        point = getattr(self._stream, "resume_point", None)
        return None if point is None else point()

    def restart_framing(self) -> None:
        """The reply goes on in a new body (a resumed stream): a frame the old one cut short is
        dropped, and framing starts again at the new body's first byte."""
        framer = self._framer
        if type(framer) is SSEDecoder:
            fresh = SSEDecoder(max_frame=self._max_frame)
            fresh.raw = framer.raw
            self._framer = fresh
            self._split = self._streamed_split = fresh.feed

    @property
    def stopped(self) -> bool:
        """Whether the reply is over: its stop came (or, without the grammar, a lane ended
        it). Nothing fed after is read."""
        return self._lane_stop or self.grammar.stopped

    @property
    def framing(self) -> str:
        """The dialect's framing."""
        return self._dialect.framing

    @property
    def provider(self) -> str:
        """The provider name errors carry."""
        return self.grammar.provider

    def sniff(self) -> None:
        """Read the body as one whole JSON reply (`decode_response`) if it starts as JSON does,
        and as the stream its framing says otherwise: for a reply to a streaming request whose
        Content-Type says JSON (a server that ignored `"stream": true`, or one that mislabels
        its stream). Call before the first byte is fed."""
        if type(self._framer) is SSEDecoder:
            self._split = self._sniffed

    def _sniffed(self, chunk: bytes) -> list[Any]:
        """`_split` until the body's first byte other than white space tells what it is."""
        head = chunk.lstrip()[:1]
        if head and head in b"{[":
            self._framer = self._split = None  # one JSON document, decoded at `close`
            self._body.append(chunk)
            self._body_size = len(chunk)
            return []
        split = self._streamed_split
        assert split is not None
        if head:
            self._split = split  # a stream after all
        return split(chunk)  # (white space alone: blank lines, nothing yet told)

    def head_piece(self, chunk: bytes) -> int:
        """Where the first piece of a read at the body's start ends (`HEAD_PIECE`): just past
        the first frame end at or after `HEAD_PIECE` bytes; 0 to decode the read whole (a
        small read, less than `HEAD_PIECE` bytes after that end (not worth a handover of its
        own), a framing whose pieces are whole frames or that is not cut into frames).
        Feeding the two parts one after the other decodes exactly what feeding the read
        would."""
        if len(chunk) <= HEAD_PIECE or self._framer is None:
            return 0
        end = _FRAME_ENDS.get(self._dialect.framing)
        if end is None:
            return 0
        cut = chunk.find(end, HEAD_PIECE)
        if cut < 0:
            return 0
        cut += len(end)
        return cut if len(chunk) - cut >= HEAD_PIECE else 0

    def feed(self, chunk: bytes, out: list[Any] | None = None) -> list[Any]:
        """Take the next bytes of the body; append the UniEvents they complete to `out` (a new
        list if None) and return it. If it raises, `out` still holds every event released before
        the error, so a caller that passes its own list loses nothing. Bytes after the reply's
        stop are ignored."""
        if out is None:
            out = []
        if self._lane_stop or self.grammar.stopped:
            return out  # the reply is over: what follows is not even framed
        if self._lines is not None:
            framer, block = self._lines
            pending: list[LaneEvent] = []
            lines = framer.feed_block(chunk, block, pending)
            if lines:
                self.frames += lines
                self.lane_events += len(pending)
                self.grammar.feed_many(pending, out)
                return out
        split = self._split
        if split is None:
            self._body.append(chunk)
            self._body_size += len(chunk)
            if self._body_size > self._max_body:
                raise FrameTooLarge(self._max_body, self._body_size, provider=self.provider)
            return out
        try:
            frames: list[Any] = split(chunk)
        except FrameError as exc:
            exc.locate(provider=self.provider, frame_index=self.frames, offset=None)
            raise
        if not frames:
            return out
        many = self._many
        if many is None or not self._checks:
            self._frames(frames, out, chunk)
            return out
        # the commonest read, `_frames` inline: the frames in one call, their lanes to the grammar
        pending = []
        try:
            many(frames, pending)
        except BaseException as exc:
            done = getattr(self._stream, "failed_at", 0)
            self.frames += done
            self._lanes(pending, out)  # what the frames before it released still goes out
            located = self._located(exc, frames, done, chunk=chunk)
            if located is exc:
                raise
            raise located from None
        self.frames += len(frames)
        if pending:
            self.lane_events += len(pending)
            self.grammar.feed_many(pending, out)
        return out

    def close(self, out: list[Any] | None = None) -> list[Any]:
        """End of the body: append what the last frames and the end itself release to `out` and
        return it; raises `IncompleteStreamError` (or another typed error) when the reply was
        not complete, with `out` holding what came before."""
        if out is None:
            out = []
        if self._framer is None:
            body = b"".join(self._body)
            self._body = []
            self._lanes(self._decode_body(body), out)
        elif not self.stopped:  # else what followed the stop is not read: not even its framing's
            # errors (a line after `done: true` that is not UTF-8, an oversized frame after
            # `[DONE]`), which a read that held the stop too deferred to the framer's close
            framer = self._framer
            if type(framer) is SSEDecoder:
                # the last event lacks only its blank line: read it if its data is whole (the
                # terminal `[DONE]`, or JSON), as NDJSON reads a last line without its LF; a
                # cut in its data leaves JSON that does not parse, a truncation still
                last = framer.end_block()
                if last and all(_whole(frame) for frame in last):
                    self._frames(last, out)
            self._frames(framer.close(), out)
        self._lanes(self._stream_close(), out)
        if self._checks:
            out.extend(self.grammar.close())
        return out

    def _frames(self, frames: list[Any], out: list[Any], chunk: bytes | None = None) -> None:
        # the lanes of every frame go to the grammar in one call, even when a frame fails: what
        # the frames before it released still reaches `out` before the error is raised
        pending: list[LaneEvent] = []
        done = 0
        many = self._many
        try:
            if many is not None:
                try:
                    many(frames, pending)
                except BaseException:
                    done = getattr(self._stream, "failed_at", 0)
                    raise
                done = len(frames)
            else:
                feed_frame = self._stream.feed
                for frame in frames:
                    pending += feed_frame(frame)
                    done += 1
        except (FrameError, msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            located = self._located(exc, frames, done, self.frames + done, chunk=chunk)
            if located is exc:
                raise
            raise located from None
        finally:
            self.frames += done
            if pending:
                self._lanes(pending, out)

    def _located(
        self,
        exc: BaseException,
        frames: list[Any],
        done: int,
        index: int | None = None,
        *,
        chunk: bytes | None = None,
    ) -> BaseException:
        """The typed error of frame `done` of `frames` (stream index `index`, else the
        decoder's count) failing with `exc`; `chunk` is the read that completed the frames."""
        if index is None:
            index = self.frames
        offset = self._offset(chunk, frames, done)
        if isinstance(exc, FrameError):
            exc.locate(provider=self.provider, frame_index=index, offset=offset)
            return exc
        if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
            return MalformedFrameError(
                str(exc),
                _text(frames[done]),
                provider=self.provider,
                frame_index=index,
                offset=offset,
            )
        if isinstance(exc, RecursionError):
            return _too_deep(frames[done], self.provider, index)
        return exc

    def _offset(self, chunk: bytes | None, frames: list[Any], done: int) -> int | None:
        """The stream offset where frame `done` of a read's `frames` starts, as far as the read
        (`chunk`) tells: the start of its SSE block or NDJSON line when that lies in the read, or
        where the read began when the frame was held from earlier reads and the read starts its
        last lines. None when it cannot be told (a frame whose data the read does not hold as
        sent). Only failures ask (it searches the read)."""
        framer = self._framer
        if (
            chunk is None
            or done >= len(frames)
            or not isinstance(framer, SSEDecoder | NDJSONDecoder)
        ):
            return None
        start = framer.offset - len(chunk)  # where the read began in the stream
        frame = frames[done]
        data = frame if type(frame) is bytes else frame[1] if type(frame) is tuple else None
        if data is None and isinstance(frame, SSEEvent | str):
            data = (frame.data if isinstance(frame, SSEEvent) else frame).encode("utf-8")
        if not data or (type(framer) is SSEDecoder and not utf8(data, len(data))):
            return None  # (an SSE event's bytes that are not UTF-8 are read with U+FFFD)
        at = _line_at(chunk, data)
        if at < 0:
            return self._offset_from_end(chunk, frames, done)
        if type(framer) is NDJSONDecoder:
            return start + at
        head = max(
            (i + len(sep) for sep in _BLOCK_ENDS if (i := chunk.rfind(sep, 0, at)) >= 0), default=0
        )
        if head > 0:
            return start + head  # after the blank line that ended the block before it
        if chunk.startswith((b"data:", b"event:", b"id:")) or done > 0:
            return start  # the read begins the block (a later frame's block always does)
        return None

    def _offset_from_end(self, chunk: bytes, frames: list[Any], done: int) -> int | None:
        """`_offset` for a frame the read holds only the end of (small reads): counted back from
        where the decoder's held bytes begin, over the bytes of the frames from it to the read's
        last, which frames of one `data:` line (a name or not) spell. LF line ends only: a CR in
        the read leaves it unknown."""
        framer = self._framer
        if type(framer) is not SSEDecoder or 0x0D in chunk:
            return None
        at = framer.offset - framer.held_size  # just past the blank line that ended the last
        for frame in reversed(frames[done:]):
            if type(frame) is bytes:
                name, data = "message", frame
            elif type(frame) is tuple:
                name, data = frame
            elif not frame.id and "\n" not in frame.data and "\ufffd" not in frame.data:
                name, data = frame.event, frame.data.encode("utf-8")  # one line, as it came
            else:
                return None  # lines its data does not spell (an id, several data lines)
            if not utf8(data, len(data)):
                return None  # as a decoded event would be: its length as sent is not known
            block = len(b"data: ") + len(data)
            if name != "message":
                block += len(b"event: \n") + len(name.encode("utf-8"))
            at -= len(b"\n\n") + block
        return at

    def _lanes(self, lanes: list[LaneEvent], out: list[Any]) -> None:
        self.lane_events += len(lanes)
        if self._checks:
            self.grammar.feed_many(lanes, out)
        else:
            self._pass(lanes, out)

    def _pass(self, lanes: list[LaneEvent], out: list[Any]) -> None:
        """Without the grammar: the lanes themselves, up to the one that ends the reply."""
        for i, lane in enumerate(lanes):
            if type(lane) is MessageStop or type(lane) is ProviderErrorEvent:
                self._lane_stop = True
                out += lanes[: i + 1]
                return
        out += lanes

    def _stream_close(self) -> list[LaneEvent]:
        try:
            return self._stream.close()
        except FrameError as exc:
            exc.locate(provider=self.provider, frame_index=self.frames, offset=None)
            raise
        except RecursionError:
            raise _too_deep("", self.provider, self.frames) from None

    def _decode_body(self, body: bytes) -> list[LaneEvent]:
        try:  # strict UTF-8 for the whole body: fields a dialect skips are not checked by it
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameEncodingError(
                f"response body is not valid UTF-8 (byte {exc.start})",
                provider=self.provider,
                offset=exc.start,
                frame_index=0,
            ) from None
        try:
            return self._dialect.decode_response(body)
        except FrameError as exc:
            exc.locate(provider=self.provider, frame_index=0, offset=None)
            raise
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedFrameError(
                str(exc), body, provider=self.provider, frame_index=0
            ) from None
        except RecursionError:
            raise _too_deep(body, self.provider, 0) from None


class _Messages:
    """The framer of a message transport: each piece is already one whole frame."""

    __slots__ = ("_max_frame",)

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame

    def feed(self, message: bytes) -> list[bytes]:
        if len(message) > self._max_frame:
            raise FrameTooLarge(self._max_frame, len(message))
        return [message]

    def close(self) -> list[bytes]:
        return []


def _line_at(chunk: bytes, data: bytes) -> int:
    """Where `data` stands in `chunk` as a line's end (followed by a line end or by the end of
    the read: a frame cut short is a prefix of others), or -1."""
    at = chunk.find(data)
    while at >= 0:
        after = at + len(data)
        if after == len(chunk) or chunk[after] in (0x0A, 0x0D):
            return at
        at = chunk.find(data, at + 1)
    return -1


def _whole(frame: Any) -> bool:
    """Whether an SSE frame's data is a whole value: `[DONE]`, or JSON that parses."""
    data = frame if type(frame) is bytes else frame[1] if type(frame) is tuple else frame.data
    if data == b"[DONE]" or data == "[DONE]":
        return True
    try:
        msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _text(frame: Any) -> str:
    """A frame as the text an error quotes."""
    return frame.decode("utf-8", "replace") if isinstance(frame, bytes) else str(frame)


def _too_deep(frame: Any, provider: str, frame_index: int) -> MalformedFrameError:
    """A frame nested deeper than the JSON decoder can follow: malformed, never a crash (a
    dialect's own decoding raises `RecursionError` for it, however deep the caller's stack)."""
    text = frame if isinstance(frame, str | bytes) else str(frame)
    return MalformedFrameError(
        "frame is nested too deeply to decode", text, provider=provider, frame_index=frame_index
    )
