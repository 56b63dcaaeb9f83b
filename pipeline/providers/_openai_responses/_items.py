"""OpenAI Responses' output items, sans-I/O: the message, reasoning and function-call items a
reply streams (or holds whole), decoded only when of a type that is read, and how each opens
and closes its lane."""

from __future__ import annotations

from typing import Any

import msgspec
from rillet._core._lanes import LaneEvent, LaneKind, PartDelta, PartStart, PartStop

from ..._core._dialect import strict_decode

__all__ = ["NAME"]

NAME = "openai-responses"


class _Text(msgspec.Struct, frozen=True, gc=False):
    """A content or summary part: its `text`, or a `refusal` part's words."""

    type: str = ""
    text: str = ""
    refusal: str = ""


class _Type(msgspec.Struct, frozen=True, gc=False):
    """Only the `type` of an event or output item: what decides whether the rest is read."""

    type: str = ""


class _Item(msgspec.Struct, frozen=True):
    """A `message`, `reasoning` or `function_call` output item. Items of other types (hosted
    tools: `web_search_call`, `tool_search_call`...) are never decoded as this: their fields
    may hold anything (`"arguments": {}`)."""

    type: str = ""
    id: str = ""
    phase: str | None = None
    content: list[_Text] | None = None
    summary: list[_Text] | None = None
    encrypted_content: str | None = None
    signature: str | None = None
    format: str | None = None
    call_id: str = ""
    name: str = ""
    arguments: str | None = None


_decode_item = msgspec.json.Decoder(_Item)
decode_type = msgspec.json.Decoder(_Type)

_ITEM_KINDS: dict[str, LaneKind] = {
    "message": "text",
    "reasoning": "thinking",
    "function_call": "tool_call",
}


def decode_item(raw: msgspec.Raw) -> _Item | None:
    """An output item of a type we stream, decoded; None (undecoded) for any other type."""
    head: _Type = strict_decode(decode_type, raw, NAME)
    if head.type not in _ITEM_KINDS:
        return None
    item: _Item = strict_decode(_decode_item, raw, NAME)
    return item


def open_item(index: int, item: _Item, out: list[LaneEvent]) -> LaneKind | None:
    """Open the lane of an output item (a tool call with its header fragment); None for items
    we do not stream."""
    kind = _ITEM_KINDS.get(item.type)
    if kind is None:
        return None
    if kind == "tool_call":
        out.append(PartStart(index=index, kind=kind, name=item.name, call_id=item.call_id))
        out.append(PartDelta(index, kind, ""))
    else:
        out.append(PartStart(index=index, kind=kind))
        if kind == "text" and item.phase:
            out.append(PartDelta(index, kind, "", {"phase": item.phase}))
    return kind


def _reasoning_fidelity(item: _Item) -> dict[str, Any] | None:
    fidelity: dict[str, Any] = {}
    if item.summary:
        fidelity["channel"] = "summary"
    if item.encrypted_content:
        fidelity["encrypted_content"] = item.encrypted_content
    if item.signature:
        fidelity["signature"] = item.signature
    if item.format:
        fidelity["format"] = item.format
    return fidelity or None


def close_item(
    index: int, kind: LaneKind, item: _Item, *, streamed: bool, out: list[LaneEvent]
) -> None:
    """Close an item's lane at its done event: its whole value first when no delta carried it,
    and a reasoning item's fidelity."""
    if not streamed:
        if kind == "text":
            text = "".join(p.refusal if p.type == "refusal" else p.text for p in _said(item))
            if text:
                out.append(PartDelta(index, kind, text))
        elif kind == "tool_call":
            if item.arguments:
                out.append(PartDelta(index, kind, item.arguments))
        else:
            parts = item.summary or [p for p in item.content or () if p.type == "reasoning_text"]
            text = "".join(p.text for p in parts)  # parts joined as they are, as when streamed
            if text:
                out.append(PartDelta(index, kind, text))
    if kind == "thinking":
        fidelity = _reasoning_fidelity(item)
        if fidelity is not None:
            out.append(PartDelta(index, kind, "", fidelity))
    out.append(PartStop(index, kind))


def _said(item: _Item) -> list[_Text]:
    """A message item's parts that say something: its output text and its refusals."""
    return [p for p in item.content or () if p.type == "output_text" or p.type == "refusal"]


def holds_refusal(item: _Item) -> bool:
    """Whether a message item holds a refusal part (the model declined)."""
    return item.type == "message" and any(p.type == "refusal" for p in item.content or ())


def is_call(raw: msgspec.Raw) -> bool:
    head: _Type = strict_decode(decode_type, raw, NAME)
    return head.type == "function_call"
