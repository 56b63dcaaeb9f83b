"""What a turn asks for: the conversation in MMSP's shape and the generation settings.

Messages are `UniMessage`s: the user's text, `image_url` and `tool_result` items, and assistant
messages replayed with their `.done` items (thinking with its fidelity signature included), so
multi-turn tool use and extended thinking round-trip through every dialect.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ._events import ContentItem, TextDone, UniMessage

__all__ = ["ThinkingLevel", "ToolChoice", "ToolSpec", "TurnRequest", "user"]

ThinkingLevel = Literal["none", "low", "medium", "high", "xhigh", "max"]
ToolChoice = Literal["auto", "required", "none"] | list[str]


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tool the model may call: its name, what it does, and its arguments' JSON schema.

    `strict` asks a provider that can (OpenAI's Chat Completions and Responses) to hold the
    model's arguments to the schema exactly; None leaves the provider's default. Other wires have
    no such field and go without it."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TurnRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One turn's request, provider-neutral.

    Attributes:
        messages: the conversation so far, oldest first.
        system_prompt: instructions that precede the conversation.
        tools: the tools the model may call.
        tool_choice: `auto`, `required`, `none`, or the names the model must pick from.
        max_tokens: the reply's token budget.
        temperature: sampling temperature.
        thinking_level: how hard a reasoning model should think; `none` turns it off.
        extra_body: per dialect name, fields merged into that provider's request body as they
            are (the escape hatch for a provider option rillet does not model).
    """

    messages: list[UniMessage]
    system_prompt: str | None = None
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    thinking_level: ThinkingLevel | None = None
    extra_body: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)


def user(*items: str | ContentItem) -> UniMessage:
    """A user message; plain strings become text items."""
    content: list[ContentItem] = [TextDone(text=i) if isinstance(i, str) else i for i in items]
    return UniMessage(role="user", content_items=content)
