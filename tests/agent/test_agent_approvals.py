"""Approvals: a tool that needs one pauses the agent with `approval.required`; the host answers
through the API (`approve`, `deny`), a denial is told to the model, and when nobody can answer
(`approvals="defer"`) the run ends `approval_required` and a later run takes the decision."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    ApprovalRequired,
    ApprovalResolved,
    Conversation,
    RunDone,
    ToolCompleted,
    ToolStarted,
    TurnRequest,
    encode_json,
    open_agent,
    run_agent,
    tool,
)
from rillet.transports.testing import Reply, open_loopback_provider

from ..agent_support import (
    CASES,
    LIMIT,
    QUESTION,
    body_of,
    check_stream,
    loop_clock,
    provider_at,
    text_reply,
    tool_result_in,
)
from .test_agent import _calls

clock = pytest.fixture(name="loop_clock")(loop_clock)
CALL = CASES["openai-chat"]


def weather_tool(ran: list[str]) -> Any:
    async def get_weather(city: str, unit: str = "celsius") -> str:
        ran.append(city)
        return f"sunny in {city}"

    return tool(get_weather, needs_approval=True)


@pytest.mark.parametrize("answer", ["approve", "deny"])
async def test_the_host_answers_an_approval_through_the_api(
    loop_clock: trio.testing.MockClock, answer: str
) -> None:
    ran: list[str] = []
    async with open_loopback_provider([CALL.tool_call, CALL.text]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(
                QUESTION, provider_at(server), tools=[weather_tool(ran)]
            ) as agent:
                events = []
                async for event in agent.run_events():
                    events.append(event)
                    if isinstance(event, ApprovalRequired):
                        assert [p.approval_id for p in agent.pending_approvals] == [
                            event.approval_id
                        ]
                        assert ran == []  # nothing runs before the answer
                        if answer == "approve":
                            agent.approve(event.approval_id)
                        else:
                            agent.deny(event.approval_id, "not this city")
                result = await agent.result()
    check_stream(events, agent.run_id)
    [required] = [e for e in events if isinstance(e, ApprovalRequired)]
    assert (required.name, required.tool_call_id, required.step) == (
        "get_weather",
        CALL.call_key,
        1,
    )
    [resolved] = [e for e in events if isinstance(e, ApprovalResolved)]
    assert resolved.approval_id == required.approval_id
    assert result.status == "completed"
    [(_, told)] = tool_result_in(body_of(server, 1), "openai-chat")
    if answer == "approve":
        assert resolved.decision == "approved"
        assert ran == ["São Paulo"]
        assert told == "sunny in São Paulo"
        assert [e.name for e in events if isinstance(e, ToolStarted)] == ["get_weather"]
    else:
        assert resolved.decision == "denied"
        assert ran == []
        assert told == "denied: the user did not allow this call: not this city"
        assert not [e for e in events if isinstance(e, ToolStarted | ToolCompleted)]
        assert [o.reason_code for o in result.tool_outputs] == ["denied"]


async def test_an_approval_nobody_waits_for_cannot_be_answered(
    loop_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_loopback_provider([CALL.text]) as server,
        open_agent(QUESTION, provider_at(server)) as agent,
    ):
        with pytest.raises(ValueError, match="no approval"):
            agent.approve("apr_nothing")
        await agent.result()


async def test_deferred_approvals_end_the_run_and_a_later_run_takes_the_decision(
    loop_clock: trio.testing.MockClock,
) -> None:
    ran: list[str] = []
    free: list[str] = []

    async def clock_tool() -> str:
        free.append("ran")
        return "noon"

    both = Reply(chunks=(_calls(("get_weather", {"city": "Oslo"}), ("clock_tool", {})),))
    conversation = Conversation()
    tools = [weather_tool(ran), clock_tool]
    async with open_loopback_provider([both, text_reply("Sunny at noon.")]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(
                QUESTION,
                provider_at(server),
                tools=tools,
                approvals="defer",
                conversation=conversation,
            ) as agent:
                events = [e async for e in agent.run_events()]
                first = await agent.result()
            check_stream(events, agent.run_id)
            assert (first.status, first.code) == ("approval_required", "approval_required")
            done = events[-1]
            assert isinstance(done, RunDone)
            assert (done.status, done.code) == ("approval_required", "approval_required")
            [pending] = first.pending
            assert pending.tool_call.name == "get_weather"
            assert [e.approval_id for e in events if isinstance(e, ApprovalRequired)] == [
                pending.approval_id
            ]
            assert (ran, free) == ([], ["ran"])  # the call needing no approval ran
            assert len(server.requests) == 1
            # the state survives a trip through JSON, as a host would keep it
            kept = Conversation.decode(conversation.encode())
            second = await run_agent(
                TurnRequest(messages=[]),
                provider_at(server),
                tools=tools,
                conversation=kept,
                decisions={pending.approval_id: True},
            )
    assert second.status == "completed"
    assert ran == ["Oslo"]
    assert free == ["ran"]  # not run twice
    assert tool_result_in(body_of(server, 1), "openai-chat") == [
        ("call_1", "sunny in Oslo"),
        ("call_2", "noon"),
    ]
    assert kept.pending == []
    assert second.text == "Sunny at noon."


async def test_a_deferred_run_without_a_decision_still_waits(
    loop_clock: trio.testing.MockClock,
) -> None:
    ran: list[str] = []
    conversation = Conversation()
    async with open_loopback_provider([CALL.tool_call]) as server:
        first = await run_agent(
            QUESTION,
            provider_at(server),
            tools=[weather_tool(ran)],
            approvals="defer",
            conversation=conversation,
        )
        again = await run_agent(
            TurnRequest(messages=[]),
            provider_at(server),
            tools=[weather_tool(ran)],
            approvals="defer",
            conversation=conversation,
        )
    assert first.status == again.status == "approval_required"
    assert [p.approval_id for p in again.pending] == [p.approval_id for p in first.pending]
    assert ran == []
    assert len(server.requests) == 1


async def test_a_resumed_run_sends_its_new_message_after_the_calls_results(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import user

    ran: list[str] = []
    conversation = Conversation()
    tools = [weather_tool(ran)]
    call = Reply(
        chunks=(
            _calls(
                ("get_weather", {"city": "Oslo"}),
            ),
        )
    )
    async with open_loopback_provider([call, text_reply("Sunny.")]) as server:
        first = await run_agent(
            QUESTION, provider_at(server), tools=tools, approvals="defer", conversation=conversation
        )
        [pending] = first.pending
        second = await run_agent(
            TurnRequest(messages=[user("And tomorrow?")]),
            provider_at(server),
            tools=tools,
            conversation=conversation,
            decisions={pending.approval_id: True},
        )
        again = Conversation.decode(first.conversation.encode())
        again.pending = [pending]
        with pytest.raises(ValueError, match="pending"):  # a decision is still owed
            await run_agent(
                TurnRequest(messages=[user("Hello?")]),
                provider_at(server),
                tools=tools,
                conversation=again,
                approvals="defer",
            )
    assert second.status == "completed"
    body = body_of(server, 1)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "user"]
    assert body["messages"][-1]["content"] == "And tomorrow?"
    assert tool_result_in(body, "openai-chat") == [("call_1", "sunny in Oslo")]
    assert len(server.requests) == 2


@pytest.mark.parametrize("shown", [True, False])
async def test_an_approval_shows_the_calls_arguments_when_the_run_shows_them(
    loop_clock: trio.testing.MockClock, shown: bool
) -> None:
    async with open_loopback_provider([CALL.tool_call, CALL.text]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(
                QUESTION, provider_at(server), tools=[weather_tool([])], tool_arguments=shown
            ) as agent:
                async for event in agent.run_events():
                    if isinstance(event, ApprovalRequired):
                        required = event
                        agent.approve(event.approval_id)
                await agent.result()
    if shown:  # what a script or page needs to say what it approves
        assert required.arguments is not None
        assert required.arguments["city"] == "São Paulo"
    else:  # tool arguments stay out of the public stream unless asked for
        assert required.arguments is None
        assert "arguments" not in msgspec.json.decode(encode_json(required))
