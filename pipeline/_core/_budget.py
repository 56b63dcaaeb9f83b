"""The context budget: what of a history fits the model's context window.

Before each model request the whole prompt is estimated (instructions, every message, tool
schemas, accumulated tool results) with a pluggable estimator, a plain character count by
default. A share of the window (20 %) stays free for the answer. When the prompt does not
fit, the oldest exchanges go first, each whole (a tool call never loses its result); the
instructions, the current question and its tool evidence always stay whole, and when they
alone do not fit, the request is never sent: `ContextWindowExceeded` (safe code
`context_window_exceeded`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import msgspec

from ._conversation import exchanges
from ._errors import ContextWindowExceeded

if TYPE_CHECKING:
    from ._request import TurnRequest

__all__ = ["ContextBudget", "estimate_chars", "least_tokens"]

_encode = msgspec.json.encode


def estimate_chars(text: str) -> int:
    """Tokens in `text`, roughly: one per four characters (a plain, provider-neutral guess)."""
    return math.ceil(len(text) / 4)


_WORD = re.compile(r"[^\W_]+")
"""A run of letters or digits: the tokenizers in use give each at least one token of its own.
Byte-pair ones cut text at white space and punctuation before they merge; SentencePiece ones
never merge across white space and only rarely across punctuation (`it's`, `e.g.`), which a
prose word's usual second token makes up for many times over."""


def least_tokens(request: TurnRequest) -> int:
    """The fewest tokens the request's prompt can take by any provider's count: the runs of
    letters or digits in its text (the instructions, the messages' text, thinking and tool-call
    arguments, the tool schemas), each at least one token wherever it is counted. Punctuation,
    a long word's or a number's several tokens, a script written without spaces and images
    count nothing, so the true count is higher, often by half: what a rate limit on tokens must
    at least admit for the request to pass (`rillet._core._failures.past_limit`)."""
    texts = [request.system_prompt or ""]
    if request.tools:
        texts.append(_encode(request.tools).decode())
    for message in request.messages:
        for item in message.content_items:
            for name in _TEXT_FIELDS:
                value = getattr(item, name, None)
                if isinstance(value, str):
                    texts.append(value)
                elif value is not None:  # a tool call's arguments
                    texts.append(_encode(value).decode())
    return sum(len(_WORD.findall(text)) for text in texts)


_TEXT_FIELDS = ("text", "thinking", "arguments")
"""The fields of an item that hold what a model reads as text."""


@attrs.frozen
class ContextBudget:
    """How much prompt a model takes.

    Attributes:
        context_window: the model's context window, in tokens.
        reserve: the share of the window kept for the answer (0.2: 20 %).
        estimator: tokens in a text (JSON of each message, the tool schemas, instructions).
    """

    context_window: int
    reserve: float = attrs.field(
        default=0.2, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)]
    )
    estimator: Callable[[str], int] = estimate_chars

    @property
    def available(self) -> int:
        """Tokens the prompt may take."""
        return int(self.context_window * (1.0 - self.reserve))

    def _fixed(self, request: TurnRequest) -> int:
        tokens = self.estimator(request.system_prompt or "")
        if request.tools:
            tokens += self.estimator(_encode(request.tools).decode())
        return tokens

    def _message(self, message: msgspec.Struct) -> int:
        return self.estimator(_encode(message).decode())

    def estimate(self, request: TurnRequest) -> int:
        """Tokens the whole request's prompt takes, by the estimator."""
        return self._fixed(request) + sum(self._message(m) for m in request.messages)

    def fit(self, request: TurnRequest) -> TurnRequest:
        """The request with the oldest exchanges left out until it fits; raises
        `ContextWindowExceeded` when even the instructions and the current exchange do not."""
        groups = exchanges(request.messages)
        sizes = [sum(self._message(m) for m in g) for g in groups]
        total = self._fixed(request) + sum(sizes)
        if total <= self.available:
            return request
        keep_from = 0
        while keep_from < len(groups) - 1 and total > self.available:
            total -= sizes[keep_from]
            keep_from += 1
        if total > self.available:
            raise ContextWindowExceeded(total, self.available)
        kept = [m for g in groups[keep_from:] for m in g]
        return msgspec.structs.replace(request, messages=kept)
