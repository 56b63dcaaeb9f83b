"""Anthropic Messages API (`POST /v1/messages`), streaming SSE with named events.
This module builds the requests and reads the body; `_stream` decodes the events.

One lane per content block, named by the block's index: `text`, `thinking` (its
`signature_delta` becomes an empty thinking fragment carrying `fidelity {"signature"}`),
`redacted_thinking` (thinking `"_REDACTED_THINKING"` with its opaque data as the signature), and
`tool_use` (a header fragment with the name and id, then `input_json_delta` fragments). `ping` is
a sign of life; `event: error` ends the stream with the typed error it names. Usage comes from
`message_start` and is overridden by a `message_delta` that repeats the input side: cached tokens
are `cache_read_input_tokens`, the prompt is `input_tokens + cache_creation_input_tokens` (as
MMSP counts it), and the written share is kept apart too (`cache_write_tokens`), to be priced
as written.

Server tools' blocks (`server_tool_use`, `mcp_tool_use` and every `*_tool_result`) must go back
unchanged for a turn Anthropic paused (`pause_turn`, which finishes `unknown`: neither done nor
cut by a limit) to go on, so each is kept whole: an empty text item whose fidelity
`{"block": <the block's JSON>}` is echoed as the block itself when the message is sent back (a
streamed `server_tool_use` gets its `input` from its `input_json_delta`s). A text block's
`citations_delta`s ride as `fidelity {"citations": [...]}` on an empty fragment at its end, and
go back as the block's `citations`.

Types added later are skipped, never an error: events by their `event:` name without decoding
their data (an unnamed frame by a peek at its `type`), blocks whole (their deltas with them), and
deltas of other types. A known event whose fields have the wrong shape is a
`MalformedFrameError`. Nothing after `message_stop` (or `error`) is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec
from rillet._core._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._core._lanes import (
    LaneEvent,
    MessageDelta,
    MessageStart,
    MessageStop,
)

from ..._core._dialect import HttpRequest, Provider, strict_decode
from .._error_body import error_from_body

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._errors import ProviderError
    from rillet._core._request import TurnRequest

    from ..._core._dialect import StreamDecoder

from ._stream import (
    BLOCK,
    NAME,
    REDACTED,
    AnthropicStreamDecoder,
    decode_message,
    raw_usage,
    whole_block,
)

__all__ = ["AnthropicDialect"]

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": 63999}


def _content(message: UniMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            fidelity = item.fidelity or {}
            kept = fidelity.get(BLOCK)
            if isinstance(kept, dict):
                blocks.append(kept)  # a server tool's block, echoed as it came
                continue
            text: dict[str, Any] = {"type": "text", "text": item.text}
            if fidelity.get("citations"):
                text["citations"] = fidelity["citations"]
            blocks.append(text)
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


_EPHEMERAL = {"type": "ephemeral"}
_CACHEABLE_CHARS = 4 * 1024  # about the 1,024 tokens below which Anthropic caches nothing
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def _mark_cache(body: dict[str, Any]) -> None:
    """Prompt-cache breakpoints on the request's stable prefix (`AnthropicDialect.cache`):
    the last tool, the system prompt, the last message's last block that can carry one."""
    if len(msgspec.json.encode(body)) < _CACHEABLE_CHARS:
        return
    if body.get("tools"):
        body["tools"][-1]["cache_control"] = _EPHEMERAL
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    messages = body["messages"]
    if not messages:
        return
    blocks = messages[-1]["content"]
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        empty = block.get("type") == "text" and not block.get("text")
        if block.get("type") not in _UNMARKABLE and not empty:
            blocks[i] = {**block, "cache_control": _EPHEMERAL}  # a block echoed is not ours
            return


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
    """Anthropic's Messages API.

    Args:
        eager_tools: in a streamed request, mark every tool `eager_input_streaming` (Anthropic's
            fine-grained tool streaming, on every model): a call's input arrives as the model
            writes it rather than buffered and checked by the provider first, so a long
            argument starts seconds sooner. The input is then checked here: a call cut off
            (at `max_tokens`) ends as malformed arguments, never as a call with half its input.
            False asks for buffered input.
        cache: mark the request's stable prefix for Anthropic's prompt cache: the last tool,
            the system prompt and the conversation's last message (three of the four
            breakpoints allowed), so the next turn of the same conversation reads them from the
            cache (a tenth of the input price) instead of paying for them again. Only for a
            request long enough to be cached at all (about 1,024 tokens, by its length); the
            first request of a prefix pays Anthropic's cache-write rate on it (1.25x input),
            which one later turn more than repays. False marks nothing.
    """

    name = NAME
    framing: Literal["sse"] = "sse"

    def __init__(self, *, eager_tools: bool = True, cache: bool = True) -> None:
        self.eager_tools = eager_tools
        self.cache = cache

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
            if stream and self.eager_tools:  # fine-grained tool streaming (see the class)
                for spec in body["tools"]:
                    spec["eager_input_streaming"] = True
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
        if self.cache:
            _mark_cache(body)
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
        return AnthropicStreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming Message as the stream the API would have sent."""
        message = strict_decode(decode_message, body, NAME)
        out: list[LaneEvent] = [MessageStart(message.id, message.model)]
        for index, raw in enumerate(message.content):
            out.extend(whole_block(index, raw))
        out.append(
            MessageDelta(
                finish_reason=message.stop_reason,
                usage=raw_usage(message.usage) if message.usage is not None else None,
            )
        )
        out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"type": "error", "error": {"type", "message"}}` typed by its error type."""
        return error_from_body(NAME, status, body)
