"""A turn's replay history, kept compactly: its two logs without one object per text fragment.

A turn that keeps its history (`history=True`) must replay every UniEvent and run event from
the start, to any number of readers, live. Kept as delivered, that is several objects per text
fragment (the event, its item list, the item, the run event, the fragment's string): most of
what a finished turn holds. The fragments, though, are spans of the answer text, which the turn
keeps anyway (`_text.AnswerText`, the one copy of it). So `UniHistory` and `RunHistory` keep a
run of consecutive plain text fragments as the span ends in that text and one stamp a batch
(about 8 bytes a fragment), and every other item as it came; `read` rebuilds the events, equal
field for field to those delivered, when a reader asks (`Turn.uni_events()`,
`Turn.run_events()`).

Every text fragment of the uni log lies at the offset it was appended at in the accumulator's
text since the last reset: the uni log counts the characters as the accumulator does, batch by
batch (the accumulator has already taken each). The run log's `answer.delta`s of a batch lie
where the uni log put that batch's text; a batch whose do not hold all of it is kept as it
came. A reset starts a new text (a new list of parts); the runs of the voided attempt keep the
old one, and so still replay it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING, Generic, TypeVar

import trio

from .._core._events import TextDelta, ThinkingDelta, ToolCallDelta, UniEvent
from .._core._markers import AttemptReset
from .._core._runevents import AnswerDelta, RunEvent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._core._text import AnswerText

__all__ = ["Follower", "HistoryLog", "PlainLog", "RunHistory", "UniHistory"]

T = TypeVar("T")
UniItem = UniEvent | AttemptReset
_READ = 256  # items a follower rebuilds at a time
_U32 = 1 << 32
_U62 = 1 << 62
_SKIPPED = (ThinkingDelta, ToolCallDelta)  # events whose text the accumulator skips


class PlainLog(Generic[T]):
    """An append-only list that any number of readers follow from the start, live.

    `base` is the position of `items[0]`: a turn that keeps no history forgets what every sink
    has been given (`forget`), and positions stay absolute."""

    __slots__ = ("_changed", "base", "closed", "items")

    def __init__(self) -> None:
        self.items: list[T] = []
        self.base = 0
        self.closed = False
        self._changed: trio.Event | None = None  # made when a reader waits

    @property
    def end(self) -> int:
        """The position after the last item."""
        return self.base + len(self.items)

    def extend(self, items: Sequence[T]) -> None:
        """Append, waking readers."""
        if items:
            self.items.extend(items)
            self._wake()

    def since(self, position: int) -> list[T]:
        """The items from absolute `position` on (those kept)."""
        return self.items[max(position - self.base, 0) :]

    def read(self, position: int, limit: int) -> list[T]:
        """Up to `limit` items from absolute `position` on (those kept)."""
        at = max(position - self.base, 0)
        return self.items[at : at + limit]

    def forget(self, position: int) -> None:
        """Drop the items before absolute `position`."""
        if position > self.base:
            del self.items[: position - self.base]
            self.base = position

    def close(self) -> None:
        """Nothing more will be appended."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def follow(self, start: int = 0) -> Follower[T]:
        """A reader from `start`."""
        return Follower(self, start)

    async def wait_changed(self) -> None:
        """Wait until an item is appended or the log is closed."""
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()


class Follower(Generic[T]):
    """One reader of a log: from `start`, then live, until the log is closed.

    A plain async iterator rather than an async generator, so a reader may stop at any point
    (`break`) without leaving a suspended generator for the garbage collector."""

    __slots__ = ("_at", "_buf", "_i", "_log")

    def __init__(self, log: PlainLog[T], start: int) -> None:
        self._log = log
        self._i = start  # the position of the item after `_buf`
        self._buf: list[T] = []
        self._at = 0  # the next item of `_buf`

    def __aiter__(self) -> Follower[T]:
        return self

    async def __anext__(self) -> T:
        buf = self._buf
        if self._at < len(buf):
            item = buf[self._at]
            self._at += 1
            return item
        log = self._log
        while True:
            if self._i < log.end:
                at = max(self._i, log.base)  # what a log that forgets has dropped is skipped
                buf = self._buf = log.read(at, _READ)
                self._i = at + len(buf)
                self._at = 1
                return buf[0]
            if log.closed:
                raise StopAsyncIteration
            await log.wait_changed()


class _Text:
    """One attempt's answer text as the logs see it: the accumulator's parts (shared, not
    copied) and how many characters of it the log has counted."""

    __slots__ = ("chars", "parts")

    def __init__(self, parts: list[str]) -> None:
        self.parts = parts
        self.chars = 0

    def span(self, start: int, end: int) -> str:
        """The text from `start` to `end`."""
        parts = self.parts
        if len(parts) == 1:
            return parts[0][start:end]
        if start == end:
            return ""
        # from the nearer end: a live reader reads near the end, a replay near the start
        if start * 2 >= self.chars:
            at = self.chars
            i = len(parts)
            while at > start:
                i -= 1
                at -= len(parts[i])
        else:
            at = 0
            i = 0
            while at + len(parts[i]) <= start:
                at += len(parts[i])
                i += 1
        out = []
        while at < end:
            part = parts[i]
            out.append(part[max(start - at, 0) : end - at])
            at += len(part)
            i += 1
        return out[0] if len(out) == 1 else "".join(out)


class _Run:
    """Consecutive plain text fragments: their span ends in one attempt's text, their stamps
    (`created_at`, or `elapsed_ms`) as the index where each new stamp begins and its value
    (a batch's fragments share one), and the `seq` of the first (run events)."""

    __slots__ = ("ends", "marks", "seq", "stamps", "start", "text")

    def __init__(self, text: _Text, start: int, seq: int) -> None:
        self.text = text
        self.start = start  # where the first fragment starts
        self.seq = seq
        self.ends = array("I")
        self.marks = array("I")
        self.stamps = array("q")

    def fragments(self, first: int, last: int) -> list[tuple[str, int]]:
        """Fragments `first` to `last` (excluded): each one's text and stamp."""
        ends, marks, stamps = self.ends, self.marks, self.stamps
        origin = ends[first - 1] if first else self.start
        whole = self.text.span(origin, ends[last - 1])
        k = bisect_right(marks, first) - 1
        following = marks[k + 1] if k + 1 < len(marks) else last
        out = []
        at = 0
        for j in range(first, last):
            if j == following:
                k += 1
                following = marks[k + 1] if k + 1 < len(marks) else last
            end = ends[j] - origin
            out.append((whole[at:end], stamps[k]))
            at = end
        return out


class HistoryLog(PlainLog[T]):
    """A `PlainLog` that keeps runs of plain text fragments as spans of the answer text (see
    the module's docstring); `read` rebuilds them. A history is kept whole: no `forget`."""

    __slots__ = ("_end", "_entries", "_run", "_starts")

    def __init__(self) -> None:
        super().__init__()
        self._entries: list[T | _Run] = []
        self._starts = array("q")  # each entry's position
        self._run: _Run | None = None  # the run still growing
        self._end = 0

    @property
    def end(self) -> int:
        """The position after the last item."""
        return self._end

    def _raw(self, item: T) -> None:
        self._run = None
        self._entries.append(item)
        self._starts.append(self._end)
        self._end += 1

    def _open(self, text: _Text, start: int, seq: int) -> _Run:
        """A new run from `start` in `text`."""
        run = self._run = _Run(text, start, seq)
        self._entries.append(run)
        self._starts.append(self._end)
        return run

    def _state(self) -> tuple[int, int, _Run | None, int, int]:
        """Where the log is: what `_undo` returns it to."""
        run = self._run
        if run is None:
            return len(self._entries), self._end, None, 0, 0
        return len(self._entries), self._end, run, len(run.ends), len(run.marks)

    def _undo(self, state: tuple[int, int, _Run | None, int, int], items: Sequence[T]) -> None:
        """Back to `state`, then `items` kept as they came."""
        entries, self._end, run, ends, marks = state
        del self._entries[entries:]
        del self._starts[entries:]
        if run is not None:
            del run.ends[ends:]
            del run.marks[marks:]
            del run.stamps[marks:]
        self._run = None
        for item in items:
            self._raw(item)

    def read(self, position: int, limit: int = _READ) -> list[T]:
        """Up to `limit` items from `position` on, rebuilt as they were delivered."""
        out: list[T] = []
        if position >= self._end:
            return out
        starts, entries = self._starts, self._entries
        i = bisect_right(starts, position) - 1
        while i < len(entries) and len(out) < limit:
            entry = entries[i]
            if type(entry) is _Run:
                first = position - starts[i]
                last = min(len(entry.ends), first + limit - len(out))
                seq = entry.seq + first
                for fragment, stamp in entry.fragments(first, last):
                    out.append(self._rebuild(fragment, stamp, seq))
                    seq += 1
                position = starts[i] + last
            else:
                out.append(entry)  # type: ignore[arg-type]
                position += 1
            i += 1
        return out

    def forget(self, position: int) -> None:
        """Refused: a history is kept whole (only a turn without history forgets)."""
        raise TypeError("a turn's history log keeps every item")

    def since(self, position: int) -> list[T]:
        """The items from `position` on."""
        return self.read(position, max(self._end - position, 0))

    def close(self) -> None:
        """Nothing more will be appended."""
        self._run = None
        super().close()

    def _rebuild(self, fragment: str, stamp: int, seq: int) -> T:
        """The item a kept fragment was."""
        raise NotImplementedError


class UniHistory(HistoryLog[UniItem]):
    """The MMSP log: a plain text delta (one `text.delta` item without fidelity) is kept as a
    span; its `created_at` is its stamp. It counts the answer's characters as the accumulator
    appends them (every text item it takes), and notes where each batch's text lies, for the
    run log that takes the same batch next (`batch`)."""

    __slots__ = ("_answer", "_text", "batch")

    def __init__(self, answer: AnswerText) -> None:
        super().__init__()
        self._answer = answer
        self._text = _Text(answer.parts)
        self.batch: tuple[_Text, int, int] | None = None  # the last batch's text: from, to

    def extend(self, items: Sequence[UniItem]) -> None:
        """Append, waking readers."""
        if not items:
            return
        parts = self._answer.parts
        text = self._text
        if parts is not text.parts:  # the accumulator was reset: a new text
            text = self._text = _Text(parts)
            self._run = None
        start = text.chars
        state = self._state()
        try:
            chars = self._take(items, text, start)
        except (OverflowError, TypeError):  # past what a run holds: the batch as it came
            self._undo(state, items)
            chars = start + _counted(items)
        text.chars = chars
        self.batch = (text, start, chars)
        self._wake()

    def _take(self, items: Sequence[UniItem], text: _Text, chars: int) -> int:
        run = self._run
        end = self._end
        ends = marks = stamps = None
        last = None  # the stamp of the run's last fragment
        if run is not None:
            ends, marks, stamps = run.ends, run.marks, run.stamps
            last = stamps[-1]
        for item in items:
            if type(item) is UniEvent:
                content = item.content_items
                first = content[0] if content else None
                if type(first) is TextDelta:
                    at = chars
                    chars += len(first.text)
                    if (
                        first.fidelity is None
                        and len(content) == 1
                        and item.event_type == "delta"
                        and item.usage_metadata is None
                        and item.finish_reason is None
                        and item.role == "assistant"
                    ):
                        if ends is None:
                            self._end = end
                            run = self._open(text, at, end)
                            ends, marks, stamps = run.ends, run.marks, run.stamps
                        stamp = item.created_at
                        if stamp != last or type(stamp) is not int:
                            marks.append(len(ends))  # type: ignore[union-attr]
                            stamps.append(stamp)  # type: ignore[union-attr]
                            last = stamp
                        ends.append(chars)
                        end += 1
                        continue
                elif (
                    first is not None and item.event_type != "stop" and type(first) not in _SKIPPED
                ):
                    # not the grammar's shape (one item a delta), but counted as the
                    # accumulator counts it
                    for other in content:
                        if type(other) is TextDelta:
                            chars += len(other.text)
            self._end = end
            self._raw(item)
            end = self._end
            run = ends = marks = stamps = last = None
        self._end = end
        self._run = run
        return chars

    def _rebuild(self, fragment: str, stamp: int, seq: int) -> UniItem:
        return UniEvent(
            event_type="delta", content_items=[TextDelta(text=fragment)], created_at=stamp
        )


def _counted(items: Sequence[UniItem]) -> int:
    """The characters the accumulator appends for `items`."""
    chars = 0
    for item in items:
        if type(item) is not UniEvent or not item.content_items:
            continue
        content = item.content_items
        if type(content[0]) is TextDelta:
            chars += len(content[0].text)
        elif item.event_type != "stop" and type(content[0]) not in _SKIPPED:
            chars += sum(len(c.text) for c in content if type(c) is TextDelta)
    return chars


class RunHistory(HistoryLog[RunEvent]):
    """The run log: an `answer.delta` of this run is kept as a span; its `elapsed_ms` is its
    stamp, and consecutive `seq`s continue a run.

    Its batch's `answer.delta`s lie where the uni log's same batch put its text (`uni.batch`),
    when they hold all of that text (they always do for the grammar's events, one item each);
    a batch whose do not is kept as it came."""

    __slots__ = ("_uni", "run_id")

    def __init__(self, uni: UniHistory, run_id: str) -> None:
        super().__init__()
        self._uni = uni
        self.run_id = run_id

    def extend(self, items: Sequence[RunEvent]) -> None:
        """Append, waking readers."""
        if not items:
            return
        batch, self._uni.batch = self._uni.batch, None
        state = self._state()
        if batch is None:
            self._undo(state, items)
        else:
            text, start, until = batch
            try:
                chars = self._take(items, text, start)
            except (OverflowError, TypeError):
                chars = -1
            if chars != until:  # not where the uni log put the text: the batch as it came
                self._undo(state, items)
        self._wake()

    def _take(self, items: Sequence[RunEvent], text: _Text, chars: int) -> int:
        run = self._run
        end = self._end
        run_id = self.run_id
        ends = marks = stamps = None
        following = -1  # the seq a run's next fragment must have
        last = None  # the stamp of the run's last fragment
        if run is not None and run.text is text and run.ends[-1] == chars:
            ends, marks, stamps = run.ends, run.marks, run.stamps
            following = run.seq + len(ends)
            last = stamps[-1]
        for item in items:
            if type(item) is AnswerDelta and (item.run_id is run_id or item.run_id == run_id):
                at = chars
                chars += len(item.delta)
                seq = item.seq
                if ends is None or seq != following:
                    self._end = end
                    run = self._open(text, at, seq)
                    ends, marks, stamps = run.ends, run.marks, run.stamps
                    following = seq
                    last = None
                stamp = item.elapsed_ms
                if stamp != last or type(stamp) is not int:
                    marks.append(len(ends))  # type: ignore[union-attr]
                    stamps.append(stamp)  # type: ignore[union-attr]
                    last = stamp
                ends.append(chars)
                following += 1
                end += 1
                continue
            self._end = end
            self._raw(item)
            end = self._end
            run = ends = marks = stamps = last = None
        self._end = end
        self._run = run
        return chars

    def _rebuild(self, fragment: str, stamp: int, seq: int) -> RunEvent:
        return AnswerDelta(run_id=self.run_id, seq=seq, elapsed_ms=stamp, delta=fragment)
