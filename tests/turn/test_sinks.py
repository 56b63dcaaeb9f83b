"""The terminal sink: batches fed by hand (the JSON Lines sink and a real turn:
`test_sinks_jsonl`).

Terminal output is checked byte for byte; where cursor movement matters, the transcript is also
played on a small VT100-style screen (`render`) to check what a person would see.
"""

from __future__ import annotations

import io

import pytest
import trio
import trio.testing
from rillet._core._events import (
    ToolCallDelta,
    ToolCallDone,
    delta_event,
)
from rillet._core._policy import Outcome
from rillet.transports.sinks import TerminalSink

from ..sinks_support import (
    CLEAR_LINE,
    BrokenAfter,
    Clock,
    FakeTTY,
    Recording,
    batch,
    builder,
    completed,
    feed,
    render,
    shown,
    text,
    thinking,
)


def test_render_wraps_late_and_erases() -> None:
    """The checking screen itself: deferred wrap, CR LF, cursor up and clear to the end."""
    assert render("a" * 80 + "\nb") == ["a" * 80, "b"]
    assert render("a" * 81) == ["a" * 80, "a"]
    assert render("keep\nxx\nyy\r\x1b[1A\x1b[Jzz") == ["keep", "zz"]


# --- terminal: text, flushing, lines ------------------------------------------------------------


async def test_answer_text_is_written_as_it_arrives_and_flushed_once_per_batch() -> None:
    out, err = Recording(), io.StringIO()
    sink = TerminalSink(out, err)
    b = builder()
    await sink.deliver(batch(b.started("openai-chat", "gpt"), text(b, "Hel"), text(b, "lo")))
    assert out.getvalue() == "Hello"
    assert out.flushed == ["Hello"]
    assert out.writes == 1  # the batch's fragments go out together, not one write each
    await sink.deliver(batch(text(b, ", world")))
    assert out.flushed == ["Hello", "Hello, world"]
    await feed(sink, completed(b))
    assert out.getvalue() == "Hello, world\n"
    assert err.getvalue() == ""


async def test_final_newline_is_added_only_when_the_text_lacks_one() -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    await feed(TerminalSink(out, err), batch(b.started("p", "m"), text(b, "line\n")), completed(b))
    assert out.getvalue() == "line\n"

    out = io.StringIO()
    b = builder()
    await feed(TerminalSink(out, err), batch(b.started("p", "m")), completed(b))
    assert out.getvalue() == ""
    assert err.getvalue() == ""


async def test_status_messages_are_one_line_each_on_err() -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    await feed(
        TerminalSink(out, err),
        batch(b.started("p", "m"), b.status("requesting", 1)),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.status("waiting_rate_limit", 3, 5.0)),
        batch(b.status("rescuing", 4)),
        batch(text(b, "ok")),
        completed(b),
    )
    assert err.getvalue() == (
        "retrying (attempt 2) in 0.1 s\n"
        "rate limited: waiting 5 s\n"
        "retrying without streaming (attempt 4)\n"
    )
    assert out.getvalue() == "ok\n"


async def test_a_status_mid_text_starts_on_its_own_line_of_err() -> None:
    """Reasoning left err mid-line: the next message begins on a fresh line."""
    out, err = io.StringIO(), io.StringIO()
    b = builder(reasoning=True)
    await feed(
        TerminalSink(out, err, show_reasoning=True),
        batch(b.started("p", "m"), thinking(b, "hmm")),
        batch(b.status("backing_off", 2, 1.25)),
        completed(b),
    )
    assert err.getvalue() == "hmm\nretrying (attempt 2) in 1.2 s\n"


async def test_tool_calls_show_as_one_line_each() -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    start = b.uni(
        delta_event(ToolCallDelta(name="get_weather", arguments="", tool_call_id="c1"), 0)
    )
    more = b.uni(delta_event(ToolCallDelta(name="", arguments='{"city"', tool_call_id="c1"), 0))
    done = b.uni(
        delta_event(
            ToolCallDone(name="get_weather", arguments={"city": "Oslo"}, tool_call_id="c1"), 0
        )
    )
    assert more is None
    await feed(
        TerminalSink(out, err),
        batch(b.started("p", "m"), text(b, "Let me check."), shown(start)),
        batch(shown(done)),
        completed(b),
    )
    assert err.getvalue() == "→ calling get_weather\n"
    assert out.getvalue() == "Let me check.\n"


async def test_reasoning_is_shown_only_when_enabled() -> None:
    b = builder(reasoning=True)
    batches = [
        batch(b.started("p", "m"), thinking(b, "Let me "), thinking(b, "think.")),
        batch(text(b, "Answer")),
        completed(b),
    ]
    out, err = io.StringIO(), io.StringIO()
    await feed(TerminalSink(out, err), *batches)
    assert (out.getvalue(), err.getvalue()) == ("Answer\n", "")

    out, err = io.StringIO(), io.StringIO()
    await feed(TerminalSink(out, err, show_reasoning=True), *batches)
    assert (out.getvalue(), err.getvalue()) == ("Answer\n", "Let me think.\n")


async def test_reasoning_is_dimmed_when_err_is_a_terminal() -> None:
    b = builder(reasoning=True)
    out, err = io.StringIO(), FakeTTY()
    await feed(
        TerminalSink(out, err, show_reasoning=True, spinner=False),
        batch(b.started("p", "m"), thinking(b, "Let me "), thinking(b, "think.")),
        batch(text(b, "Answer")),
        completed(b),
    )
    assert err.getvalue() == "\x1b[2mLet me think.\x1b[22m\n"
    assert out.getvalue() == "Answer\n"


@pytest.mark.parametrize(
    ("outcome", "retry_after", "expected"),
    [
        (Outcome.RATE_LIMITED, 5.0, "error: rate_limited (retry after 5 s)\n"),
        (Outcome.TOTAL_TIMEOUT, None, "error: timeout\n"),
        (Outcome.CANCELLED, None, "cancelled\n"),
    ],
)
async def test_errors_end_with_one_summary_line_on_err(
    outcome: Outcome, retry_after: float | None, expected: str
) -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    final = b.finish(outcome, None, attempts=1, retry_after=retry_after)
    await feed(TerminalSink(out, err), batch(b.started("p", "m"), text(b, "Hel")), batch(*final))
    assert err.getvalue() == expected
    assert out.getvalue() == "Hel\n"


# --- terminal: resets -----------------------------------------------------------------------------


async def test_reset_on_a_pipe_marks_err_and_restarts_on_a_new_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    await feed(
        TerminalSink(out, err),
        batch(b.started("p", "m"), text(b, "Hel")),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "Hello")),
        completed(b),
    )
    assert out.getvalue() == "Hel\nHello\n"
    assert err.getvalue() == "retrying (attempt 2) in 0.1 s\n[attempt 2: output restarted]\n"


async def test_reset_after_an_attempt_that_showed_nothing_prints_nothing() -> None:
    out, err = io.StringIO(), io.StringIO()
    b = builder()
    await feed(
        TerminalSink(out, err),
        batch(b.started("p", "m"), b.reset(2), text(b, "Hi")),
        completed(b),
    )
    assert (out.getvalue(), err.getvalue()) == ("Hi\n", "")


async def test_reset_on_a_terminal_erases_the_voided_text_and_keeps_the_retry_note() -> None:
    tty = FakeTTY()
    tty.write("$ rillet ask\n")  # what was on the screen before: must survive
    b = builder()
    await feed(
        TerminalSink(tty, tty, spinner=False),
        batch(b.started("p", "m"), text(b, "Hello wor")),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "Hi there")),
        completed(b),
    )
    note = "retrying (attempt 2) in 0.1 s\n"
    assert tty.getvalue() == (
        "$ rillet ask\nHello wor\n" + note + "\r\x1b[2A\x1b[J" + note + "Hi there\n"
    )
    assert render(tty.getvalue()) == ["$ rillet ask", note.strip(), "Hi there"]


async def test_erasing_counts_wrapped_rows_wide_characters_and_newlines() -> None:
    tty = FakeTTY()
    tty.write("$ prompt\n")
    b = builder(reasoning=True)
    voided = "x" * 150 + "\n" + "界" * 45 + "\n\nend"  # 2 rows, 2 rows (90 columns), 1, 1
    await feed(
        TerminalSink(tty, tty, show_reasoning=True, spinner=False),
        batch(b.started("p", "m"), thinking(b, "plan"), text(b, voided)),
        batch(
            shown(b.uni(delta_event(ToolCallDelta(name="f", arguments="", tool_call_id="1"), 0)))
        ),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "fresh")),
        completed(b),
    )
    screen = render(tty.getvalue())
    assert screen == ["$ prompt", "retrying (attempt 2) in 0.1 s", "fresh"]
    # up 9 rows: plan 1, x 2, 界 2 (90 columns), the empty row 1, end 1, the tool line, the note
    assert "\r\x1b[9A\x1b[J" in tty.getvalue()


async def test_reset_on_a_terminal_with_err_elsewhere_erases_only_the_text() -> None:
    out, err = FakeTTY(), io.StringIO()
    b = builder()
    await feed(
        TerminalSink(out, err),
        batch(b.started("p", "m"), text(b, "Hello wor")),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "Hi there")),
        completed(b),
    )
    assert out.getvalue() == "Hello wor\r\x1b[JHi there\n"
    assert err.getvalue() == "retrying (attempt 2) in 0.1 s\n"


async def test_reset_falls_back_to_the_marker_once_the_text_scrolled_off() -> None:
    tty = FakeTTY()
    b = builder()
    long = "".join(f"line {i}\n" for i in range(30)) + "partial"
    await feed(
        TerminalSink(tty, tty, spinner=False),
        batch(b.started("p", "m"), text(b, long)),
        batch(b.reset(2), text(b, "new")),
        completed(b),
    )
    assert tty.getvalue() == long + "\n[attempt 2: output restarted]\nnew\n"


# --- terminal: spinner ----------------------------------------------------------------------------


async def test_spinner_redraws_per_batch_and_is_cleared_before_the_text() -> None:
    tty = FakeTTY()
    clock = Clock()
    b = builder(clock=clock)
    sink = TerminalSink(tty, tty)  # spinner=None: on, because err is a terminal
    await sink.deliver(batch(b.started("p", "m")))
    assert tty.getvalue() == "\r⠋ waiting 0.0 s\x1b[K"
    clock.now = 1.5
    await sink.deliver(batch(b.status("requesting", 1)))
    clock.now = 2.0
    await feed(sink, batch(text(b, "Hi")), completed(b))
    assert tty.getvalue() == (
        "\r⠋ waiting 0.0 s\x1b[K\r⠙ waiting 1.5 s\x1b[K" + CLEAR_LINE + "Hi\n"
    )
    assert render(tty.getvalue()) == ["Hi"]


async def test_spinner_returns_while_a_retry_waits_and_never_outlives_the_run() -> None:
    tty = FakeTTY()
    b = builder()
    await feed(
        TerminalSink(tty, tty),
        batch(b.started("p", "m")),
        batch(text(b, "Hel")),
        batch(b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "Hello")),
        completed(b),
    )
    note = "retrying (attempt 2) in 0.1 s\n"
    assert tty.getvalue() == (
        "\r⠋ waiting 0.0 s\x1b[K"
        + CLEAR_LINE
        + "Hel\n"
        + note
        + "\r⠙ waiting 0.0 s\x1b[K"
        + CLEAR_LINE
        + "\r\x1b[2A\x1b[J"
        + note
        + "Hello\n"
    )
    assert render(tty.getvalue()) == [note.strip(), "Hello"]


async def test_no_spinner_when_disabled_or_err_is_not_a_terminal() -> None:
    b = builder()
    batches = [batch(b.started("p", "m")), batch(text(b, "Hi")), completed(b)]
    tty = FakeTTY()
    await feed(TerminalSink(tty, tty, spinner=False), *batches)
    assert tty.getvalue() == "Hi\n"
    out, err = FakeTTY(), io.StringIO()
    await feed(TerminalSink(out, err), *batches)
    assert (out.getvalue(), err.getvalue()) == ("Hi\n", "")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Virtual time for the ticker test (pytest-trio uses a clock fixture the test requests)."""
    return trio.testing.MockClock(autojump_threshold=0)


async def test_open_runs_a_ticker_until_text_arrives_and_stops_with_the_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tty = FakeTTY()
    b = builder(clock=Clock())
    async with TerminalSink.open(tty, tty) as sink:
        await sink.deliver(batch(b.started("p", "m")))
        await trio.sleep(0.25)  # two ticks: 0.1 and 0.2
        await sink.deliver(batch(text(b, "Hi")))
        await trio.sleep(0.5)  # text arrived: the ticker draws nothing more
        await sink.deliver(completed(b))
        await sink.close()
    after = tty.getvalue()
    await trio.sleep(1.0)
    assert tty.getvalue() == after  # no task outlived the block
    assert after == (
        "\r⠋ waiting 0.0 s\x1b[K"
        "\r⠙ waiting 0.1 s\x1b[K"
        "\r⠹ waiting 0.2 s\x1b[K" + CLEAR_LINE + "Hi\n"
    )


async def test_open_reraises_the_blocks_error_unwrapped() -> None:
    with pytest.raises(KeyError):
        async with TerminalSink.open(FakeTTY(), FakeTTY()):
            raise KeyError("boom")


# --- terminal: broken pipe ------------------------------------------------------------------------


async def test_a_broken_pipe_on_out_stops_the_output_without_raising() -> None:
    out, err = BrokenAfter(ok=1), io.StringIO()
    b = builder()
    sink = TerminalSink(out, err)
    states = []
    await sink.deliver(batch(b.started("p", "m"), text(b, "first")))
    states.append(sink.broken_pipe)
    await sink.deliver(batch(text(b, "second")))
    states.append(sink.broken_pipe)
    await feed(sink, batch(text(b, "third")), batch(*b.finish(Outcome.FAILED, None, attempts=1)))
    assert states == [False, True]
    assert out.getvalue() == "first"
    assert out.attempts == 2  # nothing was tried after the pipe broke
    assert err.getvalue() == ""  # and no error line follows a reader that went away


async def test_a_broken_pipe_on_flush_is_caught_too() -> None:
    class BrokenFlush(io.StringIO):
        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    sink = TerminalSink(BrokenFlush(), io.StringIO())
    b = builder()
    await feed(sink, batch(b.started("p", "m"), text(b, "x")), completed(b))
    assert sink.broken_pipe
