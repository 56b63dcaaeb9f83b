"""The stream handler, F28-F31: a cancel at every stage (the harness: `handler_support`)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

import httpx
import pytest
import trio
import trio.testing
from rillet._core._policy import Outcome, Policy
from rillet._core._runevents import (
    AnswerDelta,
    RunEvent,
)
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._turn import Turn
from rillet.transports.testing import openai_text_body

from ..handler_support import (
    BASE,
    END_CANCELLED,
    HANG,
    REQUEST,
    RESCUE_TEXT,
    SILENT,
    Answer,
    FakeProvider,
    Run,
    check_envelope,
    check_uni,
    collect,
    expect,
    ok,
    partial,
    policy,
    provider_for,
    rebuild,
    run_done,
    seen,
    status,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs


# --- F28-F31 and every other stage: cancellation --------------------------------------------------

Stage = Callable[[FakeProvider, Turn], Awaitable[None]]


def at_time(when: float) -> Stage:
    """Cancel at that virtual time."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        await trio.sleep_until(when)

    return stage


def on_request(n: int) -> Stage:
    """Cancel once the provider holds request n."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        await fake.event(f"request {n}").wait()

    return stage


def after_deltas(n: int) -> Stage:
    """Cancel once a consumer has seen n answer deltas."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        count = 0
        async for event in turn.run_events():
            count += isinstance(event, AnswerDelta)
            if count == n:
                return

    return stage


async def play_cancelled(
    answers: Sequence[Answer],
    stage: Stage,
    *,
    rescue: Answer | None = None,
    pol: Policy | None = None,
    limiter: RateLimiter | None = None,
) -> tuple[Run, float]:
    """Run a turn and cancel its caller's scope at `stage`; then wait a long (virtual) while to
    see that nothing more happens. Returns the run and when the cancel came."""
    fake = FakeProvider(answers, rescue)
    live: list[RunEvent] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                turn: Turn = await nursery.start(
                    functools.partial(
                        run_turn,
                        REQUEST,
                        provider_for(),
                        client=client,
                        policy=pol or policy(),
                        limiter=limiter or RateLimiter(),
                    )
                )
                nursery.start_soon(collect, turn, live)
                await stage(fake, turn)
                cancelled_at = trio.current_time()
                scope.cancel()
        assert scope.cancelled_caught
        ended = trio.current_time()
        result = await turn.result()
        made = len(fake.sent)
        await trio.sleep(3600)
        assert len(fake.sent) == made  # no request after the cancel, ever
    events = [event async for event in turn.run_events()]
    uni = [item async for item in turn.uni_events()]
    return Run(fake, turn, result, live, events, uni, ended), cancelled_at


def check_cancelled(
    run: Run, cancelled_at: float, *, at: Sequence[float], saw: Sequence[str], text: str
) -> None:
    """A cancelled turn: ended at once, `run.done{cancelled}` last, the log whole, every
    response closed, the text as delivered."""
    assert run.ended == pytest.approx(cancelled_at, abs=1e-9)
    assert run.times == pytest.approx(at, abs=1e-6)
    assert run.result.outcome is Outcome.CANCELLED
    assert run.result.attempts == len(at)
    assert seen(run.events) == list(saw)
    assert seen(run.events)[-1] == END_CANCELLED
    check_envelope(run.events, run.turn.run_id)
    assert run.events[: len(run.live)] == run.live
    assert rebuild(run.events) == text
    check_uni(run.uni)
    assert all(body.closed for body in run.fake.bodies)
    assert run_done(run).attempts == len(at)


async def test_cancel_while_waiting_for_the_limiter_makes_no_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(BASE, 6, 30)
    run, when = await play_cancelled(
        [ok()], at_time(5.0), pol=policy(requests_per_minute=6), limiter=limiter
    )
    check_cancelled(run, when, at=[], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(5.0)
    assert limiter.statistics()[BASE] == pytest.approx(-1.0 + 1.0)  # the token went back


async def test_f28_cancel_while_the_provider_holds_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([Answer(hang=True)], on_request(1))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == 0.0


async def test_cancel_after_the_headers_before_the_first_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([SILENT], at_time(60.0))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert len(run.fake.bodies) == 1


async def test_f29_cancel_mid_stream_closes_the_response_and_keeps_the_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([partial(2, HANG)], after_deltas(2))
    check_cancelled(
        run, when, at=[0.0], saw=expect("start", "D*2", END_CANCELLED), text="The quick "
    )
    assert run.fake.bodies[0].closed
    assert run.result.partial


async def test_f30_cancel_in_backoff(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(500)], at_time(0.05))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(0.05)


async def test_f30_cancel_in_backoff_after_a_partial_attempt_keeps_its_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([partial(3)], at_time(0.05))
    check_cancelled(
        run, when, at=[0.0], saw=expect("start", "D*3", END_CANCELLED), text="The quick brown "
    )


async def test_f30_cancel_in_a_rate_limit_wait(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(429, retry_after="10")], at_time(3.0))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(3.0)


async def test_f31_cancel_during_a_hung_rescue(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(500)], on_request(5), rescue=Answer(hang=True))
    check_cancelled(
        run, when, at=[0.0, 0.1, 0.3, 0.7, 0.7], saw=expect("start", END_CANCELLED), text=""
    )
    assert not run.fake.sent[4].stream


async def test_cancel_while_the_rescue_is_answering(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slow = Answer(body=[60.0, openai_text_body(RESCUE_TEXT)], content_type="application/json")
    run, when = await play_cancelled([partial(1)], at_time(30.0), rescue=slow)
    check_cancelled(
        run,
        when,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        saw=expect("start", *["D", "reset"] * 3, "D", END_CANCELLED),
        text="The ",
    )
