"""Admission: at most N provider streams at once in a process (32 by default), shared by turns
and agents; a turn waiting for a slot says so with `status` `queued`. 100 concurrent turns
against a loopback provider that takes one virtual second per reply."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing
from rillet import (
    DEFAULT_STREAMS,
    Admission,
    RunEvent,
    StatusEvent,
    TurnResult,
    run_agent,
    run_turn,
    shared_admission,
)
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

from ..agent_support import LIMIT, QUESTION, check_stream, loop_clock, provider_at

clock = pytest.fixture(name="loop_clock")(loop_clock)
SLOW = Reply(chunks=(openai_text_stream(["Hi."]),), headers_delay=1.0)


def queued(events: list[RunEvent]) -> bool:
    return any(isinstance(e, StatusEvent) and e.phase == "queued" for e in events)


async def test_100_concurrent_turns_never_run_more_than_the_limit(
    loop_clock: trio.testing.MockClock,
) -> None:
    admission = Admission(32)
    most = 0
    results: list[tuple[TurnResult, list[RunEvent]]] = []
    async with (
        open_loopback_provider([SLOW]) as server,
        httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as client,
    ):
        provider = provider_at(server)

        async def one() -> None:
            turn = await nursery.start(
                lambda task_status: run_turn(
                    QUESTION, provider, client=client, admission=admission, task_status=task_status
                )
            )
            events = [e async for e in turn.run_events()]
            check_stream(events, turn.run_id)
            results.append((await turn.result(), events))

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, admission.in_use)
                await trio.sleep(0.05)

        start = trio.current_time()
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as outer:
                outer.start_soon(watch)
                async with trio.open_nursery() as nursery:
                    for _ in range(100):
                        nursery.start_soon(one)
                outer.cancel_scope.cancel()
        took = trio.current_time() - start
    assert len(results) == 100
    assert all(result.ok for result, _ in results)
    assert most == 32
    assert sum(queued(events) for _, events in results) == 100 - 32
    first_wave = [r for r in server.requests if r.at - start < 1.0]
    assert len(first_wave) == 32
    assert 4.0 <= took < 5.0  # four waves of one second: 32, 32, 32, 4
    assert admission.in_use == 0


async def test_the_process_admits_32_streams_by_default_and_can_be_told_otherwise() -> None:
    shared = shared_admission()
    assert shared is shared_admission()
    assert shared.total == DEFAULT_STREAMS == 32
    shared.total = 64
    assert shared_admission().total == 64


async def test_agents_and_turns_share_the_slots(loop_clock: trio.testing.MockClock) -> None:
    admission = Admission(1)
    async with open_loopback_provider([SLOW]) as server:
        provider = provider_at(server)
        turn_events: list[RunEvent] = []
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    lambda task_status: run_agent(
                        QUESTION, provider, admission=admission, task_status=task_status
                    )
                )
                await server.wait_for_requests(1)  # the agent's step holds the one slot
                turn = await nursery.start(
                    lambda task_status: run_turn(
                        QUESTION, provider, admission=admission, task_status=task_status
                    )
                )
                turn_events = [e async for e in turn.run_events()]
                agent_result = await agent.result()
    assert queued(turn_events)
    assert agent_result.ok
    assert admission.in_use == 0
