"""The terminal sink: the answer as it streams, a spinner until the first token, progress and
failures on stderr, and a retry's void text erased in place (`rillet.transports.sinks` says why
its writes are synchronous)."""

from __future__ import annotations

import os
import stat
import sys
import unicodedata
from contextlib import asynccontextmanager
from typing import IO, TYPE_CHECKING, TextIO

import trio
from rillet._core._explain import RETRY_SAID
from rillet._core._runevents import (
    AnswerDelta,
    AttemptResetEvent,
    ReasoningDelta,
    RunDone,
    StatusEvent,
    ToolCallStarted,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._turn._turn import SinkBatch


__all__ = ["TerminalSink"]

_SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ASCII_FRAMES = "-\\|/"
_TICK = 0.1  # seconds between spinner frames under `TerminalSink.open`
_DEFAULT_SIZE = (80, 24)  # columns, lines of a terminal that cannot be asked
_DIM, _UNDIM = "\x1b[2m", "\x1b[22m"
_CLEAR_LINE = "\r\x1b[K"
_CLEAR_DOWN = "\x1b[J"


def _seconds(ms: int) -> str:
    """A delay for people: `0.1 s`, `5 s`, `1.2 s`; under 50 ms in milliseconds."""
    if ms < 50:
        return f"{ms} ms"
    text = f"{ms / 1000:.1f}"
    return f"{text.removesuffix('.0')} s"


def _char_width(ch: str) -> int:
    """Columns a character takes on a terminal: 2 for East Asian wide, 0 for combining marks
    and control or format characters, else 1."""
    if unicodedata.east_asian_width(ch) in ("W", "F"):
        return 2
    if unicodedata.category(ch) in ("Mn", "Me", "Cc", "Cf"):
        return 0
    return 1


class _Screen:
    """Where the cursor is on the terminal `out` writes to, counted from an anchor.

    Follows every character written to the terminal (answer text, and the error stream's
    lines when both streams share it) the way a VT100-style terminal moves its cursor: wrapping
    at the last column with the wrap deferred until the next character, `\\n` as CR LF. With an
    anchor set, `rows` is how many rows below the anchor's row the cursor is, so the sink can
    move back there and clear everything after it.
    """

    __slots__ = ("anchor_col", "anchored", "col", "columns", "lines", "rows")

    def __init__(self, columns: int, lines: int) -> None:
        self.columns = max(columns, 2)
        self.lines = max(lines, 2)
        self.col = 0  # 0..columns; == columns means "wrap pending"
        self.rows = 0
        self.anchored = False
        self.anchor_col = 0

    def anchor(self) -> None:
        """Remember the cursor position as the start of what a reset would erase."""
        self.anchored = True
        self.anchor_col = min(self.col, self.columns - 1)
        self.rows = 0

    def advance(self, text: str) -> None:
        """Move the cursor as writing `text` would."""
        segments = text.split("\n")
        last = len(segments) - 1
        for i, segment in enumerate(segments):
            if segment:
                if segment.isascii() and segment.isprintable():
                    self._advance_plain(len(segment))
                else:
                    self._advance_chars(segment)
            if i < last:
                self.rows += 1
                self.col = 0

    def _advance_plain(self, n: int) -> None:
        cols = self.columns
        if self.col + n <= cols:
            self.col += n
            return
        rest = n - (cols - self.col)
        self.rows += 1 + (rest - 1) // cols
        self.col = (rest - 1) % cols + 1

    def _advance_chars(self, segment: str) -> None:
        cols = self.columns
        for ch in segment:
            if ch == "\r":
                self.col = 0
            elif ch == "\t":
                if self.col < cols:
                    self.col = min((self.col // 8 + 1) * 8, cols - 1)
            elif ch == "\b":
                self.col = max(0, min(self.col, cols - 1) - 1)
            else:
                width = _char_width(ch)
                if width == 0:
                    continue
                if self.col + width > cols:
                    self.rows += 1
                    self.col = 0
                self.col += width

    def erase_sequence(self) -> str:
        """The escapes that move the cursor back to the anchor and clear the screen below it."""
        up = f"\x1b[{self.rows}A" if self.rows else ""
        right = f"\x1b[{self.anchor_col}C" if self.anchor_col else ""
        return f"\r{up}{right}{_CLEAR_DOWN}"

    @property
    def anchor_visible(self) -> bool:
        """Whether the anchor's row is still on the screen (not scrolled into the history)."""
        return self.rows <= self.lines - 1


def _regular_file(stream: IO[str]) -> int | None:
    """The descriptor of `stream` when it is a regular file (which can be cut back), else
    None."""
    try:
        fd = stream.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _terminal_size(stream: IO[str]) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return _DEFAULT_SIZE
    return size.columns, size.lines


def _same_terminal(a: IO[str], b: IO[str]) -> bool:
    """Whether two terminal streams show on one screen; assumed when it cannot be told (the
    interactive case: stdout and stderr on the same terminal)."""
    if a is b:
        return True
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):
        return True
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)


def _can_encode(stream: IO[str], text: str) -> bool:
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class TerminalSink:
    """Shows a turn on a terminal: the answer on `out`, everything else on `err`.

    - The answer text is written to `out` as it arrives and flushed once per batch.
    - Retries, rate-limit waits and the final error are one-line messages on `err`
      (`retrying (attempt 2) in 0.1 s: could not connect`, `rate limited: waiting 5 s`,
      `error: timeout`); a completed run adds nothing there. A tool call is one line:
      `→ calling get_weather`.
    - Reasoning goes to `err`, dimmed on a terminal, only with `show_reasoning` (and only
      arrives when the turn was started with `reasoning=True`).
    - At the end, `out` gets a final newline if the text did not end with one.

    An `attempt.reset` voids text already printed. When `out` is a terminal, the sink knows
    where on the screen the voided attempt's output began (it follows the cursor, wrapping
    included) and erases it with cursor movement: up to that row and column, then clear to the
    end of the screen; retry messages printed after it are printed again, so the screen reads as
    if the voided attempt had never shown. If that start has scrolled off the screen, or `out`
    is a regular file (`rillet run … > answer.txt`), the file is cut back to where the voided
    attempt's text began, so it holds the answer exactly once. Where nothing can be taken back
    (a pipe, or a screen whose start has scrolled off), the new text starts on a new line of
    `out` and `err` gets a marker line, `[attempt 2: output restarted]`, so a reader can tell
    where the valid text begins. A reset after an attempt that printed nothing prints nothing.

    While no answer text has arrived (at the start, and again during a retry) a spinner with the
    elapsed time runs on `err` when it is a terminal (`spinner=None`), or always with
    `spinner=True`; it is erased before anything else is written. Used directly, the sink
    redraws it only when a batch arrives; `async with TerminalSink.open(...) as sink:` also runs
    a ticker task (ten frames a second) in its own nursery for the duration of the block.

    Writes stop for good at the first `BrokenPipeError` on `out`, which sets `broken_pipe`;
    one on `err` silences `err` only.

    Args:
        out: where the answer goes; None for the current `sys.stdout`.
        err: where everything else goes; None for the current `sys.stderr`.
        show_reasoning: print the reasoning deltas the turn delivers.
        spinner: show the waiting spinner; None means when `err` is a terminal.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        *,
        show_reasoning: bool = False,
        spinner: bool | None = None,
    ) -> None:
        self._out: TextIO = out if out is not None else sys.stdout
        self._err: TextIO = err if err is not None else sys.stderr
        self.show_reasoning = show_reasoning
        self.broken_pipe = False
        self._err_dead = False
        out_tty = _isatty(self._out)
        err_tty = _isatty(self._err)
        self._spinner = err_tty if spinner is None else spinner
        self._dim = err_tty
        self._shared = out_tty and err_tty and _same_terminal(self._out, self._err)
        self._screen = _Screen(*_terminal_size(self._out)) if out_tty else None
        self._file = None if out_tty else _regular_file(self._out)  # out's fd, if a file
        self._file_anchor: int | None = None  # where in that file the attempt's text began
        fancy = _can_encode(self._err, _SPINNER_FRAMES + "→")
        self._frames = _SPINNER_FRAMES if fancy else _ASCII_FRAMES
        self._arrow = "→" if fancy else "->"
        # stream state
        self._out_col0 = True  # out's last character was a newline (or nothing was written)
        self._err_col0 = True
        self._out_dirty = False
        self._err_dirty = False
        self._in_reasoning = False  # err is in the middle of reasoning text
        # the current attempt (since the last reset)
        self._shown = False  # it has shown something a reset voids
        self._shown_elsewhere = False  # ...somewhere the screen cannot erase
        self._notes: list[str] = []  # messages printed on the screen after the anchor
        self._anchor_out_col0 = True
        # spinner
        self._waiting = True
        self._spinner_on = False
        self._frame = 0
        self._ticking = False
        self._elapsed_ms = 0
        self._t0: float | None = None
        self._started = False
        self._done = False
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        out: TextIO | None = None,
        err: TextIO | None = None,
        *,
        show_reasoning: bool = False,
        spinner: bool | None = None,
    ) -> AsyncIterator[TerminalSink]:
        """A sink whose spinner ticks on its own: a ticker task runs in this block's nursery and
        stops when the block ends (or the sink is closed). Takes the constructor's arguments."""
        sink = cls(out, err, show_reasoning=show_reasoning, spinner=spinner)
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            if sink._spinner:
                sink._ticking = True
                nursery.start_soon(sink._tick)
            try:
                yield sink
            except GeneratorExit:
                raise
            except BaseException as exc:  # re-raised below, unwrapped, once the ticker is gone
                error = exc
            finally:
                nursery.cancel_scope.cancel()
                sink._ticking = False
                sink._hide_spinner()
                sink._flush()
        if error is not None:
            raise error

    # --- the Sink protocol --------------------------------------------------------------------

    async def deliver(self, batch: SinkBatch) -> None:
        """Show one batch's run events, then flush both streams."""
        if self._closed or self.broken_pipe:
            return
        events = batch.run
        if events:
            last = events[-1].elapsed_ms
            if self._t0 is None:
                self._t0 = trio.current_time() - last / 1000
            self._elapsed_ms = max(self._elapsed_ms, last)
            self._started = True
        answer: list[str] = []
        reasoning: list[str] = []
        for event in events:
            kind = type(event)
            if kind is AnswerDelta:
                if reasoning:
                    self._reasoning("".join(reasoning))
                    reasoning.clear()
                answer.append(event.delta)  # type: ignore[union-attr]
                continue
            if answer:
                self._answer("".join(answer))
                answer.clear()
            if kind is ReasoningDelta:
                if self.show_reasoning:
                    reasoning.append(event.delta)  # type: ignore[union-attr]
                continue
            if reasoning:
                self._reasoning("".join(reasoning))
                reasoning.clear()
            if kind is StatusEvent:
                assert isinstance(event, StatusEvent)
                self._status(event)
            elif kind is ToolCallStarted:
                assert isinstance(event, ToolCallStarted)
                self._line(f"{self._arrow} calling {event.name}", voidable=True)
            elif kind is AttemptResetEvent:
                assert isinstance(event, AttemptResetEvent)
                self._reset(event.attempt)
            elif kind is RunDone:
                assert isinstance(event, RunDone)
                self._finish(event)
        if answer:
            self._answer("".join(answer))
        if reasoning:
            self._reasoning("".join(reasoning))
        # without a ticker each batch draws the next frame; with one, only a spinner a write hid
        if (not self._ticking or not self._spinner_on) and self._show_spinner():
            self._frame += 1
        self._flush()

    async def close(self) -> None:
        """End the output cleanly (spinner gone, final newline) and flush; closes no stream."""
        if self._closed:
            return
        if not self._done:
            self._finish(None)
        self._closed = True
        self._hide_spinner()
        self._flush()

    # --- what each event shows ----------------------------------------------------------------

    def _answer(self, text: str) -> None:
        self._waiting = False
        self._end_reasoning()
        if self._file is not None and self._file_anchor is None:
            self._file_anchor = self._file_position()
            self._anchor_out_col0 = self._out_col0
        if self._file_anchor is not None:
            self._shown = True  # what a reset voids, it cuts from the file
        else:
            self._void_start(on_screen=self._screen is not None)
        self._write_out(text)

    def _reasoning(self, text: str) -> None:
        if not self._in_reasoning:
            self._err_line_start()
        self._void_start(on_screen=self._shared)
        self._in_reasoning = True
        if self._dim:
            self._write_err(_DIM, raw=True)
            self._write_err(text)
            self._write_err(_UNDIM, raw=True)
        else:
            self._write_err(text)

    def _status(self, event: StatusEvent) -> None:
        delay = _seconds(event.delay_ms) if event.delay_ms else ""
        phase = event.phase
        if phase in ("requesting", "hedged"):  # a hedge is a wait the person does not see
            return
        self._waiting = True
        if phase == "backing_off":
            message = f"retrying (attempt {event.attempt})" + (f" in {delay}" if delay else "")
        elif phase == "waiting_rate_limit" and event.reason_code == "overloaded":
            self._line("the provider is overloaded" + (f": waiting {delay}" if delay else ""))
            return
        elif phase == "waiting_rate_limit":
            message = "rate limited" + (f": waiting {delay}" if delay else "")
        elif phase == "rescuing":
            message = f"retrying without streaming (attempt {event.attempt})"
        else:
            message = f"{phase} (attempt {event.attempt})"
        said = RETRY_SAID.get(event.reason_code or "")
        self._line(f"{message}: {said}" if said else message)

    def _reset(self, attempt: int) -> None:
        self._waiting = True
        screen = self._screen
        erased = False
        if self._file_anchor is not None and self._rewind_file(self._file_anchor):
            self._out_col0 = self._anchor_out_col0
            erased = True
        elif screen is not None and screen.anchored and screen.anchor_visible:
            if self._shared:  # the voided reasoning, if any, goes with the rest
                self._in_reasoning = False
                self._err_col0 = True
            self._write_out(screen.erase_sequence(), raw=True)
            screen.col = screen.anchor_col
            screen.anchored = False
            self._out_col0 = self._anchor_out_col0
            notes, self._notes = self._notes, []
            for note in notes:
                self._line(note)
            erased = True
        elif self._shown and not self._out_col0:
            self._write_out("\n")
        if self._shown_elsewhere or (self._shown and not erased):
            self._line(f"[attempt {attempt}: output restarted]")
        if screen is not None:
            screen.anchored = False
        self._file_anchor = None
        self._notes = []
        self._shown = False
        self._shown_elsewhere = False

    def _file_position(self) -> int | None:
        """Where the next byte written to `out` (a regular file) lands; None if unknown."""
        assert self._file is not None
        try:
            self._out.flush()
            return os.lseek(self._file, 0, os.SEEK_CUR)
        except (OSError, ValueError):
            self._file = None
            return None

    def _rewind_file(self, position: int) -> bool:
        """Cut `out` (a regular file) back to `position`; False if it cannot be."""
        assert self._file is not None
        try:
            self._out.flush()
            os.ftruncate(self._file, position)
            os.lseek(self._file, position, os.SEEK_SET)
        except (OSError, ValueError):
            return False
        return True

    def _finish(self, done: RunDone | None) -> None:
        self._done = True
        self._waiting = False
        self._hide_spinner()
        self._end_reasoning()
        if not self._out_col0:
            self._write_out("\n")
        if done is None or done.status == "completed":
            return
        if done.status == "cancelled":
            self._line("cancelled")
            return
        message = f"error: {done.code}"
        if done.retry_after_ms is not None:
            message += f" (retry after {_seconds(done.retry_after_ms)})"
        self._line(message)

    # --- layout ---------------------------------------------------------------------------------

    def _void_start(self, *, on_screen: bool) -> None:
        """Note that the attempt shows something a reset voids; anchor the screen at its start."""
        self._shown = True
        screen = self._screen
        if on_screen and screen is not None:
            if not screen.anchored:
                screen.anchor()
                self._anchor_out_col0 = self._out_col0
        else:
            self._shown_elsewhere = True

    def note(self, text: str) -> None:
        """Write a line of the caller's own on err (an agent's tool run, say) in order with the
        sink's own lines: the spinner is cleared first, and the line starts a line of its own,
        so no spinner frame is left in front of it."""
        self._line(text)
        self._flush()

    def _line(self, text: str, *, voidable: bool = False) -> None:
        """One message line on err, starting at the beginning of a line."""
        self._end_reasoning()
        self._err_line_start()
        if voidable:
            self._void_start(on_screen=self._shared)
        elif self._shared and self._screen is not None and self._screen.anchored:
            self._notes.append(text)
        self._write_err(text + "\n")

    def _err_line_start(self) -> None:
        """Put err's (or the shared screen's) cursor at the start of a line."""
        if self._shared and self._screen is not None:
            if self._screen.col != 0:
                self._write_err("\n")
        elif not self._err_col0:
            self._write_err("\n")

    def _end_reasoning(self) -> None:
        if self._in_reasoning:
            self._in_reasoning = False
            if not self._err_col0:
                self._write_err("\n")

    # --- the spinner ----------------------------------------------------------------------------

    async def _tick(self) -> None:
        while not self._closed:
            await trio.sleep(_TICK)
            if self._t0 is not None:
                now_ms = int((trio.current_time() - self._t0) * 1000)
                self._elapsed_ms = max(self._elapsed_ms, now_ms)
            if self._show_spinner():
                self._frame += 1
                self._flush()

    def _show_spinner(self) -> bool:
        """Draw the spinner if the run is waiting for text and err is at a line start."""
        if not (self._spinner and self._waiting and self._started) or self._done:
            return False
        if self._err_dead or self.broken_pipe:
            return False
        if self._shared and self._screen is not None:
            at_start = self._screen.col == 0
        else:
            at_start = self._err_col0 or self._spinner_on
        if not at_start:
            return False
        frame = self._frames[self._frame % len(self._frames)]
        self._raw_err(f"\r{frame} waiting {self._elapsed_ms / 1000:.1f} s\x1b[K")
        self._spinner_on = True
        return True

    def _hide_spinner(self) -> None:
        if self._spinner_on:
            self._spinner_on = False
            self._raw_err(_CLEAR_LINE)

    # --- writing --------------------------------------------------------------------------------

    def _write_out(self, text: str, *, raw: bool = False) -> None:
        if self.broken_pipe or not text:
            return
        self._hide_spinner()
        if self._err_dirty:
            self._flush_err()  # keep the order when both streams reach one screen or file
        try:
            self._out.write(text)
        except BrokenPipeError:
            self.broken_pipe = True
            return
        self._out_dirty = True
        if raw:
            return
        self._out_col0 = text[-1] == "\n"
        if self._screen is not None:
            self._screen.advance(text)

    def _write_err(self, text: str, *, raw: bool = False) -> None:
        if self._err_dead or self.broken_pipe or not text:
            return
        self._hide_spinner()
        if self._out_dirty:
            self._flush_out()
        self._raw_err(text)
        if raw:
            return
        self._err_col0 = text[-1] == "\n"
        if self._shared and self._screen is not None:
            self._screen.advance(text)

    def _raw_err(self, text: str) -> None:
        if self._err_dead or self.broken_pipe:
            return
        try:
            self._err.write(text)
        except BrokenPipeError:
            self._err_dead = True
            return
        self._err_dirty = True

    def _flush(self) -> None:
        if self._out_dirty:
            self._flush_out()
        if self._err_dirty:
            self._flush_err()

    def _flush_out(self) -> None:
        self._out_dirty = False
        if self.broken_pipe:
            return
        try:
            self._out.flush()
        except BrokenPipeError:
            self.broken_pipe = True

    def _flush_err(self) -> None:
        self._err_dirty = False
        if self._err_dead:
            return
        try:
            self._err.flush()
        except BrokenPipeError:
            self._err_dead = True
