"""The UniEvent model: MMSP's content items, events and messages as msgspec Structs.

The JSON these encode to is MMSP's JSON, key for key and in the same order: the tag `type` first,
then the item's fields in MMSP's order, `fidelity` only when present; `bytes` as base64 text;
`usage_metadata` and `finish_reason` written as `null` on delta events.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ContentItem",
    "DeltaItem",
    "DoneItem",
    "EmbeddingDelta",
    "EmbeddingDone",
    "EventItem",
    "FinishReason",
    "ImageUrlDone",
    "InlineDataDelta",
    "InlineDataDone",
    "InlineThinkingDelta",
    "InlineThinkingDone",
    "TextDelta",
    "TextDone",
    "ThinkingDelta",
    "ThinkingDone",
    "ToolCallDelta",
    "ToolCallDone",
    "ToolResultDone",
    "UniEvent",
    "UniMessage",
    "UsageMetadata",
    "decode_uni_event",
    "decode_uni_message",
    "delta_event",
    "encode_json",
    "stop_event",
]

FinishReason = Literal["stop", "length", "tool_call", "unknown"]
Fidelity = dict[str, Any]


# Every event struct is `gc=False`: it holds strings, numbers and plain JSON data, never a cycle,
# so the cycle collector need not track the tens of thousands a long reply keeps alive.


class _Item(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", gc=False
):
    """A content item; the `type` key picks the subclass."""


# --- streamed fragments -------------------------------------------------------------------------


class TextDelta(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="text.delta"):
    """A fragment of answer text."""

    text: str
    fidelity: Fidelity | None = None


class ThinkingDelta(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="thinking.delta"):
    """A fragment of the model's reasoning; may carry only a fidelity (a late signature)."""

    thinking: str
    fidelity: Fidelity | None = None


class ToolCallDelta(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="tool_call.delta"):
    """A fragment of a tool call's JSON arguments; the first carries the name and the call id."""

    name: str
    arguments: str
    tool_call_id: str
    fidelity: Fidelity | None = None


class InlineDataDelta(
    _Item, frozen=True, kw_only=True, omit_defaults=True, tag="inline_data.delta"
):
    """Bytes of generated media: an audio chunk, or a whole image."""

    data: bytes
    mime_type: str
    fidelity: Fidelity | None = None


class InlineThinkingDelta(
    _Item, frozen=True, kw_only=True, omit_defaults=True, tag="inline_thinking.delta"
):
    """Reasoning sent as opaque bytes with a MIME type, not text: passed on as it came."""

    data: bytes
    mime_type: str
    fidelity: Fidelity | None = None


class EmbeddingDelta(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="embedding.delta"):
    """One whole embedding vector (one per input, in input order)."""

    embedding: list[float]


# --- complete items -----------------------------------------------------------------------------


class TextDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="text.done"):
    """A complete text item: the answer's text as one piece, built from its deltas."""

    text: str
    fidelity: Fidelity | None = None


class ThinkingDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="thinking.done"):
    """A complete thinking item, with the fidelity to echo back on the next turn."""

    thinking: str
    fidelity: Fidelity | None = None


class ToolCallDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="tool_call.done"):
    """A complete tool call, its arguments parsed into a JSON object."""

    name: str
    arguments: dict[str, Any]
    tool_call_id: str
    fidelity: Fidelity | None = None


class InlineDataDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="inline_data.done"):
    """Complete generated media."""

    data: bytes
    mime_type: str
    fidelity: Fidelity | None = None


class InlineThinkingDone(
    _Item, frozen=True, kw_only=True, omit_defaults=True, tag="inline_thinking.done"
):
    """Complete opaque reasoning bytes."""

    data: bytes
    mime_type: str
    fidelity: Fidelity | None = None


class EmbeddingDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="embedding.done"):
    """A complete embedding vector."""

    embedding: list[float]


class ImageUrlDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="image_url.done"):
    """An image the user sends, as a URL or a `data:` URL. Users only: no delta form."""

    image_url: str


class ToolResultDone(_Item, frozen=True, kw_only=True, omit_defaults=True, tag="tool_result.done"):
    """The result of a tool call the user sends back. Users only: no delta form."""

    text: str
    images: list[str] | None = None
    tool_call_id: str


DeltaItem = (
    TextDelta
    | ThinkingDelta
    | ToolCallDelta
    | InlineDataDelta
    | InlineThinkingDelta
    | (EmbeddingDelta)
)
DoneItem = (
    TextDone | ThinkingDone | ToolCallDone | InlineDataDone | InlineThinkingDone | (EmbeddingDone)
)
ContentItem = DoneItem | ImageUrlDone | ToolResultDone
EventItem = DeltaItem | ContentItem


class UsageMetadata(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Token counts, MMSP's way: prompt excludes cached tokens, response excludes thinking tokens;
    a count the provider did not report is None, not 0."""

    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    thoughts_tokens: int | None = None
    response_tokens: int | None = None


class UniEvent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One event of the MMSP stream: a `delta` with exactly one item, or the final `stop`."""

    role: Literal["assistant"] = "assistant"
    event_type: Literal["delta", "stop"]
    content_items: list[EventItem]
    usage_metadata: UsageMetadata | None = None
    finish_reason: FinishReason | None = None
    created_at: int = 0


class UniMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A message of a conversation: the user's, or the assistant's `.done` items with the stop's
    usage and finish reason. `name` tells participants of one role apart (OpenAI's message
    `name`); wires without such a field go without it."""

    role: Literal["user", "assistant"]
    content_items: list[ContentItem]
    usage_metadata: UsageMetadata | None = None
    finish_reason: FinishReason | None = None
    created_at: int | None = None
    name: str | None = None


def delta_event(item: EventItem, created_at: int) -> UniEvent:
    """The delta event that carries one item."""
    return UniEvent(event_type="delta", content_items=[item], created_at=created_at)


def stop_event(usage: UsageMetadata, finish_reason: FinishReason, created_at: int) -> UniEvent:
    """The one stop event that ends a successful stream."""
    return UniEvent(
        event_type="stop",
        content_items=[],
        usage_metadata=usage,
        finish_reason=finish_reason,
        created_at=created_at,
    )


_encoder = msgspec.json.Encoder()
encode_json = _encoder.encode
"""Encode any of these Structs (or plain JSON values) to MMSP's JSON bytes."""

decode_uni_event = msgspec.json.Decoder(UniEvent).decode
"""Decode one UniEvent from MMSP's JSON."""

decode_uni_message = msgspec.json.Decoder(UniMessage).decode
"""Decode one UniMessage from MMSP's JSON."""
