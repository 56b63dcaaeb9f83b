"""Gemini's stream, sans-I/O: the wire shapes of a `streamGenerateContent` chunk and the decoder
that turns chunks (or one non-streaming body) into lane events. The request side is `_dialect`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from rillet._core._errors import MalformedFrameError
from rillet._core._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartRun,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from ..._core._dialect import (
    ToolIds,
    dumps_arguments,
    sse_event,
    sse_text,
    strict_decode,
    uncached_tokens,
)
from .._error_body import error_from_body
from ._partial_args import PartialArg, StreamedCall

if TYPE_CHECKING:
    from rillet._core._sse import SSEEvent


__all__ = ["NAME"]

NAME = "gemini"

# --- wire shapes ----------------------------------------------------------------------------------

# Decoded JSON holds no cycles, so the structs stay out of the cycle collector (`gc=False`) and the
# sequences are tuples: a stream decodes thousands of chunks, and every tracked object makes the
# collector run sooner and scan longer.


class _FunctionCall(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A whole call; or, with streamed arguments, one piece of one (`_partial_args`)."""

    name: str = ""
    args: Any = None
    id: str = ""
    partial_args: list[PartialArg] | None = None
    will_continue: bool = False


class _InlineData(msgspec.Struct, frozen=True, rename="camel", gc=False):
    data: bytes = b""
    mime_type: str = ""


class _Part(msgspec.Struct, frozen=True, rename="camel", gc=False):
    text: str | None = None
    thought: bool = False
    thought_signature: str = ""
    function_call: _FunctionCall | None = None
    inline_data: _InlineData | None = None


class _Content(msgspec.Struct, frozen=True, gc=False):
    parts: tuple[_Part, ...] = ()


class _Candidate(msgspec.Struct, frozen=True, rename="camel", gc=False):
    content: _Content | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct, frozen=True, rename="camel", gc=False):
    prompt_token_count: int | None = None
    candidates_token_count: int | None = None
    cached_content_token_count: int | None = None
    thoughts_token_count: int | None = None


class _PromptFeedback(msgspec.Struct, frozen=True, rename="camel", gc=False):
    block_reason: str | None = None


class Chunk(msgspec.Struct, frozen=True, rename="camel", gc=False):
    candidates: tuple[_Candidate, ...] = ()
    usage_metadata: _Usage | None = None
    prompt_feedback: _PromptFeedback | None = None
    model_version: str = ""
    response_id: str = ""
    error: dict[str, Any] | None = None


decode_chunk = msgspec.json.Decoder(Chunk)


# A chunk that is only one more fragment of the open text (or thinking) lane: `Chunk`'s fields
# (and those of its candidates, content and part), each narrowed to the values the fast path of
# `feed_frames` takes: one part of non-empty text, no signature, call, data, finish or error.
# What decodes so decodes as a `Chunk` too and takes that path (`_fragments`).


class _MorePart(msgspec.Struct, frozen=True, rename="camel", gc=False):
    text: Annotated[str, msgspec.Meta(min_length=1)]
    thought: Literal[False] = False
    thought_signature: Literal[""] = ""
    function_call: None = None
    inline_data: None = None


class _MoreThought(_MorePart, frozen=True, rename="camel", gc=False):
    thought: Literal[True]  # type: ignore[assignment]


class _MoreContent(msgspec.Struct, frozen=True, gc=False):
    parts: Annotated[tuple[_MorePart, ...], msgspec.Meta(min_length=1, max_length=1)]


class _ThoughtContent(msgspec.Struct, frozen=True, gc=False):
    parts: Annotated[tuple[_MoreThought, ...], msgspec.Meta(min_length=1, max_length=1)]


class _MoreCandidate(msgspec.Struct, frozen=True, rename="camel", gc=False):
    content: _MoreContent
    finish_reason: None = None


class _ThoughtCandidate(msgspec.Struct, frozen=True, rename="camel", gc=False):
    content: _ThoughtContent
    finish_reason: None = None


class _MoreChunk(msgspec.Struct, frozen=True, rename="camel", gc=False, kw_only=True):
    candidates: Annotated[tuple[_MoreCandidate, ...], msgspec.Meta(min_length=1)]
    usage_metadata: _Usage | None = None
    prompt_feedback: _PromptFeedback | None = None
    model_version: str = ""
    response_id: str = ""
    error: None = None


class _ThoughtChunk(_MoreChunk, frozen=True, rename="camel", gc=False, kw_only=True):
    candidates: Annotated[tuple[_ThoughtCandidate, ...], msgspec.Meta(min_length=1)]  # type: ignore[assignment]


_decode_more = msgspec.json.Decoder(_MoreChunk)
_decode_thought = msgspec.json.Decoder(_ThoughtChunk)
_PAUSE = 8  # reads read chunk by chunk after one that was not all fragments


def _merge_usage(old: _Usage | None, new: _Usage) -> _Usage:
    """Field by field: a count the new chunk leaves out keeps the value an earlier one gave."""
    if old is None or (
        (new.prompt_token_count is not None or old.prompt_token_count is None)
        and (new.candidates_token_count is not None or old.candidates_token_count is None)
        and (new.cached_content_token_count is not None or old.cached_content_token_count is None)
        and (new.thoughts_token_count is not None or old.thoughts_token_count is None)
    ):
        return new  # the common case: nothing to keep from before
    return _Usage(
        prompt_token_count=_later(old.prompt_token_count, new.prompt_token_count),
        candidates_token_count=_later(old.candidates_token_count, new.candidates_token_count),
        cached_content_token_count=_later(
            old.cached_content_token_count, new.cached_content_token_count
        ),
        thoughts_token_count=_later(old.thoughts_token_count, new.thoughts_token_count),
    )


def _later(old: int | None, new: int | None) -> int | None:
    return old if new is None else new


def _usage(u: _Usage) -> RawUsage:
    cached = u.cached_content_token_count
    prompt = uncached_tokens(u.prompt_token_count, cached, None, None)
    return RawUsage(
        cached_tokens=cached,
        prompt_tokens=prompt,
        thoughts_tokens=u.thoughts_token_count,
        response_tokens=u.candidates_token_count,
    )


class GeminiStreamDecoder:
    """One attempt's chunks (also used once for a non-streaming body)."""

    __slots__ = (
        "_called",
        "_count",
        "_finished",
        "_ids",
        "_index",
        "_kind",
        "_last_usage",
        "_pause",
        "_signature",
        "_started",
        "_streamed",
        "failed_at",
    )

    def __init__(self) -> None:
        self._kind: LaneKind | None = None  # the open text or thinking lane, if any
        self._index = 0  # its index
        self._signature = ""  # the signature already on it
        self._count = 0  # lanes opened so far: the next lane's index
        self._ids = ToolIds()
        self._called = False  # a functionCall was seen
        self._finished = False  # a finish reason was seen
        self._started = False  # MessageStart went out
        self._last_usage: _Usage | None = None
        self._streamed: StreamedCall | None = None  # a call whose arguments are streaming in
        self.failed_at = 0  # the frame `feed_frames` failed on
        self._pause = 0  # reads to go before a read is tried as all fragments again

    sse_bytes = True  # an event may come as its data's bytes (`FramesDecoder`)

    def feed(self, frame: SSEEvent | bytes | tuple[str, bytes]) -> list[LaneEvent]:
        data = sse_event(frame)[1]  # (the event's name is not read)
        try:  # the hot path: one call into msgspec; on error, strict_decode types it
            decoded = decode_chunk.decode(data)
        except msgspec.MsgspecError:
            decoded = strict_decode(decode_chunk, sse_text(data), NAME)
        return self.chunk(decoded)

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each frame in turn, with its fast path inline (`FramesDecoder`): a chunk
        whose one part is more text (or thinking) for the open lane, without a signature, and
        no finish reason, error or call streaming in, joins the run of them handed on as one
        `PartRun`; the only other thing
        it carries is the cumulative usage, which is kept for the finish."""
        decode = decode_chunk.decode
        # what the fast path needs of the state changes only in `chunk`: read it again after one
        lane = self._fast_lane()
        index = self._index
        thought = lane == "thinking"
        run: list[str] | None = None  # the run of fragments being handed on (`PartRun`)
        if lane is not None:
            # the commonest read of all, nothing but more of the lane: no check per chunk
            if self._pause:
                self._pause -= 1
            elif (run := self._fragments(frames, lane == "thinking")) is not None:
                out.append(PartRun(index, lane, run))
                return
            else:
                self._pause = _PAUSE
        at = 0
        try:
            for at, frame in enumerate(frames):  # noqa: B007 - `at` names the failing frame
                if type(frame) is bytes:
                    data = frame
                elif type(frame) is tuple:
                    data = frame[1]
                else:
                    data = frame.data
                try:
                    chunk = decode(data)
                except msgspec.MsgspecError:
                    chunk = strict_decode(decode_chunk, sse_text(data), NAME)
                if lane is not None and chunk.candidates and chunk.error is None:
                    candidate = chunk.candidates[0]
                    content = candidate.content
                    if (
                        content is not None
                        and candidate.finish_reason is None
                        and len(content.parts) == 1
                    ):
                        part = content.parts[0]
                        text = part.text
                        if (
                            text
                            and part.thought == thought
                            and not part.thought_signature
                            and part.function_call is None
                            and part.inline_data is None
                        ):
                            u = chunk.usage_metadata
                            if u is not None:
                                self._last_usage = _merge_usage(self._last_usage, u)
                            if run is None:
                                run = []
                                out.append(PartRun(index, lane, run))
                            run.append(text)
                            continue
                run = None
                out += self.chunk(chunk)
                lane = self._fast_lane()
                index = self._index
                thought = lane == "thinking"
        except BaseException:
            self.failed_at = at
            raise

    def _fragments(self, frames: list[Any], thought: bool) -> list[str] | None:
        """The fragments of a read's chunks when every one is only more of the open lane
        (`_MoreChunk`), their usage kept as `feed_frames` keeps it; None, with nothing changed,
        otherwise."""
        decode = _decode_thought.decode if thought else _decode_more.decode
        run = []
        usage = self._last_usage
        try:
            for frame in frames:
                chunk = decode(frame)
                run.append(chunk.candidates[0].content.parts[0].text)
                u = chunk.usage_metadata
                if u is not None:
                    usage = _merge_usage(usage, u)
        except (msgspec.MsgspecError, TypeError):  # (TypeError: an `SSEEvent` or a tuple)
            return None
        self._last_usage = usage
        return run

    def _fast_lane(self) -> LaneKind | None:
        """The open lane a chunk of one plain part may go on with inline (`feed_frames`): None
        before the reply started, after its finish reason, or while a call streams in."""
        if self._started and not self._finished and self._streamed is None:
            return self._kind
        return None

    def close(self) -> list[LaneEvent]:
        if self._finished:
            return [MessageStop()]
        # cut off: the usage so far still reaches the grammar (and its IncompleteStreamError)
        u = self._last_usage
        return [] if u is None else [MessageDelta(usage=_usage(u))]

    def chunk(self, chunk: Chunk) -> list[LaneEvent]:
        """The lane events of one decoded chunk."""
        out: list[LaneEvent] = []
        if not self._started and (chunk.response_id or chunk.model_version):
            self._started = True
            out.append(MessageStart(chunk.response_id, chunk.model_version))
        finish: str | None = None
        if chunk.candidates:
            candidate = chunk.candidates[0]
            if candidate.content is not None:
                for part in candidate.content.parts:
                    self._part(part, out)
            finish = candidate.finish_reason
            if finish is not None and self._called and finish.upper() == "STOP":
                finish = "tool_call"
        elif chunk.prompt_feedback is not None:
            finish = chunk.prompt_feedback.block_reason
        # usage is cumulative and repeated on every chunk: keep the latest, and hand it on only
        # with the finish reason (or at the end of a stream cut off before one)
        u = chunk.usage_metadata
        if u is not None:
            u = _merge_usage(self._last_usage, u)  # a count missing here keeps its last value
            if self._finished and u != self._last_usage:  # usage after the finish reason
                out.append(MessageDelta(usage=_usage(u)))
            self._last_usage = u
        if finish is not None and self._streamed is not None:
            self._flush(out)  # the reply is over: so is the call streaming in
        if finish is not None:
            self._finished = True
            last = self._last_usage
            out.append(
                MessageDelta(finish_reason=finish, usage=None if last is None else _usage(last))
            )
        if chunk.error is not None:
            error = error_from_body(NAME, None, {"error": chunk.error}, in_stream=True)
            error.retry_after = retry_delay(chunk.error)
            out.append(ProviderErrorEvent(error))
        return out

    def _part(self, part: _Part, out: list[LaneEvent]) -> None:
        signature = part.thought_signature
        fidelity = {"signature": signature} if signature else None
        text = part.text
        call = part.function_call
        if call is not None:
            self._call(call, fidelity, out)
            return
        if self._streamed is not None and (text or part.inline_data is not None):
            self._flush(out)
        if text is not None and part.inline_data is None:
            kind: LaneKind = "thinking" if part.thought else "text"
            if kind != self._kind or (
                signature and self._signature and signature != self._signature
            ):
                if not text and fidelity is None:
                    return  # an empty part neither continues nor starts a group
                self._open(kind, out)
            elif not text and fidelity is None:
                return
            if signature:
                self._signature = signature
            out.append(PartDelta(self._index, kind, text, fidelity))
            return
        data = part.inline_data
        if data is not None:
            media: LaneKind = "inline_thinking" if part.thought else "inline_data"
            index = self._whole(out)
            out.append(PartStart(index=index, kind=media, mime_type=data.mime_type))
            out.append(PartDelta(index, media, data.data, fidelity))
            out.append(PartStop(index, media))
        # executableCode, codeExecutionResult, fileData...: nothing to stream

    def _call(
        self, call: _FunctionCall, fidelity: dict[str, Any] | None, out: list[LaneEvent]
    ) -> None:
        """A `functionCall` part: a whole call, or the start, a piece or the end of a call whose
        arguments stream in (a part without a name goes on with the call streaming now)."""
        streamed = self._streamed
        if streamed is not None and not call.name:
            if streamed.fidelity is None:
                streamed.fidelity = fidelity
            if isinstance(call.args, dict):
                streamed.arguments.update(call.args)
            for partial in call.partial_args or ():
                streamed.apply(partial)
            if not call.will_continue:
                self._flush(out)
            return
        if streamed is not None:
            self._flush(out)  # another call began: the one before is complete
        if not call.name:
            raise MalformedFrameError("a function call without a name", str(call), provider=NAME)
        self._called = True
        if call.will_continue or call.partial_args:
            streamed = StreamedCall(call.name, call.id, fidelity, NAME, call.args)
            for partial in call.partial_args or ():
                streamed.apply(partial)
            self._streamed = streamed
            if not call.will_continue:
                self._flush(out)
            return
        args = call.args if call.args is not None else {}
        self._whole_call(call.name, call.id, args, fidelity, out)

    def _flush(self, out: list[LaneEvent]) -> None:
        """The call whose arguments streamed in is complete: one tool call with them all."""
        streamed = self._streamed
        assert streamed is not None
        self._streamed = None
        self._whole_call(
            streamed.name, streamed.call_id, streamed.arguments, streamed.fidelity, out
        )

    def _whole_call(
        self,
        name: str,
        call_id: str,
        args: Any,
        fidelity: dict[str, Any] | None,
        out: list[LaneEvent],
    ) -> None:
        call_id = call_id or self._ids.next(name)
        index = self._whole(out)
        out.append(PartStart(index=index, kind="tool_call", name=name, call_id=call_id))
        out.append(PartDelta(index, "tool_call", dumps_arguments(args), fidelity))
        out.append(PartStop(index, "tool_call"))

    def _open(self, kind: LaneKind, out: list[LaneEvent]) -> None:
        """Close the open text/thinking lane, if any, and open a new one of `kind`."""
        if self._kind is not None:
            out.append(PartStop(self._index, self._kind))
        self._index = self._count
        self._count += 1
        self._kind = kind
        self._signature = ""
        out.append(PartStart(index=self._index, kind=kind))

    def _whole(self, out: list[LaneEvent]) -> int:
        """Close the open text/thinking lane, if any; the index for a whole item's lane."""
        if self._kind is not None:
            out.append(PartStop(self._index, self._kind))
            self._kind = None
        index = self._count
        self._count += 1
        return index


def retry_delay(error: Any) -> float | None:
    """The wait an error object's `google.rpc.RetryInfo` detail asks for (`"37s"` -> 37.0)."""
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            delay = detail.get("retryDelay")
            if isinstance(delay, str) and delay.endswith("s"):
                try:
                    seconds = float(delay[:-1])
                except ValueError:
                    return None
                return seconds if seconds >= 0 else None
    return None
