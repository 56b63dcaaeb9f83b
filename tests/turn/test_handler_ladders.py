"""The stream handler, F39-F42 and F46: the ladders together, the limiter, pings and where
deadlines start, backpressure, and the reset rule once more (D1, D2, D4; the harness:
`handler_support`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
from rillet import (
    IncompleteStreamError,
    MalformedFrameError,
    RescueFailed,
    TurnTimeout,
)
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome
from rillet._turn._ratelimit import RateLimiter
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.transports.testing import sse

from ..handler_support import (
    BAD_FRAMES,
    BASE,
    END_OK,
    END_PROVIDER,
    END_RATE,
    END_TIMEOUT,
    HANG,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    ROLE,
    SILENT,
    TEXT,
    Answer,
    SlowSink,
    anthropic_events,
    check,
    check_rate_limited_at_once,
    end_error,
    expect,
    ok,
    partial,
    play,
    policy,
    rescue_ok,
    run_done,
    status,
    statuses,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    import trio.testing


# --- F39-F42: ladders together --------------------------------------------------------------------


async def test_f39_a_fourth_transport_failure_goes_to_the_rescue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = status(429, retry_after="1")
    run = await play(
        [status(500), limited, status(500), limited, status(500), status(500), ok()],
        rescue=rescue_ok(),
    )
    check(
        run,
        at=[0.0, 0.1, 1.1, 1.3, 2.3, 2.7, 2.7],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )


async def test_f40_a_rate_limit_wait_past_the_total_deadline_is_not_waited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = status(429, retry_after="60")
    run = await play([partial(3, HANG), limited, limited, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 180.1, 240.1],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", "D*3", END_RATE),
        text="The quick brown ",
        ended=240.1,
    )
    assert run.result.retry_after == 60.0
    assert run_done(run).retry_after_ms == 60_000
    assert all(s.stream for s in run.fake.sent)


@pytest.mark.parametrize(("code", "safe"), [(429, "rate_limited"), (503, "provider_unavailable")])
async def test_f40_a_wait_ending_at_the_total_deadline_is_not_waited(
    autojump_clock: trio.testing.MockClock, code: int, safe: str
) -> None:
    # the wait must end before the total deadline: one ending on it leaves no time to stream,
    # and a rate limit never goes to the rescue
    run = await play(
        [status(code, retry_after="10"), ok()], rescue=rescue_ok(), pol=policy(total_timeout=10.0)
    )
    check_rate_limited_at_once(run, 10.0, safe)


F41_TIMES = [0.0, 180.1, 300.3, 420.7, 541.5, 663.1, 786.3, 912.7, 1042.7, 1172.7]


@pytest.mark.parametrize("rescued", [True, False], ids=["rescue-answers", "rescue-hangs"])
async def test_f41_ten_consecutive_timeouts_end_streaming(
    autojump_clock: trio.testing.MockClock, rescued: bool
) -> None:
    run = await play(
        [partial(1, HANG), SILENT],
        rescue=rescue_ok() if rescued else Answer(hang=True),
        pol=policy(transport_retries=20, total_timeout=3600.0),
    )
    if rescued:
        check(
            run,
            at=[*F41_TIMES, 1292.7],
            outcome=Outcome.RESCUED,
            saw=expect("start", "D", "reset", "D", "usage", "done", END_OK),
            text=RESCUE_TEXT,
            ended=1292.7,
        )
    else:
        check(
            run,
            at=[*F41_TIMES, 1292.7],
            outcome=Outcome.EVENT_TIMEOUT,
            saw=expect("start", "D", END_TIMEOUT),
            text="The ",
            ended=1412.7,  # the rescue's own deadline: 120 s
        )


def f42_answers() -> list[Answer]:
    """1 D then a stall; then 1 D and EOF (no terminal event) at 299.95."""
    return [partial(1, HANG), partial(1, 299.95 - 180.1)]


async def test_f42_the_total_deadline_cuts_a_backoff_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), rescue=rescue_ok())
    check(
        run,
        at=[0.0, 180.1, 300.0],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "reset", "D", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=300.0,
    )
    phases = statuses(run)
    assert phases[1] == ("backing_off", 299_950, 200)


async def test_f42_rescue_hangs_total_timeout_at_420(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 180.1, 300.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D", "reset", "D", END_TIMEOUT),
        text="The ",
        ended=420.0,
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
    assert isinstance(error.stream_error, TurnTimeout)
    assert error.stream_error.deadline == "total"


async def test_f42_without_rescue_total_timeout_at_300(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), pol=policy(rescue=False))
    check(
        run,
        at=[0.0, 180.1],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D", "reset", "D", END_TIMEOUT),
        text="The ",
        ended=300.0,
    )


# --- F46 and D4: the limiter, pings, where deadlines start ----------------------------------------


async def drained(rpm: int, key: str = BASE) -> RateLimiter:
    """A limiter whose bucket for `key` has no token left at `rpm`."""
    limiter = RateLimiter()
    for _ in range(rpm):
        assert await limiter.acquire(key, rpm, 30.0) == 0.0
    return limiter


@pytest.mark.parametrize(("rpm", "first"), [(6, 10.0), (1, 30.0)], ids=["6rpm", "1rpm-capped"])
async def test_f46_a_drained_bucket_delays_the_request(
    autojump_clock: trio.testing.MockClock, rpm: int, first: float
) -> None:
    run = await play([ok()], pol=policy(requests_per_minute=rpm), limiter=await drained(rpm))
    check(
        run,
        at=[first],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    assert statuses(run)[0] == ("waiting_rate_limit", int(first * 1000), int(first * 1000))


async def test_f46_another_base_url_is_not_delayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [ok()],
        pol=policy(requests_per_minute=6),
        limiter=await drained(6),
        base_url="https://other.test/v1",
    )
    check(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *OK_SEEN, END_OK), text=TEXT
    )


async def test_d4_the_initial_event_deadline_starts_after_the_limiter_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [SILENT],
        pol=policy(requests_per_minute=6, rescue=False),
        limiter=await drained(6),
    )
    # sent at 10.0 (after the wait), cut at 130.0; the bucket has refilled by the retry
    check(
        run,
        at=[10.0, 130.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=250.1,
    )


async def test_d4_provider_pings_count_as_events(autojump_clock: trio.testing.MockClock) -> None:
    events = anthropic_events()
    ping = sse({"type": "ping"}, event="ping")
    pinging = Answer(body=[events[0], 100.0, ping, 100.0, ping, 90.0, *events[1:]])
    run = await play([pinging], dialect=AnthropicDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=290.0,
    )


# --- backpressure ---------------------------------------------------------------------------------


async def test_a_slow_consumer_is_backpressure_not_a_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = SlowSink(200.0)
    run = await play([ok(), ok()], rescue=rescue_ok(), pol=policy(channel_size=1), sinks=[sink])
    check(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *OK_SEEN, END_OK), text=TEXT
    )
    assert run.ended >= 600.0  # twice the total deadline: the consumer took its time
    assert sink.closed == 1
    assert [e for b in sink.batches for e in b.run] == run.events


# --- D1, D2 and the reset rule, once more ---------------------------------------------------------


async def test_d1_a_stall_spends_a_transport_retry(autojump_clock: trio.testing.MockClock) -> None:
    run = await play(
        [partial(1, HANG)], rescue=rescue_ok(), pol=policy(total_timeout=3600.0, rescue=False)
    )
    # every attempt brings a delta, so the timeout limit is 10: the 3 retries run out first
    check(
        run,
        at=[0.0, 180.1, 360.3, 540.7],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", *["D", "reset"] * 3, "D", END_TIMEOUT),
        text="The ",
        ended=720.7,
    )


async def test_d2_a_spent_budget_without_rescue_fails_with_the_last_partial_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3)], pol=policy(rescue=False))
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7],
        outcome=Outcome.FAILED,
        saw=expect("start", *["D*3", "reset"] * 3, "D*3", END_PROVIDER),
        text="The quick brown ",
        ended=0.7,
    )
    assert run.result.partial
    assert isinstance(run.result.error, IncompleteStreamError)


AUTH = end_error("authentication_failed")


@pytest.mark.parametrize(
    ("first", "outcome", "saw", "text"),
    [
        (partial(2), Outcome.FAILED, ("start", "D*2", AUTH), "The quick "),
        (status(500), Outcome.INIT_FAILED, ("start", AUTH), ""),
    ],
    ids=["after-events", "before-any-event"],
)
async def test_d2_a_permanent_error_after_a_retry_is_failed_or_init_failed(
    autojump_clock: trio.testing.MockClock,
    first: Answer,
    outcome: Outcome,
    saw: tuple[str, ...],
    text: str,
) -> None:
    # Failed once any attempt produced an event, however many attempts ago; no rescue
    run = await play([first, status(401), ok()], rescue=rescue_ok())
    check(run, at=[0.0, 0.1], outcome=outcome, saw=expect(*saw), text=text)
    assert run.result.partial is (outcome is Outcome.FAILED)
    assert getattr(run.result.error, "status", None) == 401


async def test_one_reset_is_owed_across_an_attempt_that_emitted_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(2), status(500), ok()])
    check(
        run,
        at=[0.0, 0.1, 0.3],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*2", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )
    resets = [item for item in run.uni if isinstance(item, AttemptReset)]
    assert resets == [AttemptReset(3)]  # the attempt whose events follow


async def test_f22_the_frame_error_names_the_byte_offset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], BAD_FRAMES[0] + OK[2], *OK[3:]])
    run = await play([broken], pol=policy(rescue=False, transport_retries=0))
    error = run.result.error
    assert isinstance(error, MalformedFrameError)
    assert error.offset == len(ROLE) + len(OK[1])  # where the bad frame starts
