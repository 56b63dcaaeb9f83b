"""The accumulator: UniEvents in, the assistant UniMessage and the answer text out. Pure.

It trusts the grammar (which ran upstream) and only collects: the `.done` items in order, the
stop's usage and finish reason, and the answer text as its fragments arrive, so a reply that
fails half way still has its partial text (`answer`, the turn's one copy of it, which the run
events and the result read too). `reset()` voids an attempt that is being retried.
"""

from __future__ import annotations

from typing import Any

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
from ._markers import DeltaRun
from ._text import AnswerText

__all__ = ["Accumulator"]

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
        answer: the answer text (every `text.delta`, thinking excluded).
        items: the `.done` items so far, in stream order.
        usage: the stop event's usage, once it came.
        finish_reason: the stop event's finish reason, once it came.
        stopped: whether the stop event came.
    """

    __slots__ = ("answer", "finish_reason", "items", "stopped", "usage")

    def __init__(self) -> None:
        self.items: list[ContentItem] = []
        self.answer = AnswerText()
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
                self.answer.append(item.text)
            elif isinstance(item, _DONE_TYPES):
                self.items.append(item)
                if type(item) is TextDone:
                    self.answer.adopt(item.text)  # the same text: keep one copy of it

    def feed_many(self, events: list[UniEvent]) -> None:
        """Take a batch of UniEvents, in order (or runs of deltas standing for them, from a
        grammar that releases runs)."""
        answer = self.answer
        text = answer.parts
        for event in events:
            items = event.content_items
            if items:
                kind = type(items[0])
                if kind is TextDelta:
                    text.append(items[0].text)  # type: ignore[union-attr]
                    continue
                if kind in _SKIPPED:
                    continue
            else:
                run: Any = event
                if type(run) is DeltaRun:  # (a grammar's `runs`): its strings, if text
                    if run.kind == "text":
                        text += run.values
                    continue
            self.feed(event)
        if len(text) > 256:  # a few long strings, not one per fragment
            answer.settle()

    def reset(self) -> None:
        """Void everything: the attempt that produced it is being retried."""
        self.items = []
        self.answer.reset()
        self.usage = None
        self.finish_reason = None
        self.stopped = False

    @property
    def text(self) -> str:
        """The answer text so far: every `text.delta` joined (thinking excluded)."""
        return self.answer.text

    @property
    def chars(self) -> int:
        """The answer's length in characters (code points)."""
        return self.answer.chars

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of the answer text's UTF-8 bytes."""
        return self.answer.sha256

    def message(self) -> UniMessage:
        """The assistant message: the `.done` items, the usage and the finish reason."""
        return UniMessage(
            role="assistant",
            content_items=list(self.items),
            usage_metadata=self.usage,
            finish_reason=self.finish_reason,
        )
