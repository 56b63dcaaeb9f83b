"""Delivery modes: streaming (the default) sends the answer as it comes; buffered holds it
behind the host's validator, releases it only once the whole candidate is accepted, never lets
a rejected candidate reach the public stream (its reason travels as a safe code), and asks the
model again up to a bound."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import trio
import trio.testing
from rillet import (
    AgentResult,
    AnswerDelta,
    AnswerDone,
    RunEvent,
    StatusEvent,
    open_agent,
    run_agent,
)
from rillet.transports.testing import Reply, open_loopback_provider

from ..agent_support import (
    LIMIT,
    QUESTION,
    check_stream,
    kinds,
    loop_clock,
    provider_at,
    text_reply,
)
from .test_agent import _calls, get_weather

clock = pytest.fixture(name="loop_clock")(loop_clock)


async def play(script: list[Reply], **options: Any) -> tuple[AgentResult, list[RunEvent], int]:
    async with open_loopback_provider(script) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(QUESTION, provider_at(server), **options) as agent:
                events = [e async for e in agent.run_events()]
                result = await agent.result()
    check_stream(events, agent.run_id)
    return result, events, len(server.requests)


def answer(events: list[RunEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, AnswerDelta))


async def test_streaming_sends_the_text_before_the_reply_is_complete(
    loop_clock: trio.testing.MockClock,
) -> None:
    _, events, _ = await play([text_reply("One ", "two.")])
    order = kinds(events)
    assert order.index("answer.delta") < order.index("usage")


async def test_buffered_text_is_released_only_once_the_validator_accepts_it(
    loop_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []

    def validator(text: str) -> str | None:
        seen.append(text)
        return None

    result, events, _ = await play(
        [text_reply("One ", "two.")], delivery="buffered", validator=validator
    )
    assert seen == ["One two."]
    order = kinds(events)
    assert order.index("usage") < order.index("answer.delta")  # held until the whole reply
    assert answer(events) == "One two."
    assert result.status == "completed"


async def test_a_rejected_candidate_never_reaches_the_public_stream(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def validator(text: str) -> str | None:
        await trio.sleep(1.0)  # a host's check may take its time: the text waits
        return "mentions_secret" if "secret" in text else None

    result, events, requests = await play(
        [text_reply("The secret ", "is 42."), text_reply("I cannot ", "say.")],
        delivery="buffered",
        validator=validator,
    )
    assert requests == 2
    assert answer(events) == "I cannot say."
    assert all("secret" not in getattr(e, "delta", "") for e in events)
    [rejected] = [
        e for e in events if isinstance(e, StatusEvent) and e.phase == "candidate_rejected"
    ]
    assert (rejected.reason_code, rejected.step) == ("mentions_secret", 1)
    [done] = [e for e in events if isinstance(e, AnswerDone)]
    assert done.sha256 == hashlib.sha256(b"I cannot say.").hexdigest()
    assert result.text == "I cannot say."
    assert [m.role for m in result.conversation.messages] == ["user", "assistant"]


async def test_the_model_is_asked_again_only_up_to_the_bound(
    loop_clock: trio.testing.MockClock,
) -> None:
    result, events, requests = await play(
        [text_reply("Never good.")],
        delivery="buffered",
        validator=lambda text: "Not good enough, because reasons!",
        max_candidates=2,
    )
    assert requests == 2
    assert (result.status, result.code) == ("error", "answer_rejected")
    assert answer(events) == ""
    codes = [e.reason_code for e in events if isinstance(e, StatusEvent) and e.reason_code]
    assert codes == ["rejected", "rejected"]  # prose is never a code
    assert "answer.done" not in kinds(events)


async def test_buffered_tool_steps_keep_their_text_private(
    loop_clock: trio.testing.MockClock,
) -> None:
    preamble = Reply(chunks=(_calls(("get_weather", {"city": "Oslo"}), text="Let me look. "),))
    result, events, _ = await play(
        [preamble, text_reply("Cold.")],
        tools=[get_weather],
        delivery="buffered",
        validator=lambda text: None,
    )
    assert result.status == "completed"
    assert answer(events) == "Cold."


async def test_a_validator_is_never_bypassed_by_the_default_delivery(
    loop_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []

    def validator(text: str) -> str | None:
        seen.append(text)
        return "mentions_secret" if "secret" in text else None

    result, events, requests = await play(
        [text_reply("The secret ", "is 42."), text_reply("I cannot ", "say.")],
        validator=validator,  # no delivery named: a validator means buffered
    )
    assert seen == ["The secret is 42.", "I cannot say."]
    assert requests == 2
    assert answer(events) == "I cannot say."
    assert result.text == "I cannot say."
    async with open_loopback_provider([text_reply("x")]) as server:
        with pytest.raises(ValueError, match="buffered"):
            await run_agent(
                QUESTION, provider_at(server), validator=validator, delivery="streaming"
            )
        assert server.requests == []


async def test_a_rejected_candidate_reaches_neither_the_mmsp_stream_nor_a_sink(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import SinkBatch

    class Recorder:
        def __init__(self) -> None:
            self.uni: list[Any] = []

        async def deliver(self, batch: SinkBatch) -> None:
            self.uni.extend(batch.uni)

        async def close(self) -> None:
            pass

    recorder = Recorder()
    preamble = Reply(chunks=(_calls(("get_weather", {"city": "Oslo"}), text="Looking. "),))
    script = [preamble, text_reply("The secret ", "is 42."), text_reply("Cold in ", "Oslo.")]
    async with open_loopback_provider(script) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(
                QUESTION,
                provider_at(server),
                tools=[get_weather],
                delivery="buffered",
                validator=lambda text: "mentions_secret" if "secret" in text else None,
                sinks=[recorder],
            ) as agent:
                uni = [item async for item in agent.uni_events()]
                result = await agent.result()
    assert result.text == "Cold in Oslo."
    for items in (uni, recorder.uni):
        shown = repr(items)
        assert "secret" not in shown
        assert "Cold in " in shown
        assert "get_weather" in shown  # the tool step's stream still goes out
    assert len(recorder.uni) == len(uni)


async def test_a_rejected_candidates_reasoning_stays_private_too(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import ReasoningDelta
    from rillet.transports.testing import fixture_reply

    from ..agent_support import FIXTURES

    verdicts = iter(["not_this_one", None])
    thinking = fixture_reply(FIXTURES / "openai-chat/reasoning_deepseek.sse")
    result, events, requests = await play(
        [thinking, text_reply("Plainly.")],
        delivery="buffered",
        validator=lambda text: next(verdicts),
        reasoning=True,  # opted in: only an accepted candidate's reasoning goes out
    )
    assert requests == 2
    assert result.turns[0].message.content_items  # the first candidate did think
    assert [e for e in events if isinstance(e, ReasoningDelta)] == []
    assert answer(events) == "Plainly."
