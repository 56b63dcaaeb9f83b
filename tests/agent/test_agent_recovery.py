"""What an agent does when a step does not go to plan: a run cancelled mid-step still answers
every call in its conversation (the next request stays one a provider takes, and what finished
never runs again); a call whose arguments are not a JSON object goes back to the model as
that call's result, as arguments that do not fit the signature do, instead of ending the
run."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing
from rillet import (
    Conversation,
    RunEvent,
    ToolCompleted,
    TurnRequest,
    encode_json,
    open_agent,
    run_agent,
    tool,
    user,
)
from rillet.transports.testing import Reply, open_loopback_provider, sse

from ..agent_support import (
    CASES,
    LIMIT,
    QUESTION,
    body_of,
    check_stream,
    kinds,
    loop_clock,
    provider_at,
    text_reply,
    tool_result_in,
)
from .test_agent import _calls

clock = pytest.fixture(name="loop_clock")(loop_clock)


async def test_a_run_cancelled_mid_tool_leaves_every_call_answered(
    loop_clock: trio.testing.MockClock,
) -> None:
    ran: list[str] = []
    entered = trio.Event()

    async def quick() -> str:
        ran.append("quick")
        return "done quickly"

    async def stuck() -> str:
        entered.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    conversation = Conversation()
    both = Reply(chunks=(_calls(("quick", {}), ("stuck", {})),))
    async with open_loopback_provider([both, text_reply("Fine.")]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(
                QUESTION, provider_at(server), tools=[quick, stuck], conversation=conversation
            ) as agent:
                await entered.wait()
                await trio.sleep(1.0)
                agent.cancel()
                first = await agent.result()
            assert first.status == "cancelled"
            assert conversation.tool_calls() == []  # no call is left without its result
            outputs = {o.call.name: (o.status, o.reason_code) for o in first.tool_outputs}
            assert outputs == {"quick": ("ok", None), "stuck": ("cancelled", "cancelled")}
            again = await run_agent(
                TurnRequest(messages=[user("And now?")]),
                provider_at(server),
                tools=[quick, stuck],
                conversation=conversation,
            )
    assert again.status == "completed"
    assert ran == ["quick"]  # not run again
    body = body_of(server, 1)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    assert tool_result_in(body, "openai-chat") == [
        ("call_1", "done quickly"),
        ("call_2", "error: the call was cancelled before it finished"),
    ]


def _raw_call(arguments: str) -> Reply:
    """An OpenAI Chat stream calling `get_weather` (id `call_1`) with `arguments` as sent."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": arguments}
    frames = [chunk({"role": "assistant", "content": ""}), chunk({"tool_calls": [call]})]
    return Reply(chunks=(sse(*frames, chunk({}, "tool_calls"), "[DONE]"),))


@pytest.mark.parametrize("arguments", ["[1, 2]", '{"city": "Os'])
async def test_arguments_that_are_not_an_object_go_back_to_the_model(
    loop_clock: trio.testing.MockClock, arguments: str
) -> None:
    ran: list[str] = []

    async def get_weather(city: str = "") -> str:
        ran.append(city)
        return "sunny"

    async with open_loopback_provider([_raw_call(arguments), text_reply("Which city?")]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(QUESTION, provider_at(server), tools=[get_weather]) as agent:
                events: list[RunEvent] = [e async for e in agent.run_events()]
                result = await agent.result()
    check_stream(events, agent.run_id)
    assert (result.status, result.text, ran) == ("completed", "Which city?", [])
    body = body_of(server, 1)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool"]
    [(call_id, text)] = tool_result_in(body, "openai-chat")
    assert call_id == "call_1"
    assert text == f"error: invalid arguments: not a JSON object: {arguments!r}"
    [completed] = [e for e in events if isinstance(e, ToolCompleted)]
    assert (completed.status, completed.reason_code) == ("error", "tool_arguments_invalid")
    assert kinds(events).count("status") == 2  # both steps ran
    assert all(arguments.encode() not in encode_json(e) for e in events)


async def test_a_sync_tool_cancelled_still_closes_its_span_and_holds_its_thread(
    loop_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()
    started = trio.Event()

    def get_weather(city: str = "", unit: str = "") -> str:
        trio.from_thread.run_sync(started.set)
        release.wait(60)
        return "late"

    limiter = trio.CapacityLimiter(1)
    case = CASES["openai-chat"]
    try:
        async with open_loopback_provider([case.tool_call, case.text]) as server:
            with trio.fail_after(LIMIT):
                async with open_agent(
                    QUESTION,
                    provider_at(server),
                    tools=[tool(get_weather, timeout=None)],
                    thread_limiter=limiter,
                ) as agent:
                    await started.wait()
                    cancelled_at = trio.current_time()
                    agent.cancel()
                    events = [e async for e in agent.run_events()]
                    result = await agent.result()
        check_stream(events, agent.run_id)
        assert result.status == "cancelled"
        assert trio.current_time() - cancelled_at == pytest.approx(2.0, abs=0.1)  # the grace
        assert kinds(events)[-2:] == ["tool.completed", "run.done"]
        assert (events[-2].status, events[-2].reason_code) == ("cancelled", "cancelled")  # type: ignore[union-attr]
        assert limiter.borrowed_tokens == 1  # the abandoned thread still holds its token
    finally:
        release.set()


async def test_a_tool_cancelled_inside_its_own_nursery_still_closes_its_span(
    loop_clock: trio.testing.MockClock,
) -> None:
    entered = trio.Event()

    async def get_weather(city: str = "", unit: str = "") -> str:
        async with trio.open_nursery() as nursery:  # a cancel leaves it in a group
            nursery.start_soon(trio.sleep_forever)
            entered.set()
        return "never"

    case = CASES["openai-chat"]
    async with open_loopback_provider([case.tool_call, case.text]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(QUESTION, provider_at(server), tools=[get_weather]) as agent:
                await entered.wait()
                agent.cancel()
                events = [e async for e in agent.run_events()]
                result = await agent.result()
    check_stream(events, agent.run_id)
    assert result.status == "cancelled"
    assert kinds(events)[-2:] == ["tool.completed", "run.done"]
    assert events[-2].status == "cancelled"  # type: ignore[union-attr]
