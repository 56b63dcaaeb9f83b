"""Provider chains and the circuit breaker: the next provider answers a turn that ended
rate-limited or hopeless before any event, a permanent request error does not fall back unless
asked, and a breaker per (base URL, model) opens after consecutive hopeless turns, lets one
trial through after its cooldown and closes on a success. The breaker's states in virtual
time; chains over real sockets (two loopback providers)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from rillet import (
    BreakerState,
    CircuitBreaker,
    CircuitBreakers,
    Outcome,
    Policy,
    RunEvent,
    RunStarted,
    StatusEvent,
    open_turn,
    run_agent,
    run_turn,
)
from rillet.providers import OpenAIChatDialect, Provider, Secret
from rillet.transports.testing import Reply, open_loopback_provider, refused_url, status_reply

from ..agent.test_agent import _calls, get_weather
from ..agent_support import (
    KEY,
    LIMIT,
    QUESTION,
    check_stream,
    kinds,
    loop_clock,
    provider_at,
    text_reply,
)

clock = pytest.fixture(name="loop_clock")(loop_clock)
QUICK = Policy(rate_limit_retries=0, transport_retries=0, rescue=False)


async def test_the_breaker_opens_cools_down_and_closes_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    breaker = CircuitBreaker(threshold=5, cooldown=30.0)
    for _ in range(4):
        assert breaker.allow()
        breaker.failed()
    assert state_of(breaker) is BreakerState.CLOSED
    breaker.failed()  # the fifth in a row
    assert state_of(breaker) is BreakerState.OPEN
    assert not breaker.allow()
    await trio.sleep(29.9)
    assert not breaker.allow()
    await trio.sleep(0.1)
    assert state_of(breaker) is BreakerState.HALF_OPEN
    assert breaker.allow()  # one trial...
    assert not breaker.allow()  # ...at a time
    breaker.failed()  # a failed trial opens it again at once
    assert state_of(breaker) is BreakerState.OPEN
    await trio.sleep(30.0)
    assert breaker.allow()
    breaker.succeeded()
    assert state_of(breaker) is BreakerState.CLOSED
    assert breaker.failures == 0


async def test_a_success_resets_the_count_of_failures_in_a_row(
    autojump_clock: trio.testing.MockClock,
) -> None:
    breaker = CircuitBreaker(threshold=3)
    breaker.failed()
    breaker.failed()
    breaker.succeeded()
    breaker.failed()
    breaker.failed()
    assert state_of(breaker) is BreakerState.CLOSED


def test_breakers_are_kept_per_base_url_and_model() -> None:
    breakers = CircuitBreakers()
    a = Provider(dialect=_dialect(), base_url="http://127.0.0.1:1/", model="m1")
    same = Provider(dialect=_dialect(), base_url="http://127.0.0.1:1", model="m1", name="x")
    other = Provider(dialect=_dialect(), base_url="http://127.0.0.1:1", model="m2")
    assert breakers.get(a) is breakers.get(same)
    assert breakers.get(a) is not breakers.get(other)


async def test_a_rate_limited_turn_falls_back_to_the_next_provider(
    loop_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_loopback_provider([status_reply(429, retry_after=1)]) as first,
        open_loopback_provider([text_reply("From ", "the second.")]) as second,
    ):
        chain = [
            provider_at(first, name="primary", model="big"),
            provider_at(second, name="backup", model="small"),
        ]
        with trio.fail_after(LIMIT):
            async with open_turn(QUESTION, chain, policy=QUICK, breakers=CircuitBreakers()) as turn:
                events = [e async for e in turn.run_events()]
                result = await turn.result()
    check_stream(events, turn.run_id)
    assert result.ok
    assert result.provider is chain[1]
    assert result.text == "From the second."
    [fallback] = [e for e in events if isinstance(e, StatusEvent) and e.phase == "fallback"]
    assert (fallback.provider, fallback.model) == ("backup", "small")
    assert kinds(events).count("run.started") == 1
    assert isinstance(events[0], RunStarted)
    assert events[-1].status == "completed"  # type: ignore[union-attr]
    assert (len(first.requests), len(second.requests)) == (1, 1)


async def test_a_stream_hopeless_before_any_event_falls_back(
    loop_clock: trio.testing.MockClock,
) -> None:
    dead = Provider(
        dialect=_dialect(), base_url=refused_url(), model="m", api_key=Secret(KEY), name="dead"
    )
    async with open_loopback_provider([text_reply("Alive.")]) as second:
        with trio.fail_after(LIMIT):
            result = await run_turn(
                QUESTION,
                [dead, provider_at(second)],
                policy=Policy(transport_retries=1),
                breakers=CircuitBreakers(),
            )
    assert result.ok
    assert result.text == "Alive."
    assert result.provider is not None
    assert result.provider.base_url == second.url


@pytest.mark.parametrize("asked", [False, True])
async def test_a_permanent_request_error_falls_back_only_when_asked(
    loop_clock: trio.testing.MockClock, asked: bool
) -> None:
    async with (
        open_loopback_provider([status_reply(400)]) as first,
        open_loopback_provider([text_reply("Second.")]) as second,
    ):
        with trio.fail_after(LIMIT):
            result = await run_turn(
                QUESTION,
                [provider_at(first), provider_at(second)],
                policy=QUICK,
                breakers=CircuitBreakers(),
                chain_on_permanent=asked,
            )
    assert result.ok is asked
    assert len(second.requests) == (1 if asked else 0)
    if not asked:
        assert result.outcome is Outcome.INIT_FAILED


async def test_an_open_breaker_is_skipped_at_once_and_tried_again_after_its_cooldown(
    loop_clock: trio.testing.MockClock,
) -> None:
    breakers = CircuitBreakers(threshold=2, cooldown=30.0)
    async with (
        open_loopback_provider([status_reply(429, retry_after=1)]) as first,
        open_loopback_provider([text_reply("Backup.")]) as second,
    ):
        chain = [provider_at(first), provider_at(second)]

        async def ask() -> tuple[list[RunEvent], float]:
            start = trio.current_time()
            async with open_turn(QUESTION, chain, policy=QUICK, breakers=breakers) as turn:
                events = [e async for e in turn.run_events()]
                assert (await turn.result()).ok
            return events, trio.current_time() - start

        with trio.fail_after(LIMIT):
            await ask()
            await ask()
            assert state_of(breakers.get(chain[0])) is BreakerState.OPEN
            events, took = await ask()
            assert len(first.requests) == 2  # skipped: not asked a third time
            assert took < 0.5
            fallback = [e for e in events if isinstance(e, StatusEvent) and e.phase == "fallback"]
            assert [e.provider for e in fallback] == [chain[1].label]
            await trio.sleep(30.0)
            first.set_script([text_reply("Primary is back.")])
            events, _ = await ask()
    assert len(first.requests) == 3  # the half-open trial
    assert state_of(breakers.get(chain[0])) is BreakerState.CLOSED
    assert not [e for e in events if isinstance(e, StatusEvent) and e.phase == "fallback"]


async def test_every_breaker_open_ends_the_turn_without_a_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    breakers = CircuitBreakers(threshold=1)
    async with (
        open_loopback_provider([text_reply("x")]) as first,
        open_loopback_provider([text_reply("y")]) as second,
    ):
        chain = [provider_at(first), provider_at(second)]
        for provider in chain:
            breakers.get(provider).failed()
        async with open_turn(QUESTION, chain, breakers=breakers) as turn:
            events = [e async for e in turn.run_events()]
    check_stream(events, turn.run_id)
    assert (events[-1].status, events[-1].code) == ("error", "circuit_open")  # type: ignore[union-attr]
    assert first.requests == second.requests == []


async def test_an_agent_step_falls_back_and_the_result_names_who_answered(
    loop_clock: trio.testing.MockClock,
) -> None:
    tool_call = Reply(chunks=(_calls(("get_weather", {"city": "Rome"})),))
    async with (
        open_loopback_provider([tool_call, status_reply(429, retry_after=1)]) as first,
        open_loopback_provider([text_reply("Warm in Rome.")]) as second,
    ):
        chain = [provider_at(first, name="primary"), provider_at(second, name="backup")]
        with trio.fail_after(LIMIT):
            result = await run_agent(
                QUESTION, chain, tools=[get_weather], policy=QUICK, breakers=CircuitBreakers()
            )
    assert result.status == "completed"
    assert [t.provider.label for t in result.turns if t.provider] == ["primary", "backup"]
    assert result.provider is chain[1]
    assert result.text == "Warm in Rome."


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """The state now (a function, so a type checker does not pin it between checks)."""
    return breaker.state


def _dialect() -> OpenAIChatDialect:
    return OpenAIChatDialect()


async def test_a_chain_without_history_keeps_only_what_its_sinks_have_not_had(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import CallbackSink, NoHistoryError

    got: list[RunEvent] = []
    async with (
        open_loopback_provider([status_reply(429, retry_after=1)]) as first,
        open_loopback_provider([text_reply("a ", "b ", "c.")]) as second,
    ):
        chain = [provider_at(first), provider_at(second)]
        async with trio.open_nursery() as nursery:
            turn = await nursery.start(
                lambda task_status: run_turn(
                    QUESTION,
                    chain,
                    policy=QUICK,
                    breakers=CircuitBreakers(),
                    history=False,
                    sinks=[CallbackSink(on_run_event=got.append)],
                    task_status=task_status,
                )
            )
            with pytest.raises(NoHistoryError):
                turn.run_events()
            result = await turn.result()
    assert result.ok
    check_stream(got, turn.run_id)
    assert "".join(getattr(e, "delta", "") for e in got) == "a b c."
    assert turn._run.items == []
    assert turn._uni.items == []
