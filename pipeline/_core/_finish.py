"""What a provider's finish reason means in MMSP's words: its four reasons, and whether the
provider's content rules cut the reply (their reasons are all `unknown` to MMSP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._events import FinishReason

__all__ = ["FILTERED_REASONS", "filtered_reason", "filtered_stop", "map_finish_reason"]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "tool_use": "tool_call",
    "tool_calls": "tool_call",
    "tool_call": "tool_call",
    "function_call": "tool_call",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
}

FILTERED_REASONS = frozenset(
    {
        "safety",
        "prohibited_content",
        "blocklist",
        "spii",
        "recitation",
        "image_safety",
        "content_filter",
        "refusal",
    }
)
"""Provider finish reasons of a reply its content rules stopped (Gemini's, a prompt's block
reason, OpenAI's `content_filter`, Anthropic's `refusal`): all `unknown` in MMSP's words."""


def filtered_reason(raw: str | None) -> bool:
    """Whether a provider's own finish reason says its content rules stopped the reply."""
    return raw is not None and raw.lower() in FILTERED_REASONS


def filtered_stop(finish: str | None, raw: str | None) -> bool:
    """Whether a reply that stopped with MMSP's `finish` was cut by the provider's content
    rules: `unknown`, standing for one of their reasons (`raw`, the provider's own word)."""
    return finish == "unknown" and filtered_reason(raw)


def map_finish_reason(raw: str) -> FinishReason:
    """Map a provider's stop spelling onto MMSP's four reasons (case-insensitive).

    `stop`/`end_turn`/`stop_sequence`/`STOP` are `stop`; `tool_use`/`tool_calls`/`function_call`
    are `tool_call`; `length`/`max_tokens`/`MAX_TOKENS`/`max_output_tokens` are `length`; every
    other reason, filtered and blocked replies included (`SAFETY`, `content_filter`, `refusal`),
    is `unknown`, so a cut reply never looks like a normal one.
    """
    return _FINISH.get(raw.lower(), "unknown")
