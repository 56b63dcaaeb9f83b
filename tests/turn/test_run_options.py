"""`RunOptions`: one object for how a run reaches its providers, taken whole by `run_turn`, its
chain and `run_agent`, and passed on to every provider and every step; given beside the same
keywords it is refused before anything is sent."""

from __future__ import annotations

import json

import pytest
import trio
from rillet import NoHistoryError, Policy, RunOptions, TurnRequest, open_turn, run_agent, run_turn
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    status_reply,
)

from tests.agent_support import KEY, QUESTION, provider_at

REQUEST = TurnRequest(messages=QUESTION.messages)
NO_RETRY = Policy(transport_retries=0, rescue=False)


def _streamed(body: bytes) -> bool:
    return bool(json.loads(body).get("stream"))


async def test_options_given_whole_reach_the_request_as_keywords_do() -> None:
    script = [Reply(chunks=openai_text_body("whole"), content_type="application/json")]
    async with open_loopback_provider(script) as server:
        provider = provider_at(server)
        opts = RunOptions(stream=False, policy=NO_RETRY)
        by_object = await run_turn(REQUEST, provider, options=opts)
        by_keywords = await run_turn(REQUEST, provider, stream=False, policy=NO_RETRY)
    assert by_object.text == by_keywords.text == "whole"
    assert [_streamed(r.body) for r in server.requests] == [False, False]


async def test_history_off_in_the_options_keeps_no_history() -> None:
    script = [Reply(chunks=openai_text_stream(["a", "b"]))]
    async with (
        open_loopback_provider(script) as server,
        open_turn(REQUEST, provider_at(server), options=RunOptions(history=False)) as turn,
    ):
        result = await turn.result()
        with pytest.raises(NoHistoryError):
            turn.run_events()
    assert result.text == "ab"


async def test_options_and_a_keyword_that_says_otherwise_are_refused_before_a_request() -> None:
    async with open_loopback_provider([Reply(chunks=openai_text_stream(["x"]))]) as server:
        with pytest.raises(TypeError, match="reasoning"):
            await run_turn(REQUEST, provider_at(server), options=RunOptions(), reasoning=True)
        with pytest.raises(TypeError, match="stream"):
            await run_agent(QUESTION, provider_at(server), options=RunOptions(), stream=False)
        await trio.sleep(0.05)
    assert server.requests == []


def test_unknown_and_conflicting_names_are_type_errors() -> None:
    with pytest.raises(TypeError, match="not run options: sinkz"):
        RunOptions.merged(None, {"sinkz": ()})
    assert RunOptions.merged(None, {"reasoning": True}) == RunOptions(reasoning=True)
    base = RunOptions(history=False)
    assert RunOptions.merged(base, {"history": True, "reasoning": False}) is base
    assert base.replace(history=True) == RunOptions()


async def test_a_chain_passes_its_options_to_every_provider() -> None:
    refused = [status_reply(401, body={"error": {"message": "bad key"}})]
    answered = [Reply(chunks=openai_text_body("second"), content_type="application/json")]
    async with (
        open_loopback_provider(refused) as first,
        open_loopback_provider(answered) as second,
    ):
        opts = RunOptions(stream=False, chain_on_permanent=True, policy=NO_RETRY)
        result = await run_turn(REQUEST, [provider_at(first), provider_at(second)], options=opts)
    assert result.text == "second"
    # chain_on_permanent handed the 401 on; stream=False reached both providers
    assert [_streamed(r.body) for r in (*first.requests, *second.requests)] == [False, False]


async def test_an_agent_passes_its_options_to_every_step_and_calls_on_text() -> None:
    script = [Reply(chunks=openai_text_body("done"), content_type="application/json")]
    texts: list[str] = []
    async with open_loopback_provider(script) as server:
        result = await run_agent(
            QUESTION,
            provider_at(server),
            options=RunOptions(stream=False, policy=NO_RETRY),
            on_text=texts.append,
        )
    assert result.status == "completed"
    assert "".join(texts) == result.text == "done"
    assert [_streamed(r.body) for r in server.requests] == [False]
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
