"""The answer text of a turn, accumulated once and read by all who need it.

The accumulator appends each `text.delta` fragment as it arrives; the message's result, the
run events' `answer.done {sha256, chars}` and `TurnResult.text` read the same object. Fragments
are joined 256 at a time, so a long answer is a few long strings rather than one per fragment,
and joined whole only when the text is read. When the `text.done` item that closes the answer
holds the same text, the answer keeps that string instead (`adopt`): one copy, not two.
"""

from __future__ import annotations

import hashlib

__all__ = ["AnswerText"]

_PIECE = 256  # fragments joined at a time


class AnswerText:
    """The answer text so far (since the last reset).

    Writers append to `parts` and call `settle()` after a batch (the hot path: a list append
    per fragment); readers use `text`, `chars`, `sha256`.
    """

    __slots__ = ("_pieces", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._pieces = 0  # parts[:_pieces] are runs of fragments already joined

    def append(self, fragment: str) -> None:
        """One more fragment."""
        self.parts.append(fragment)
        if len(self.parts) - self._pieces > _PIECE:
            self.settle()

    def settle(self) -> None:
        """Join the fragments appended since the last join, once there are enough of them."""
        parts = self.parts
        if len(parts) - self._pieces > _PIECE:
            parts[self._pieces :] = ["".join(parts[self._pieces :])]
            self._pieces += 1

    def adopt(self, text: str) -> bool:
        """If the text so far is exactly `text` (a `text.done` that is the whole answer), keep
        `text` itself instead of the fragments: the answer and its `.done` item then share one
        copy. Whether it did."""
        parts = self.parts
        if len(parts) == 1 and parts[0] is text:
            return True
        if sum(map(len, parts)) != len(text):
            return False
        at = 0
        for part in parts:
            if not text.startswith(part, at):
                return False
            at += len(part)
        parts[:] = [text]
        self._pieces = 1
        return True

    def reset(self) -> None:
        """Void it: the attempt that produced it is being retried."""
        self.parts = []
        self._pieces = 0

    @property
    def text(self) -> str:
        """The text, joined."""
        parts = self.parts
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
            self._pieces = 1
        return parts[0] if parts else ""

    @property
    def chars(self) -> int:
        """Its length in characters (code points)."""
        return len(self.text)

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of its UTF-8 bytes."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()
