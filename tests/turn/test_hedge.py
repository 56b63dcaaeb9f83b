"""Hedged requests (`Policy(hedge_after=s)`): two source actors racing for an attempt's first
event, in virtual time. The first to deliver wins; the other is cancelled before it delivers
anything, so its output is never read."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from rillet import Outcome, Policy, RateLimiter, TurnRequest, TurnResult, run_turn, user
from rillet.providers import OpenAIChatDialect, Provider
from rillet.transports.testing import openai_text_stream
from rillet.transports.upstream import MemoryReply, MemoryUpstream

pytestmark = pytest.mark.usefixtures("graph")  # the race feeds either graph

SSE = {"content-type": "text/event-stream"}
STREAM = openai_text_stream(["Hedged ", "answer."])
TEXT = "Hedged answer."
REQUEST = TurnRequest(messages=[user("hi")])


def provider() -> Provider:
    return Provider(OpenAIChatDialect(), "http://hedge.invalid/v1", "m")


EVENTS = [part + b"\n\n" for part in STREAM.split(b"\n\n") if part]  # one SSE event a piece


def reply(delay: float = 0.0) -> MemoryReply:
    """The stream, one event a piece, `delay` seconds before each."""
    return MemoryReply(EVENTS, headers=SSE, delay=delay)


async def turn(upstream: MemoryUpstream, **fields: object) -> TurnResult:
    policy = Policy(random=lambda: 0.0, **fields)  # type: ignore[arg-type]
    return await run_turn(
        REQUEST, provider(), upstream=upstream, policy=policy, limiter=RateLimiter()
    )


async def test_a_slow_first_request_is_overtaken_by_the_hedge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    upstream = MemoryUpstream([reply(delay=10.0), reply(delay=0.5)])
    result = await turn(upstream, hedge_after=2.0)
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert result.requests == 2
    assert result.time_to_first_event == pytest.approx(2.5)
    slow, fast = upstream.exchanges
    assert slow.closed
    assert slow.read == 0  # cancelled before it delivered a thing: never read, never billed
    assert fast.read == len(EVENTS)


async def test_a_first_request_that_delivers_in_time_sends_no_hedge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    upstream = MemoryUpstream([reply(delay=0.5), reply()])
    result = await turn(upstream, hedge_after=2.0)
    assert result.text == TEXT
    assert result.requests == 1
    assert len(upstream.requests) == 1


async def test_the_first_request_can_still_win_after_the_hedge_went_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    upstream = MemoryUpstream([reply(delay=3.0), reply(delay=5.0)])
    result = await turn(upstream, hedge_after=2.0)
    assert result.text == TEXT
    assert result.requests == 2
    assert result.time_to_first_event == pytest.approx(3.0)
    first, hedge = upstream.exchanges
    assert hedge.closed
    assert hedge.read == 0  # the loser was due its first piece at 7 s: cancelled at 3 s
    assert first.read == len(EVENTS)


async def test_a_hedge_that_fails_does_not_beat_a_first_request_that_delivers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused = MemoryReply([b'{"error": {"message": "busy"}}'], status=503)
    upstream = MemoryUpstream([reply(delay=4.0), refused])
    result = await turn(upstream, hedge_after=1.0)
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert result.attempts == 1


async def test_a_request_refused_before_the_hedge_is_due_is_not_hedged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused = MemoryReply(
        [b'{"error": {"message": "bad", "type": "invalid_request_error"}}'], status=400
    )
    upstream = MemoryUpstream([refused])
    result = await turn(upstream, hedge_after=5.0)
    assert result.outcome is Outcome.INIT_FAILED
    assert result.requests == 1


async def test_when_neither_delivers_the_first_requests_ending_is_the_attempts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    silent = MemoryReply([b""], headers=SSE, delay=30.0)  # an empty body, late
    cut = MemoryReply([], headers=SSE, delay=0.0)  # ends at once, no event
    upstream = MemoryUpstream([silent, cut, reply()])
    result = await turn(upstream, hedge_after=1.0, rescue=False)
    assert result.outcome is Outcome.COMPLETED
    assert result.attempts == 2  # the race's attempt was retried
    assert all(e.closed for e in upstream.exchanges)


async def test_the_hedge_is_off_by_default_and_checked() -> None:
    assert Policy().hedge_after is None
    with pytest.raises(ValueError, match="hedge_after"):
        Policy(hedge_after=0)


async def _run_events(upstream: MemoryUpstream, **fields: object) -> list[tuple[str, str | None]]:
    from rillet._core._runevents import StatusEvent

    policy = Policy(random=lambda: 0.0, **fields)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        turn_ = await nursery.start(
            lambda task_status: run_turn(
                REQUEST,
                provider(),
                upstream=upstream,
                policy=policy,
                limiter=RateLimiter(),
                task_status=task_status,
            )
        )
        events = [e async for e in turn_.run_events()]
    return [(e.phase, e.reason_code) for e in events if isinstance(e, StatusEvent)]


@pytest.mark.parametrize(
    ("delays", "said"),
    [
        ((10.0, 0.5), [("hedged", "hedge_won")]),
        ((3.0, 5.0), [("hedged", "hedge_lost")]),
        ((0.5, 0.0), []),  # in time: no hedge, nothing said
    ],
)
async def test_the_run_says_a_hedge_went_out_and_which_request_answered(
    autojump_clock: trio.testing.MockClock,
    delays: tuple[float, float],
    said: list[tuple[str, str]],
) -> None:
    upstream = MemoryUpstream([reply(delay=delays[0]), reply(delay=delays[1])])
    statuses = await _run_events(upstream, hedge_after=2.0)
    assert [s for s in statuses if s[0] == "hedged"] == said
