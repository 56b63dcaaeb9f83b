"""Anthropic Messages API (`POST /v1/messages`), streaming SSE with named events.

One lane per content block, named by the block's index: `text`, `thinking` (its
`signature_delta` becomes an empty thinking fragment carrying `fidelity {"signature"}`),
`redacted_thinking` (thinking `"_REDACTED_THINKING"` with its opaque data as the signature), and
`tool_use` (a header fragment with the name and id, then `input_json_delta` fragments). `ping` is
a sign of life; `event: error` ends the stream with the typed error it names. Usage comes from
`message_start` and is overridden by a `message_delta` that repeats the input side: cached tokens
are `cache_read_input_tokens`, the prompt is `input_tokens + cache_creation_input_tokens`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec
from rillet._errors import MalformedFrameError, ProviderError
from rillet._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    Ping,
    ProviderErrorEvent,
    RawUsage,
)

from ._base import HttpRequest, Provider, error_from_body, strict_decode

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._request import TurnRequest
    from rillet.transports import SSEEvent

    from ._base import StreamDecoder

__all__ = ["AnthropicDialect"]

NAME = "anthropic"
REDACTED = "_REDACTED_THINKING"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": 63999}


# --- wire shapes ----------------------------------------------------------------------------------


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: dict[str, Any] | None = None


class _Block(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    data: str = ""
    id: str = ""
    name: str = ""
    input: Any = None


class _Delta(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    partial_json: str = ""


class _Message(msgspec.Struct, frozen=True):
    id: str = ""
    model: str = ""
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct, frozen=True, tag="message_start"):
    message: _Message


class _BlockStart(msgspec.Struct, frozen=True, tag="content_block_start"):
    index: int
    content_block: _Block


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
_decode_message = msgspec.json.Decoder(_Message)

# Events the API documents as ignorable additions; anything else unknown is a malformed frame.
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


def _usage(u: _Usage) -> RawUsage:
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
    )


_BLOCK_KINDS: dict[str, LaneKind] = {
    "text": "text",
    "thinking": "thinking",
    "redacted_thinking": "thinking",
    "tool_use": "tool_call",
}


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


class _StreamDecoder:
    """One attempt's Messages stream."""

    __slots__ = ("_kinds", "_quiet")

    def __init__(self) -> None:
        self._kinds: dict[int, LaneKind] = {}  # open block index -> its lane's kind
        self._quiet: set[int] = set()  # open blocks of types we do not stream

    def feed(self, frame: SSEEvent) -> list[LaneEvent]:
        if frame.event not in _KNOWN_EVENTS and frame.event != "message":
            raise MalformedFrameError(f"unknown event type {frame.event!r}", frame.data)
        try:  # the hot path: one call into msgspec; on error, strict_decode types it
            event = _decode_event.decode(frame.data)
        except msgspec.MsgspecError:
            event = strict_decode(_decode_event, frame.data, NAME)
        if type(event) is _BlockDelta:
            kind = self._kinds.get(event.index)
            delta = event.delta
            if kind is None:
                if event.index in self._quiet:
                    return []
                # a delta for a block that never started: the grammar refuses it as such
                return [PartDelta(event.index, "text", delta.text)]
            if delta.type == "text_delta":
                return [PartDelta(event.index, "text", delta.text)]
            if delta.type == "thinking_delta":
                return [PartDelta(event.index, "thinking", delta.thinking)]
            if delta.type == "signature_delta":
                return [PartDelta(event.index, "thinking", "", {"signature": delta.signature})]
            if delta.type == "input_json_delta":
                return [PartDelta(event.index, "tool_call", delta.partial_json)]
            return []  # citations and other additions
        if type(event) is _BlockStart:
            kind = _BLOCK_KINDS.get(event.content_block.type)
            if kind is not None:
                self._kinds[event.index] = kind
            else:
                self._quiet.add(event.index)
            return _block_lanes(event.index, event.content_block, whole=False)
        if type(event) is _BlockStop:
            kind = self._kinds.pop(event.index, None)
            self._quiet.discard(event.index)
            return [] if kind is None else [PartStop(event.index, kind)]
        if type(event) is _MessageStart:
            message = event.message
            out: list[LaneEvent] = [MessageStart(message.id, message.model)]
            if message.usage is not None:
                out.append(MessageDelta(usage=_usage(message.usage)))
            return out
        if type(event) is _MessageDelta:
            usage = _usage(event.usage) if event.usage is not None else None
            return [MessageDelta(finish_reason=event.delta.stop_reason, usage=usage)]
        if type(event) is _MessageStop:
            return [MessageStop()]
        if type(event) is _Ping:
            return [Ping()]
        assert type(event) is _Error
        return [
            ProviderErrorEvent(error_from_body(NAME, None, {"error": event.error}, in_stream=True))
        ]

    def close(self) -> list[LaneEvent]:
        return []


def _content(message: UniMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            blocks.append({"type": "text", "text": item.text})
        elif type(item) is ThinkingDone:
            signature = (item.fidelity or {}).get("signature", "")
            if item.thinking == REDACTED:
                blocks.append({"type": "redacted_thinking", "data": signature})
            else:
                blocks.append(
                    {"type": "thinking", "thinking": item.thinking, "signature": signature}
                )
        elif type(item) is ToolCallDone:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": item.tool_call_id,
                    "name": item.name,
                    "input": item.arguments,
                }
            )
        elif type(item) is ToolResultDone:
            content: list[dict[str, Any]] = [{"type": "text", "text": item.text}]
            content.extend(_image(url) for url in item.images or ())
            blocks.append(
                {"type": "tool_result", "tool_use_id": item.tool_call_id, "content": content}
            )
        elif type(item) is ImageUrlDone:
            blocks.append(_image(item.image_url))
    return blocks


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";")[0]
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


class AnthropicDialect:
    """Anthropic's Messages API."""

    name = NAME
    framing: Literal["sse"] = "sse"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/v1/messages` with `x-api-key` and `anthropic-version`."""
        body: dict[str, Any] = {
            "model": provider.model,
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": [{"role": m.role, "content": _content(m)} for m in request.messages],
        }
        if request.system_prompt:
            body["system"] = request.system_prompt
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters or {"type": "object", "properties": {}},
                }
                for t in request.tools
            ]
        choice = request.tool_choice
        if choice == "auto":
            body["tool_choice"] = {"type": "auto"}
        elif choice == "required":
            body["tool_choice"] = {"type": "any"}
        elif choice == "none":
            body["tool_choice"] = {"type": "none"}
        elif isinstance(choice, list) and choice:
            body["tool_choice"] = {"type": "tool", "name": choice[0]}
        level = request.thinking_level
        if level is not None and level != "none":
            budget = min(_BUDGETS[level], max(1024, body["max_tokens"] - 1))
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["stream"] = stream  # explicit either way: a non-streaming request says so
        body.update(request.extra_body.get(NAME, {}))
        headers = {
            "content-type": "application/json",
            "anthropic-version": API_VERSION,
            **provider.headers,
        }
        if provider.api_key is not None:
            headers["x-api-key"] = provider.api_key.reveal()
        return HttpRequest(
            url=provider.url("/v1/messages"), headers=headers, body=msgspec.json.encode(body)
        )

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's events."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming Message as the stream the API would have sent."""
        message = strict_decode(_decode_message, body, NAME)
        out: list[LaneEvent] = [MessageStart(message.id, message.model)]
        for index, block in enumerate(message.content):
            out.extend(_block_lanes(index, block, whole=True))
        out.append(
            MessageDelta(
                finish_reason=message.stop_reason,
                usage=_usage(message.usage) if message.usage is not None else None,
            )
        )
        out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"type": "error", "error": {"type", "message"}}` typed by its error type."""
        return error_from_body(NAME, status, body)
