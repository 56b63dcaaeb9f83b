"""What the sinks' tests share: fake streams, a clock, run events made by hand, and a small
VT100-style screen (`render`) that plays a transcript as a person would see it."""

from __future__ import annotations

import io
import re
import unicodedata
from typing import TYPE_CHECKING, Any

from rillet import SinkBatch
from rillet._core._events import (
    TextDelta,
    ThinkingDelta,
    delta_event,
)
from rillet._core._policy import Outcome
from rillet._core._runevents import RunDone, RunEvent, RunEventBuilder

if TYPE_CHECKING:
    from rillet._turn._turn import UniItem
    from rillet.transports.sinks import JSONLSink, TerminalSink

CLEAR_LINE = "\r\x1b[K"


# --- pieces --------------------------------------------------------------------------------------


class FakeTTY(io.StringIO):
    """A StringIO that says it is a terminal (it has no descriptor: 80 by 24 is assumed)."""

    def isatty(self) -> bool:
        return True


class Recording(io.StringIO):
    """Counts writes and flushes, and keeps what had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flushed: list[str] = []

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


class BrokenAfter(io.StringIO):
    """A stream whose reader goes away after `ok` writes."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok
        self.attempts = 0

    def write(self, s: str) -> int:
        self.attempts += 1
        if self.attempts > self.ok:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(s)


class BrokenBytes(io.BytesIO):
    """A binary pipe whose reader is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def write(self, b: Any) -> int:
        self.attempts += 1
        raise BrokenPipeError(32, "Broken pipe")


class Clock:
    """A settable clock for `RunEventBuilder` (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def completed_done(run_id: str, seq: int) -> RunDone:
    """A completed run's `run.done` at `seq` (one attempt, one request), built by hand."""
    return RunDone(
        run_id=run_id,
        seq=seq,
        elapsed_ms=seq,
        status="completed",
        code="completed",
        attempts=1,
        requests=1,
        retryable=False,
    )


def builder(*, reasoning: bool = False, clock: Clock | None = None) -> RunEventBuilder:
    return RunEventBuilder("run-1", clock or Clock(), reasoning=reasoning)


def shown(event: RunEvent | None) -> RunEvent:
    assert event is not None
    return event


def text(b: RunEventBuilder, fragment: str) -> RunEvent:
    return shown(b.uni(delta_event(TextDelta(text=fragment), 0)))


def thinking(b: RunEventBuilder, fragment: str) -> RunEvent:
    return shown(b.uni(delta_event(ThinkingDelta(thinking=fragment), 0)))


def batch(*run: RunEvent, uni: tuple[UniItem, ...] = ()) -> SinkBatch:
    return SinkBatch(list(run), list(uni))


def completed(b: RunEventBuilder) -> SinkBatch:
    return SinkBatch(b.finish(Outcome.COMPLETED, None, attempts=1), ())


async def feed(sink: TerminalSink | JSONLSink, *batches: SinkBatch) -> None:
    for one in batches:
        await sink.deliver(one)
    await sink.close()


_ESCAPE = re.compile(r"\x1b\[(\d*)([A-Za-z])")


def render(transcript: str, columns: int = 80) -> list[str]:
    """The rows a VT100-style terminal of `columns` shows after `transcript` (`\\n` as CR LF,
    wrap deferred at the last column; CUU, CUF, ED, EL and SGR understood), right-stripped,
    trailing empty rows dropped."""
    cells: dict[tuple[int, int], str] = {}
    row = col = 0
    pending = False  # at the last column with a wrap owed
    i = 0
    while i < len(transcript):
        ch = transcript[i]
        if ch == "\x1b":
            match = _ESCAPE.match(transcript, i)
            assert match is not None, f"unknown escape at {i}: {transcript[i : i + 8]!r}"
            n, op = int(match.group(1) or 0), match.group(2)
            if op == "A":
                row, pending = max(0, row - (n or 1)), False
            elif op == "C":
                col, pending = min(columns - 1, col + (n or 1)), False
            elif op in ("J", "K"):
                for key in [k for k in cells if k[0] == row and k[1] >= col]:
                    del cells[key]
                if op == "J":
                    for key in [k for k in cells if k[0] > row]:
                        del cells[key]
            else:
                assert op == "m", f"unexpected escape {match.group(0)!r}"
            i = match.end()
            continue
        i += 1
        if ch == "\r":
            col, pending = 0, False
        elif ch == "\n":
            row, col, pending = row + 1, 0, False
        else:
            wide = unicodedata.east_asian_width(ch) in ("W", "F")
            if pending or col + (2 if wide else 1) > columns:
                row, col, pending = row + 1, 0, False
            cells[(row, col)] = ch
            if wide:
                cells[(row, col + 1)] = ""
            col += 2 if wide else 1
            if col >= columns:
                col, pending = columns - 1, True
    if not cells:
        return []
    last = max(r for r, _ in cells)
    lines = []
    for r in range(last + 1):
        width = max((c for rr, c in cells if rr == r), default=-1) + 1
        lines.append("".join(cells.get((r, c), " ") for c in range(width)).rstrip())
    return lines
