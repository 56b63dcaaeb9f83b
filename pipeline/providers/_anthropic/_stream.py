"""Anthropic's Messages stream, sans-I/O: the wire shapes of its events and the decoder that turns
them (or one non-streaming body) into lane events. The request side is `_dialect`."""

from __future__ import annotations

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
    PartStop,
    Ping,
    ProviderErrorEvent,
    RawUsage,
)

from ..._core._dialect import sse_event, sse_text, strict_decode
from .._error_body import error_from_body

if TYPE_CHECKING:
    from rillet._core._sse import SSEEvent


__all__ = ["BLOCK", "NAME", "REDACTED"]

NAME = "anthropic"
REDACTED = "_REDACTED_THINKING"

# --- wire shapes ----------------------------------------------------------------------------------


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: dict[str, Any] | None = None


class _Type(msgspec.Struct, frozen=True, gc=False):
    """Only the `type` of a block or delta: what decides whether the rest is read."""

    type: str = ""


class _Head(msgspec.Struct, frozen=True, gc=False):
    """Only the types of an event that did not decode: its own, and its delta's."""

    type: str = ""
    delta: _Type | None = None


class _Block(msgspec.Struct, frozen=True):
    """A block of a type we stream (`text`, `thinking`, `redacted_thinking`, `tool_use`)."""

    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    data: str = ""
    id: str = ""
    name: str = ""
    input: Any = None
    citations: list[Any] | None = None


class _TextDelta(msgspec.Struct, frozen=True, gc=False, tag="text_delta"):
    text: str


class _ThinkingDelta(msgspec.Struct, frozen=True, gc=False, tag="thinking_delta"):
    thinking: str


class _SignatureDelta(msgspec.Struct, frozen=True, gc=False, tag="signature_delta"):
    signature: str


class _JsonDelta(msgspec.Struct, frozen=True, gc=False, tag="input_json_delta"):
    partial_json: str


class _CitationsDelta(msgspec.Struct, frozen=True, tag="citations_delta"):
    citation: Any


_Delta = _TextDelta | _ThinkingDelta | _SignatureDelta | _JsonDelta | _CitationsDelta
_DELTA_TYPES = frozenset(
    {"text_delta", "thinking_delta", "signature_delta", "input_json_delta", "citations_delta"}
)


class _Message(msgspec.Struct, frozen=True):
    id: str = ""
    model: str = ""
    content: list[msgspec.Raw] = []  # each block decoded only if it is of a type we read
    stop_reason: str | None = None
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct, frozen=True, tag="message_start"):
    message: _Message


class _BlockStart(msgspec.Struct, frozen=True, tag="content_block_start"):
    index: int
    content_block: msgspec.Raw


class _BlockDelta(msgspec.Struct, frozen=True, tag="content_block_delta"):
    index: int
    delta: _Delta


class _BlockStop(msgspec.Struct, frozen=True, tag="content_block_stop"):
    index: int


class _MessageDeltaBody(msgspec.Struct, frozen=True):
    stop_reason: str | None = None


class _MessageDelta(msgspec.Struct, frozen=True, tag="message_delta"):
    delta: _MessageDeltaBody = _MessageDeltaBody()
    usage: _Usage | None = None


class _MessageStop(msgspec.Struct, frozen=True, tag="message_stop"):
    pass


class _Ping(msgspec.Struct, frozen=True, tag="ping"):
    pass


class _Error(msgspec.Struct, frozen=True, tag="error"):
    error: dict[str, Any] = {}


_Event = (
    _MessageStart | _BlockStart | _BlockDelta | _BlockStop | _MessageDelta | _MessageStop | _Ping
) | _Error
_decode_event = msgspec.json.Decoder(_Event)
decode_message = msgspec.json.Decoder(_Message)
_decode_block = msgspec.json.Decoder(_Block)
_decode_type = msgspec.json.Decoder(_Type)
_decode_head = msgspec.json.Decoder(_Head)
_decode_any = msgspec.json.Decoder()

# The event types we read; every other one is skipped by its name, without decoding its data
# (Anthropic's versioning policy: new event types may appear in a stream).
_KNOWN_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)


def _kept(block_type: str) -> bool:
    """Whether a block of this type is kept whole for the round trip: server tools' calls and
    results (`server_tool_use`, `web_search_tool_result`, `mcp_tool_use`, `mcp_tool_result`,
    `code_execution_tool_result`...), which must be sent back for a paused turn to go on."""
    return block_type in ("server_tool_use", "mcp_tool_use") or block_type.endswith("_tool_result")


def raw_usage(u: _Usage) -> RawUsage:
    thinking = None
    if u.output_tokens_details is not None:
        value = u.output_tokens_details.get("thinking_tokens")
        thinking = value if isinstance(value, int) else None
    prompt = None
    if u.input_tokens is not None:
        prompt = u.input_tokens + (u.cache_creation_input_tokens or 0)
    response = None
    if u.output_tokens is not None:
        response = u.output_tokens - (thinking or 0)
    return RawUsage(
        cached_tokens=u.cache_read_input_tokens,
        prompt_tokens=prompt,
        thoughts_tokens=thinking,
        response_tokens=response,
        cache_write_tokens=u.cache_creation_input_tokens,
    )


_BLOCK_KINDS: dict[str, LaneKind] = {
    "text": "text",
    "thinking": "thinking",
    "redacted_thinking": "thinking",
    "tool_use": "tool_call",
}
BLOCK = "block"
"""The fidelity key of a kept server-tool block: the block's JSON, echoed as is when the message
goes back to Anthropic."""


def _kept_lanes(index: int, block: Any) -> list[LaneEvent]:
    """A kept block as an empty text item carrying the whole block as its fidelity."""
    return [
        PartStart(index=index, kind="text"),
        PartDelta(index, "text", "", {BLOCK: block}),
        PartStop(index, "text"),
    ]


def whole_block(index: int, raw: msgspec.Raw) -> list[LaneEvent]:
    """A block of a non-streaming body: its lanes, kept whole, or nothing for another type."""
    head: _Type = strict_decode(_decode_type, raw, NAME)
    if head.type in _BLOCK_KINDS:
        return _block_lanes(index, strict_decode(_decode_block, raw, NAME), whole=True)
    if _kept(head.type):
        return _kept_lanes(index, strict_decode(_decode_any, raw, NAME))
    return []


def _block_lanes(index: int, block: _Block, *, whole: bool) -> list[LaneEvent]:
    """The lane events that open a block (and, for a whole block, carry it and close it).
    Blocks of other types (server tools' results...) carry nothing we stream: no lane."""
    kind = _BLOCK_KINDS.get(block.type)
    if kind is None:
        return []
    if block.type == "text":
        out: list[LaneEvent] = [PartStart(index=index, kind="text")]
        if block.text:
            out.append(PartDelta(index, "text", block.text))
        if whole and block.citations:
            out.append(PartDelta(index, "text", "", {"citations": block.citations}))
    elif block.type == "thinking":
        out = [PartStart(index=index, kind="thinking")]
        if block.thinking:
            out.append(PartDelta(index, "thinking", block.thinking))
        if block.signature:
            out.append(PartDelta(index, "thinking", "", {"signature": block.signature}))
    elif block.type == "redacted_thinking":
        out = [
            PartStart(index=index, kind="thinking"),
            PartDelta(index, "thinking", REDACTED, {"signature": block.data}),
        ]
    else:
        out = [
            PartStart(index=index, kind="tool_call", name=block.name, call_id=block.id),
            PartDelta(index, "tool_call", ""),
        ]
        if whole and block.input is not None:
            out.append(
                PartDelta(index, "tool_call", msgspec.json.encode(block.input).decode("utf-8"))
            )
    if whole:
        out.append(PartStop(index, kind))
    return out


class _Kept:
    """A server-tool block being streamed: the block as it started, and its input's JSON."""

    __slots__ = ("block", "json")

    def __init__(self, block: Any) -> None:
        self.block = block
        self.json: list[str] = []


class AnthropicStreamDecoder:
    """One attempt's Messages stream."""

    __slots__ = ("_citations", "_done", "_inputs", "_kept", "_kinds", "_quiet", "failed_at")

    def __init__(self) -> None:
        self._kinds: dict[int, LaneKind] = {}  # open block index -> its lane's kind
        self._quiet: set[int] = set()  # open blocks of types we skip
        self._kept: dict[int, _Kept] = {}  # open server-tool blocks, kept whole
        self._citations: dict[int, list[Any]] = {}  # citations of open text blocks
        # tool calls that started with their input whole (as a server of the same API may
        # send it; Anthropic's is `{}`), as JSON: theirs unless input deltas come, as the SDK
        # reads them
        self._inputs: dict[int, str] = {}
        self._done = False  # `message_stop` (or an error) came: nothing after it is read
        self.failed_at = 0  # the frame `feed_frames` failed on

    sse_bytes = True  # an event may come as its data's bytes (`FramesDecoder`)

    def feed(self, frame: SSEEvent | bytes | tuple[str, bytes]) -> list[LaneEvent]:
        if self._done:
            return []
        name, raw = sse_event(frame)
        if name not in _KNOWN_EVENTS and name != "message":
            return []  # an event type added later: skipped by its name alone
        # as text, as an `SSEEvent` holds it: the blocks in it are decoded later (`msgspec.Raw`),
        # and bytes that are not UTF-8 must reach them replaced (`feed_frames` reads the
        # deltas, which hold no such part, from the bytes)
        data = sse_text(raw)
        try:
            event = _decode_event.decode(data)
        except msgspec.MsgspecError:
            if _skipped(name, data):
                return []
            event = strict_decode(_decode_event, data, NAME)  # types the error
        if type(event) is _BlockDelta:
            return self._delta(event.index, event.delta)
        if type(event) is _BlockStart:
            return self._start(event.index, event.content_block)
        if type(event) is _BlockStop:
            return self._stop(event.index)
        if type(event) is _MessageStart:
            message = event.message
            out: list[LaneEvent] = [MessageStart(message.id, message.model)]
            # a message may start with blocks already in it (a client tool called from code
            # execution: the whole `tool_use` there, its stop reason too, then `message_stop`):
            # each is read whole, as in a non-streaming body
            for index, raw in enumerate(message.content):
                out += whole_block(index, raw)
            if message.usage is not None or message.stop_reason is not None:
                usage = raw_usage(message.usage) if message.usage is not None else None
                out.append(MessageDelta(finish_reason=message.stop_reason, usage=usage))
            return out
        if type(event) is _MessageDelta:
            usage = raw_usage(event.usage) if event.usage is not None else None
            return [MessageDelta(finish_reason=event.delta.stop_reason, usage=usage)]
        if type(event) is _MessageStop:
            self._done = True
            return [MessageStop()]
        if type(event) is _Ping:
            return [Ping()]
        assert type(event) is _Error
        self._done = True
        return [
            ProviderErrorEvent(error_from_body(NAME, None, {"error": event.error}, in_stream=True))
        ]

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each frame in turn, with its fast path inline (`FramesDecoder`): a text,
        thinking or tool-input delta for an open block."""
        decode = _decode_event.decode
        kinds = self._kinds
        append = out.append
        # the run of fragments being handed on (`PartRun`), and its lane
        run: list[str] | None = None
        run_index = -1
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
                if name == "content_block_delta" and not self._done:
                    try:
                        event = decode(data)
                    except msgspec.MsgspecError:
                        event = None  # `feed` decodes it again: skipped, or the error typed
                    if type(event) is _BlockDelta:
                        index = event.index
                        delta = event.delta
                        if index in kinds:
                            # the delta's type names the lane's kind, as in `_delta`
                            kind: LaneKind | None
                            if type(delta) is _TextDelta:
                                kind, value = "text", delta.text
                            elif type(delta) is _ThinkingDelta:
                                kind, value = "thinking", delta.thinking
                            elif type(delta) is _JsonDelta:
                                kind, value = "tool_call", delta.partial_json
                                if value and self._inputs:
                                    self._inputs.pop(index, None)  # the deltas are its input
                            else:
                                kind = None
                            if kind is not None:
                                if run is None or index != run_index or kind != run_kind:
                                    run, run_index, run_kind = [], index, kind
                                    append(PartRun(index, kind, run))
                                run.append(value)
                                continue
                        run = None
                        out += self._delta(index, delta)
                        continue
                run = None
                out += self.feed(frame)
        except BaseException:
            self.failed_at = at
            raise

    def _delta(self, index: int, delta: _Delta) -> list[LaneEvent]:
        kind = self._kinds.get(index)
        if kind is None:
            kept = self._kept.get(index)
            if kept is not None:
                if type(delta) is _JsonDelta:
                    kept.json.append(delta.partial_json)
                return []
            if index in self._quiet:
                return []
            # a delta for a block that never started: the grammar refuses it as such
            return [PartDelta(index, "text", getattr(delta, "text", ""))]
        if type(delta) is _TextDelta:
            return [PartDelta(index, "text", delta.text)]
        if type(delta) is _ThinkingDelta:
            return [PartDelta(index, "thinking", delta.thinking)]
        if type(delta) is _SignatureDelta:
            return [PartDelta(index, "thinking", "", {"signature": delta.signature})]
        if type(delta) is _JsonDelta:
            if delta.partial_json:
                self._inputs.pop(index, None)  # the deltas are its input
            return [PartDelta(index, "tool_call", delta.partial_json)]
        assert type(delta) is _CitationsDelta
        if kind == "text":
            self._citations.setdefault(index, []).append(delta.citation)
        return []

    def _start(self, index: int, raw: msgspec.Raw) -> list[LaneEvent]:
        head: _Type = strict_decode(_decode_type, raw, NAME)
        kind = _BLOCK_KINDS.get(head.type)
        if kind is not None:
            self._kinds[index] = kind
            block = strict_decode(_decode_block, raw, NAME)
            if kind == "tool_call" and block.input:
                self._inputs[index] = msgspec.json.encode(block.input).decode("utf-8")
            return _block_lanes(index, block, whole=False)
        if _kept(head.type):
            self._kept[index] = _Kept(strict_decode(_decode_any, raw, NAME))
        else:
            self._quiet.add(index)  # a block type added later: skipped whole
        return []

    def _stop(self, index: int) -> list[LaneEvent]:
        kind = self._kinds.pop(index, None)
        if kind is not None:
            given = self._inputs.pop(index, None)
            if given is not None:  # no delta said otherwise: the input it started with
                return [PartDelta(index, "tool_call", given), PartStop(index, kind)]
            citations = self._citations.pop(index, None)
            if citations:
                return [
                    PartDelta(index, "text", "", {"citations": citations}),
                    PartStop(index, kind),
                ]
            return [PartStop(index, kind)]
        kept = self._kept.pop(index, None)
        if kept is not None:
            block = kept.block
            if kept.json and isinstance(block, dict):
                joined = "".join(kept.json)
                block["input"] = strict_decode(_decode_any, joined or "{}", NAME)
            return _kept_lanes(index, block)
        self._quiet.discard(index)
        return []

    def close(self) -> list[LaneEvent]:
        return []


def _skipped(name: str, data: str) -> bool:
    """Whether a frame that did not decode is one we skip rather than a known event of the wrong
    shape: an unnamed frame of an event type we do not read, or a delta of a delta type we do
    not read (types added later)."""
    try:
        head = _decode_head.decode(data)
    except msgspec.MsgspecError:
        return False
    if head.type not in _KNOWN_EVENTS:
        return name == "message"
    delta = head.delta
    return (
        head.type == "content_block_delta"
        and delta is not None
        and (delta.type not in _DELTA_TYPES)
    )
