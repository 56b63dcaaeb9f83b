"""The lane vocabulary: what a provider dialect emits, provider-neutral, possibly interleaved.

A lane is one item being streamed: text, thinking, a tool call, inline data, inline thinking or
an embedding. A dialect opens a lane with `PartStart`, feeds it `PartDelta`s and closes it with
`PartStop`; lanes may interleave on the wire, and the grammar serialises them into MMSP groups.
A lane is named by `(kind, index)`: indexes may be reused across kinds (Chat Completions' text
and its first tool call both have index 0).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ._errors import RilletError

__all__ = [
    "LaneEvent",
    "LaneKind",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "PartDelta",
    "PartRun",
    "PartStart",
    "PartStop",
    "Ping",
    "ProviderErrorEvent",
    "RawUsage",
]

LaneKind = Literal["text", "thinking", "tool_call", "inline_data", "inline_thinking", "embedding"]


class MessageStart(msgspec.Struct, frozen=True, gc=False):
    """The provider began its reply (message id and model, when it says)."""

    id: str = ""
    model: str = ""


class PartStart(msgspec.Struct, frozen=True, kw_only=True):
    """A lane opens. Tool lanes carry the tool's name and call id; media lanes a mime type."""

    index: int
    kind: LaneKind
    name: str = ""
    call_id: str = ""
    mime_type: str = ""


class PartDelta(msgspec.Struct, frozen=True, gc=False):
    """A fragment for an open lane.

    `value` is text (text, thinking, tool-call argument JSON), bytes (inline data and thinking)
    or a list of floats (one whole embedding vector). `fidelity` is opaque provider data to echo
    back on the next turn; at most one distinct value per lane.
    """

    index: int
    kind: LaneKind
    value: Any
    fidelity: dict[str, Any] | None = None


class PartRun(msgspec.Struct, frozen=True, gc=False):
    """Fragments for one open lane that came in a row (a read's): the grammar reads it as one
    `PartDelta` each, in order. Each is a non-empty string, without fidelity. A stream
    decoder's `feed_frames` hands on a run of its commonest frames so, one object for all of
    them."""

    index: int
    kind: LaneKind
    values: list[str]


class PartStop(msgspec.Struct, frozen=True, gc=False):
    """A lane closes: by index (and kind, where the index is shared), or the oldest open lane."""

    index: int | None = None
    kind: LaneKind | None = None


class RawUsage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Token counts already in MMSP's meaning (see `UsageMetadata`); None means not reported.
    `cache_write_tokens` is rillet's own (MMSP has no field for it): of `prompt_tokens`, those
    written to the provider's prompt cache (Anthropic's `cache_creation_input_tokens`), priced
    apart from the rest of the prompt."""

    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    thoughts_tokens: int | None = None
    response_tokens: int | None = None
    cache_write_tokens: int | None = None


class MessageDelta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The provider's finish reason (its own spelling) and/or usage; merged field by field,
    later non-null values win. A finish reason closes every lane still open."""

    finish_reason: str | None = None
    usage: RawUsage | None = None


class MessageStop(msgspec.Struct, frozen=True, gc=False):
    """The provider's terminal event: the reply is over."""


class Ping(msgspec.Struct, frozen=True, gc=False):
    """A provider keep-alive event; counts for deadlines, emits nothing."""


class ProviderErrorEvent(msgspec.Struct, frozen=True):
    """The provider reported an error inside the stream; the grammar raises it in order."""

    error: RilletError


LaneEvent = (
    MessageStart
    | PartStart
    | PartDelta
    | PartRun
    | PartStop
    | MessageDelta
    | MessageStop
    | Ping
    | ProviderErrorEvent
)
