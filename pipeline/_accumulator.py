"""The accumulator: UniEvents in, the assistant UniMessage and the answer text out. Pure.

It trusts the grammar (which ran upstream) and only collects: the `.done` items in order, the
stop's usage and finish reason, and the answer text as its fragments arrive, so a reply that
fails half way still has its partial text. `reset()` voids an attempt that is being retried.
"""

from __future__ import annotations

import hashlib

from ._events import (
    ContentItem,
    EmbeddingDone,
    FinishReason,
    InlineDataDone,
    InlineThinkingDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UniMessage,
    UsageMetadata,
)

__all__ = ["Accumulator"]

_PIECE = 256  # text fragments joined at a time
_SKIPPED = frozenset({ThinkingDelta, ToolCallDelta})  # fragments whose `.done` is what counts
_DONE_TYPES = (
    TextDone,
    ThinkingDone,
    ToolCallDone,
    InlineDataDone,
    InlineThinkingDone,
    EmbeddingDone,
)


class Accumulator:
    """Collects one reply from its UniEvents.

    Attributes:
        items: the `.done` items so far, in stream order.
        usage: the stop event's usage, once it came.
        finish_reason: the stop event's finish reason, once it came.
        stopped: whether the stop event came.
    """

    __slots__ = ("_pieces", "_text", "finish_reason", "items", "stopped", "usage")

    def __init__(self) -> None:
        self.items: list[ContentItem] = []
        self._text: list[str] = []
        self._pieces = 0  # _text[:_pieces] are runs of fragments already joined
        self.usage: UsageMetadata | None = None
        self.finish_reason: FinishReason | None = None
        self.stopped = False

    def feed(self, event: UniEvent) -> None:
        """Take one UniEvent."""
        if event.event_type == "stop":
            self.usage = event.usage_metadata
            self.finish_reason = event.finish_reason
            self.stopped = True
            return
        for item in event.content_items:
            if type(item) is TextDelta:
                self._text.append(item.text)
            elif isinstance(item, _DONE_TYPES):
                self.items.append(item)

    def feed_many(self, events: list[UniEvent]) -> None:
        """Take a batch of UniEvents, in order."""
        text = self._text
        for event in events:
            items = event.content_items
            if items:
                kind = type(items[0])
                if kind is TextDelta:
                    text.append(items[0].text)  # type: ignore[union-attr]
                    continue
                if kind in _SKIPPED:
                    continue
            self.feed(event)
        if len(text) - self._pieces > _PIECE:  # a few long strings, not one per fragment
            text[self._pieces :] = ["".join(text[self._pieces :])]
            self._pieces += 1

    def reset(self) -> None:
        """Void everything: the attempt that produced it is being retried."""
        self.items = []
        self._text = []
        self._pieces = 0
        self.usage = None
        self.finish_reason = None
        self.stopped = False

    @property
    def text(self) -> str:
        """The answer text so far: every `text.delta` joined (thinking excluded)."""
        if len(self._text) > 1:
            self._text = ["".join(self._text)]
            self._pieces = 1
        return self._text[0] if self._text else ""

    @property
    def chars(self) -> int:
        """The answer's length in characters (code points)."""
        return len(self.text)

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of the answer text's UTF-8 bytes."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def message(self) -> UniMessage:
        """The assistant message: the `.done` items, the usage and the finish reason."""
        return UniMessage(
            role="assistant",
            content_items=list(self.items),
            usage_metadata=self.usage,
            finish_reason=self.finish_reason,
        )
