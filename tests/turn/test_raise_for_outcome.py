"""A failure that cannot pass for success: `raise_for_outcome()` raises the error that ended a
turn or an agent run, with the result attached, and `rillet.explain` says it in the line the
command line prints. Real turns against a provider on loopback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
from rillet import (
    AuthenticationError,
    RescueFailed,
    RunFailed,
    TransportError,
    TurnRequest,
    explain,
    open_turn,
    run_agent,
    run_turn,
    user,
)
from rillet.providers import OpenAIChatDialect, Provider, Secret
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    refused_url,
    status_reply,
)

from ..agent_support import CASES

if TYPE_CHECKING:
    import trio.testing

KEY = "sk-proj-abcdefghijklmnop3456"
ASK = TurnRequest(messages=[user("Hi")])


def provider(url: str) -> Provider:
    return Provider(OpenAIChatDialect(), f"{url}/v1", "gpt-4o-mini", api_key=Secret(KEY))


async def get_weather(city: str = "", location: str = "", unit: str = "celsius") -> str:
    """Today's weather."""
    return "sunny"


async def test_a_completed_turn_returns_itself() -> None:
    reply = Reply(chunks=(openai_text_stream(["Hello"]),))
    async with open_loopback_provider([reply]) as loopback:
        result = await run_turn(ASK, provider(loopback.url))
    assert result.raise_for_outcome() is result
    assert result.code == "completed"


async def test_a_refused_key_raises_its_error_with_the_result_and_the_clis_line() -> None:
    said = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request"}}
    async with open_loopback_provider([status_reply(401, body=said)]) as loopback:
        result = await run_turn(ASK, provider(loopback.url))
    with pytest.raises(AuthenticationError) as raised:
        result.raise_for_outcome()
    error = raised.value
    assert error is result.error
    assert error.result is result
    assert result.code == "authentication_failed"
    line = explain(error)  # the attached result names the provider and the attempts
    assert line == (
        "authentication failed (401): Incorrect API key provided: …3456 — check the API key"
        " (--api-key)"
    )
    assert KEY not in line


async def test_an_unreachable_provider_raises_with_the_connections_failure(
    loop_clock: trio.testing.MockClock,
) -> None:
    url = refused_url()
    result = await run_turn(ASK, provider(url))
    with pytest.raises(RescueFailed) as raised:  # streaming, then the rescue, could not connect
        result.raise_for_outcome()
    assert isinstance(raised.value.stream_error, TransportError)
    host = url.removeprefix("http://")
    assert explain(raised.value).startswith(f"cannot connect to {host}: connection refused (")
    # without the result, the line still says the cause, if not where
    line = explain(raised.value.stream_error, attempts=1)
    assert line.startswith("cannot connect to the provider: connection refused")


async def test_a_cancelled_turn_raises_run_failed_cancelled() -> None:
    reply = Reply(chunks=(openai_text_stream(["Hello"]),), stall_headers=True)
    async with (
        open_loopback_provider([reply]) as loopback,
        open_turn(ASK, provider(loopback.url)) as turn,
    ):
        turn.cancel()
        result = await turn.result()
    with pytest.raises(RunFailed) as raised:
        result.raise_for_outcome()
    assert (raised.value.code, raised.value.result) == ("cancelled", result)
    assert explain(raised.value) == "the run was stopped before it completed — ask again if wanted"


async def test_an_agent_that_fails_raises_its_steps_error(
    loop_clock: trio.testing.MockClock,
) -> None:
    async with open_loopback_provider([status_reply(401)]) as loopback:
        result = await run_agent(ASK, provider(loopback.url), tools=[get_weather])
    with pytest.raises(AuthenticationError) as raised:
        result.raise_for_outcome()
    assert raised.value.result is result
    assert result.code == "authentication_failed"


async def test_an_agent_out_of_steps_raises_run_failed_with_its_code(
    loop_clock: trio.testing.MockClock,
) -> None:
    async with open_loopback_provider([CASES["openai-chat"].tool_call]) as loopback:
        result = await run_agent(ASK, provider(loopback.url), tools=[get_weather], max_steps=1)
    assert (result.status, result.code) == ("error", "max_steps")
    with pytest.raises(RunFailed) as raised:
        result.raise_for_outcome()
    assert raised.value.code == "max_steps"
    assert explain(raised.value) == (
        "the agent reached its step limit without an answer — raise max_steps"
    )
