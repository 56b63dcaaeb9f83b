"""The stream handler, F01-F09: streams that complete, stall, or end early (the harness:
`handler_support`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
from rillet import (
    RescueFailed,
    TurnTimeout,
)
from rillet._core._policy import Outcome
from rillet._core._runevents import AnswerDelta

from ..handler_support import (
    END_OK,
    END_TIMEOUT,
    HANG,
    KEY,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    ROLE,
    SILENT,
    TEXT,
    Answer,
    Item,
    check,
    expect,
    ok,
    partial,
    play,
    policy,
    rescue_ok,
    statuses,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    import trio.testing


# --- F01-F09: streams that complete, stall, or end early ------------------------------------------


async def test_f01_ok_completes_with_one_request(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([ok()])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=0.0,
    )
    assert run.fake.sent[0].stream
    assert run.fake.sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert run.result.error is None
    assert run.result.time_to_first_event == pytest.approx(0.0)


@pytest.mark.parametrize("silent", [SILENT, Answer(hang=True)], ids=["headers", "no-headers"])
async def test_f03_silence_times_out_twice_then_the_rescue_answers(
    autojump_clock: trio.testing.MockClock, silent: Answer
) -> None:
    run = await play([silent], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 120.1, 240.1],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=240.1,
    )
    rescue = run.fake.sent[2]
    assert not rescue.stream
    assert rescue.body["stream"] is False
    assert [phase for phase, _, _ in statuses(run)] == ["backing_off", "rescuing"]
    assert statuses(run)[0] == ("backing_off", 120_000, 100)


async def test_f03_rescue_hangs_event_timeout_at_the_total_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([SILENT], rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 120.1, 240.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=300.0,
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
    assert isinstance(error.stream_error, TurnTimeout)
    assert error.stream_error.deadline == "initial-event"
    assert isinstance(error.rescue_error, TurnTimeout)
    assert error.rescue_error.deadline == "rescue"


async def test_f03_silence_then_ok_completes_without_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([SILENT, ok()])
    check(
        run,
        at=[0.0, 120.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=120.1,
    )


async def test_f04_stall_mid_stream_is_cut_at_180_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3, HANG), ok()])
    check(
        run,
        at=[0.0, 180.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*3", "reset", *OK_SEEN, END_OK),
        text=TEXT,
        ended=180.1,
    )
    assert statuses(run) == [("backing_off", 180_000, 100)]
    assert not run.result.partial  # the answer completed: the voided attempt is not "partial"


def slow_drip() -> Answer:
    """A delta every 59 s (at 59, 118, 177, 236, 295), never the terminal event."""
    body: list[Item] = [59.0, ROLE, OK[1]]
    for chunk in OK[2:6]:
        body += [59.0, chunk]
    return Answer(body=[*body, HANG])


async def test_f06_total_deadline_then_the_rescue_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], rescue=rescue_ok(wait=10.0))
    check(
        run,
        at=[0.0, 300.0],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D*5", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=310.0,
    )
    deltas = [e.elapsed_ms for e in run.events if isinstance(e, AnswerDelta)]
    assert deltas == [59_000, 118_000, 177_000, 236_000, 295_000, 310_000]


async def test_f06_rescue_hangs_total_timeout_at_its_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 300.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D*5", END_TIMEOUT),
        text=TEXT,
        ended=420.0,
    )
    assert run.result.partial


async def test_f06_without_rescue_total_timeout_keeps_the_partial_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], pol=policy(rescue=False))
    check(
        run,
        at=[0.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D*5", END_TIMEOUT),
        text=TEXT,
        ended=300.0,
    )
    assert isinstance(run.result.error, TurnTimeout)
    assert run.result.error.deadline == "total"


async def test_f07_always_truncated_spends_the_budget_then_rescues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.RESCUED,
        saw=expect("start", *["D*3", "reset"] * 4, "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=0.7,
    )
    assert [s.stream for s in run.fake.sent] == [True] * 4 + [False]


async def test_f07_backoff_jitter_stays_within_90_to_100_percent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    u = 0.999
    run = await play([partial(3)], rescue=rescue_ok(), pol=policy(random=lambda: u))
    delays = [b - a for a, b in zip(run.times, run.times[1:4], strict=False)]
    nominal = [0.1, 0.2, 0.4]
    assert delays == pytest.approx([d * (1 - 0.1 * u) for d in nominal], abs=1e-9)
    assert all(0.9 * d <= got <= d for got, d in zip(delays, nominal, strict=True))
    assert run.result.outcome is Outcome.RESCUED
