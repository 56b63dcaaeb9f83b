"""OpenAI Responses' stream, sans-I/O: the wire shapes of its events and the decoder that turns
them (or one non-streaming body) into lane events. The request side is `_dialect`."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartRun,
    PartStart,
    Ping,
    ProviderErrorEvent,
    RawUsage,
)

from ..._core._dialect import (
    answer_tokens,
    sse_event,
    sse_text,
    strict_decode,
    uncached_tokens,
)
from .._error_body import error_from_body
from ._items import (
    NAME,
    close_item,
    decode_item,
    decode_type,
    holds_refusal,
    is_call,
    open_item,
)

if TYPE_CHECKING:
    from rillet._core._sse import SSEEvent


__all__ = ["NAME"]

# --- wire shapes ----------------------------------------------------------------------------------


class _InputDetails(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int | None = None


class _OutputDetails(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, frozen=True, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _IncompleteDetails(msgspec.Struct, frozen=True, gc=False):
    reason: str | None = None


class ResponseBody(msgspec.Struct, frozen=True):
    id: str = ""
    model: str = ""
    status: str | None = None
    output: list[msgspec.Raw] = []  # each item decoded only if it is of a type we read
    usage: _Usage | None = None
    incomplete_details: _IncompleteDetails | None = None
    error: Any = None


class _Created(msgspec.Struct, frozen=True, tag="response.created"):
    response: ResponseBody
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _ItemAdded(msgspec.Struct, frozen=True, tag="response.output_item.added"):
    output_index: int
    item: msgspec.Raw
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _ItemDone(msgspec.Struct, frozen=True, tag="response.output_item.done"):
    output_index: int
    item: msgspec.Raw
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _TextDelta(msgspec.Struct, frozen=True, gc=False, tag="response.output_text.delta"):
    output_index: int
    delta: str
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _TextDone(msgspec.Struct, frozen=True, gc=False, tag="response.output_text.done"):
    """Read only when its item and deltas never came; its fields are read loosely, so an event
    the stream has no need of never fails it."""

    output_index: Any = None
    content_index: Any = None
    text: Any = None
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _SummaryDelta(
    msgspec.Struct, frozen=True, gc=False, tag="response.reasoning_summary_text.delta"
):
    output_index: int
    delta: str
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _ReasoningDelta(msgspec.Struct, frozen=True, gc=False, tag="response.reasoning_text.delta"):
    output_index: int
    delta: str
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _RefusalDelta(msgspec.Struct, frozen=True, gc=False, tag="response.refusal.delta"):
    """A fragment of the words of a model that refuses, in a message item: its text."""

    output_index: int
    delta: str
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _ArgumentsDelta(
    msgspec.Struct, frozen=True, gc=False, tag="response.function_call_arguments.delta"
):
    output_index: int
    delta: str
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _Completed(msgspec.Struct, frozen=True, tag="response.completed"):
    response: ResponseBody
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _Incomplete(msgspec.Struct, frozen=True, tag="response.incomplete"):
    response: ResponseBody
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _Failed(msgspec.Struct, frozen=True, tag="response.failed"):
    response: ResponseBody
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


class _Error(msgspec.Struct, frozen=True, tag="error"):
    code: Any = None
    message: str | None = None
    error: Any = None
    sequence_number: Any = -1  # its place in the stream (`resume_point`)


_HANDLED: tuple[type[msgspec.Struct], ...] = (
    _Created,
    _ItemAdded,
    _ItemDone,
    _TextDelta,
    _TextDone,
    _SummaryDelta,
    _ReasoningDelta,
    _RefusalDelta,
    _ArgumentsDelta,
    _Completed,
    _Incomplete,
    _Failed,
    _Error,
)
_decode_event: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
    functools.reduce(operator.or_, _HANDLED)
)
decode_response_body = msgspec.json.Decoder(ResponseBody)
# The event types we read; every other one (documented events that carry nothing we stream,
# hosted-tool progress, types added later) is skipped by its name, without decoding its data.
_HANDLED_TYPES = frozenset(str(t.__struct_config__.tag) for t in _HANDLED)
_TERMINAL = (_Completed, _Incomplete, _Failed, _Error)
# The deltas by event name, and by decoded type with their lane's kind: nearly every frame of a
# stream is one, so `feed_frames` reads them inline
_DELTA_NAMES = frozenset(
    str(t.__struct_config__.tag)
    for t in (_TextDelta, _SummaryDelta, _ReasoningDelta, _ArgumentsDelta)
)
_DELTA_KINDS: dict[type[msgspec.Struct], LaneKind] = {
    _TextDelta: "text",
    _SummaryDelta: "thinking",
    _ReasoningDelta: "thinking",
    _ArgumentsDelta: "tool_call",
}


def _usage(u: _Usage) -> RawUsage:
    cached = u.input_tokens_details.cached_tokens if u.input_tokens_details is not None else None
    reasoning = None
    if u.output_tokens_details is not None:
        reasoning = u.output_tokens_details.reasoning_tokens
    prompt = uncached_tokens(u.input_tokens, cached, u.output_tokens, u.total_tokens)
    response = answer_tokens(u.output_tokens, reasoning, u.total_tokens, u.input_tokens)
    return RawUsage(
        cached_tokens=cached,
        prompt_tokens=prompt,
        thoughts_tokens=reasoning,
        response_tokens=response,
    )


def _error_event(error: Any, in_stream: bool = True) -> ProviderErrorEvent:
    return ProviderErrorEvent(
        error_from_body(NAME, None, {"error": error or {}}, in_stream=in_stream)
    )


def finish_events(
    response: ResponseBody, status: str | None, tool_seen: bool, refused: bool
) -> list[LaneEvent]:
    """The end of a reply: its terminal status (`completed`, `incomplete`, `failed`) and the
    final Response object's usage. A completed reply that refused ends as `refusal`: the
    provider's rules stopped the answer."""
    reason: str | None = None
    if status == "completed":
        tool_seen = tool_seen or any(is_call(raw) for raw in response.output)
        reason = "tool_call" if tool_seen else "refusal" if refused else "completed"
    elif status == "incomplete":
        details = response.incomplete_details
        reason = (details.reason if details is not None else None) or "incomplete"
    elif status == "failed" or response.error:
        return [_error_event(response.error)]
    usage = _usage(response.usage) if response.usage is not None else None
    return [MessageDelta(finish_reason=reason, usage=usage), MessageStop()]


class ResponsesStreamDecoder:
    """One attempt's Responses events."""

    __slots__ = (
        "_done",
        "_items_seen",
        "_kinds",
        "_lone",
        "_orphans",
        "_refused",
        "_streamed",
        "_tool_seen",
        "failed_at",
        "response_id",
        "sequence",
    )

    def __init__(self) -> None:
        self._kinds: dict[int, LaneKind] = {}  # open output_index -> its lane's kind
        self._streamed: set[int] = set()  # output indexes a delta came for
        # output index -> the parts (content indexes) whose text came in a done alone
        self._lone: dict[int, set[Any]] = {}
        # output index -> the arguments of a call whose item never said it began: its name
        # comes with its item (`output_item.done`, or the final output)
        self._orphans: dict[int, list[str]] = {}
        self._tool_seen = False
        self._refused = False  # a refusal came: the model declined
        self._items_seen = False  # an item or a delta came: the output was streamed
        self._done = False  # a terminal event came: nothing after it is read
        self.failed_at = 0  # the frame `feed_frames` failed on
        self.response_id = ""  # the response's id, once `response.created` said it
        self.sequence = -1  # the last event read's `sequence_number` (`resume_point`)

    def resume_point(self) -> tuple[str, int] | None:
        """Where a broken stream of this response resumes: its id and the number of the last
        event read (every event after it is still to come), once both are known."""
        if not self.response_id or self.sequence < 0:
            return None
        return self.response_id, self.sequence

    sse_bytes = True  # an event may come as its data's bytes (`FramesDecoder`)

    def feed(self, frame: SSEEvent | bytes | tuple[str, bytes]) -> list[LaneEvent]:
        if self._done:
            return []  # OpenRouter's `[DONE]` after `response.completed`, and anything else
        name, raw = sse_event(frame)
        if name not in _HANDLED_TYPES and name != "message":
            return []  # an event we do not read, known or not: skipped by its name alone
        # as text, as an `SSEEvent` holds it: the items in it are decoded later (`msgspec.Raw`),
        # and bytes that are not UTF-8 must reach them replaced (`feed_frames` reads the
        # deltas, which hold no such part, from the bytes)
        data = sse_text(raw)
        try:
            event = _decode_event.decode(data)
        except msgspec.MsgspecError:
            if name == "message" and self._unread(data):
                return []  # an unnamed frame of a type we do not read
            event = strict_decode(_decode_event, data, NAME)  # types the error
        kind = type(event)
        seq = event.sequence_number
        if type(seq) is int and seq > self.sequence:
            self.sequence = seq
        if kind is _TextDelta:
            self._streamed.add(event.output_index)
            return [
                *self._unopened(event.output_index, "text"),
                PartDelta(event.output_index, "text", event.delta),
            ]
        if kind is _ArgumentsDelta:
            if event.output_index not in self._kinds:
                return self._orphan(event.output_index, event.delta)
            self._streamed.add(event.output_index)
            return [PartDelta(event.output_index, "tool_call", event.delta)]
        if kind is _RefusalDelta:  # the words of a model that declines are the answer's text
            self._refused = True
            self._streamed.add(event.output_index)
            return [
                *self._unopened(event.output_index, "text"),
                PartDelta(event.output_index, "text", event.delta),
            ]
        if kind is _SummaryDelta or kind is _ReasoningDelta:
            # summary parts are joined as they come, nothing inserted between them
            self._streamed.add(event.output_index)
            opened = self._unopened(event.output_index, "thinking")
            return [*opened, PartDelta(event.output_index, "thinking", event.delta)]
        if kind is _ItemAdded:
            self._items_seen = True
            out: list[LaneEvent] = []
            item = decode_item(event.item)
            lane = None if item is None else open_item(event.output_index, item, out)
            if lane is not None:
                self._kinds[event.output_index] = lane
                self._tool_seen = self._tool_seen or lane == "tool_call"
                early = self._orphans.pop(event.output_index, None)
                if early is not None and lane == "tool_call":  # its arguments came before it
                    self._streamed.add(event.output_index)
                    out.append(PartDelta(event.output_index, lane, "".join(early)))
            return out
        if kind is _ItemDone:
            self._items_seen = True
            return self._item_done(event)
        if kind is _TextDone:
            index, text = event.output_index, event.text
            if type(index) is not int or type(text) is not str or not text:
                return []  # of no use, whatever it holds
            parts = self._lone.get(index)
            if parts is not None:  # another part of a message whose parts come so
                if event.content_index in parts:
                    return []  # that part again (or parts that say not which they are)
                parts.add(event.content_index)
                return [PartDelta(index, "text", text)]  # parts joined as an item's are
            if index in self._kinds or index in self._streamed:
                return []  # its deltas carried it, or its item's end will
            # a text whose item and deltas never came (a gateway that sends the done alone)
            self._streamed.add(index)
            self._lone[index] = {event.content_index}
            return [*self._unopened(index, "text"), PartDelta(index, "text", text)]
        if kind is _Created:
            self.response_id = event.response.id
            return [MessageStart(event.response.id, event.response.model)]
        self._done = kind in _TERMINAL
        if kind is _Completed or kind is _Incomplete:
            # a stream of nothing but its ends (a server or proxy that does not stream the
            # output) still holds the reply: the final Response's items, each whole
            if self._items_seen or self._streamed:
                whole = self._claimed(event.response)
            else:
                whole = self._whole(event.response)
            status = "completed" if kind is _Completed else "incomplete"
            return whole + finish_events(event.response, status, self._tool_seen, self._refused)
        if kind is _Failed:
            return finish_events(event.response, "failed", self._tool_seen, self._refused)
        assert kind is _Error
        return [
            _error_event(
                event.error if event.error else {"code": event.code, "message": event.message}
            )
        ]

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each frame in turn, with its fast path for deltas inline (`FramesDecoder`)."""
        if not self._done:  # else nothing is read, as in `feed`
            self._frames(frames, out)

    def _frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed_frames` before any terminal event: it returns at the first one, so the deltas
        need no check of `_done`."""
        decode = _decode_event.decode
        names = _DELTA_NAMES
        kinds = _DELTA_KINDS
        streamed = self._streamed
        append = out.append
        last = -1  # the output index last added to `_streamed`, while no other frame came
        # the run of fragments being handed on (`PartRun`): of output `last`, kind `run_kind`
        run: list[str] | None = None
        run_kind: LaneKind = "text"
        at = 0
        try:
            for at, frame in enumerate(frames):  # noqa: B007 - `at` names the failing frame
                if type(frame) is tuple:
                    name, data = frame
                elif type(frame) is bytes:
                    name, data = "message", frame
                else:
                    name, data = frame.event, frame.data
                if name in names:
                    try:
                        event = decode(data)
                    except msgspec.MsgspecError:  # as `feed` reads it: text, its error typed
                        event = strict_decode(_decode_event, sse_text(data), NAME)
                    kind = type(event)
                    lane = "text" if kind is _TextDelta else kinds.get(kind)
                    if lane is not None:
                        seq = event.sequence_number
                        if type(seq) is int and seq > self.sequence:
                            self.sequence = seq
                        index = event.output_index
                        if index != last:
                            if lane == "tool_call" and index not in self._kinds:
                                run = None  # a call whose item never began (`_orphan`)
                                out += self._orphan(index, event.delta)
                                last = -1
                                continue
                            streamed.add(index)
                            last = index
                            run = None
                            out += self._unopened(index, lane)
                        if run is None or lane != run_kind:
                            run, run_kind = [], lane
                            append(PartRun(index, lane, run))
                        run.append(event.delta)
                        continue
                # any other frame (or a delta's name on another event's data): as `feed` does
                run = None
                out += self.feed(frame)
                if self._done:
                    return  # nothing after a terminal event is read
                last = -1  # `_streamed` may have changed
        except BaseException:
            self.failed_at = at
            raise

    def _unopened(self, index: int, lane: LaneKind) -> list[LaneEvent]:
        """The start of a text or thinking lane for a delta whose item never said it began (a
        gateway that sends deltas without `output_item.added`, as LiteLLM's did): the delta's
        kind names the item's. Nothing for an open lane, or for arguments (a call needs the
        name its item would have given)."""
        if index in self._kinds or lane == "tool_call":
            return []
        self._kinds[index] = lane
        self._items_seen = True
        return [PartStart(index=index, kind=lane)]

    @staticmethod
    def _unread(data: str) -> bool:
        """Whether an unnamed frame that did not decode is of a type we do not read (or the
        `[DONE]` some servers add), so it is skipped rather than an error."""
        if data == "[DONE]":
            return True
        try:
            head = decode_type.decode(data)
        except msgspec.MsgspecError:
            return False
        return head.type not in _HANDLED_TYPES

    def _item_done(self, event: _ItemDone) -> list[LaneEvent]:
        index = event.output_index
        out: list[LaneEvent] = []
        item = decode_item(event.item)
        if item is None:
            return out  # a hosted tool's item...: nothing we stream
        lane = self._kinds.pop(index, None)
        self._lone.pop(index, None)
        self._orphans.pop(index, None)  # its item holds its arguments whole
        if lane is None:  # a done item whose added event never came: the whole item now
            lane = open_item(index, item, out)
            if lane is None:
                return out
            self._tool_seen = self._tool_seen or lane == "tool_call"
        streamed = index in self._streamed
        self._streamed.discard(index)
        self._refused = self._refused or holds_refusal(item)
        close_item(index, lane, item, streamed=streamed, out=out)
        return out

    def _orphan(self, index: int, delta: str) -> list[LaneEvent]:
        """Arguments for a call whose item never said it began (a gateway that skips
        `output_item.added`): kept until its item, which names the call, comes; a sign of life
        meanwhile."""
        self._orphans.setdefault(index, []).append(delta)
        return [Ping()]

    def _claimed(self, response: ResponseBody) -> list[LaneEvent]:
        """At the end, the calls whose arguments came without their item: each whole from the
        final output, where it is; else its arguments alone, which the grammar refuses (a call
        with no name)."""
        out: list[LaneEvent] = []
        for index, arguments in sorted(self._orphans.items()):
            raw = response.output[index] if 0 <= index < len(response.output) else None
            item = None if raw is None else decode_item(raw)
            if item is not None and item.type == "function_call":
                self._tool_seen = True
                open_item(index, item, out)
                close_item(index, "tool_call", item, streamed=False, out=out)
            else:
                out.append(PartDelta(index, "tool_call", "".join(arguments)))
        self._orphans.clear()
        return out

    def _whole(self, response: ResponseBody) -> list[LaneEvent]:
        """A final Response's output items, each opened and closed whole (the calls whose
        arguments came without their item among them, if they are)."""
        out: list[LaneEvent] = []
        for index, raw in enumerate(response.output):
            item = decode_item(raw)
            lane = None if item is None else open_item(index, item, out)
            if item is not None and lane is not None:
                self._tool_seen = self._tool_seen or lane == "tool_call"
                self._refused = self._refused or holds_refusal(item)
                close_item(index, lane, item, streamed=False, out=out)
                if lane == "tool_call":
                    self._orphans.pop(index, None)
        return out + self._claimed(response)

    def close(self) -> list[LaneEvent]:
        return []
