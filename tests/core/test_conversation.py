"""Conversation state: each turn's assistant message recorded as assembled, sent back with its
fidelity intact on every dialect. Each case plays a recorded reply that carries fidelity
(Anthropic's thinking signature and redacted thinking, the Responses API's encrypted
reasoning, Gemini's thought signatures, OpenRouter's reasoning details), then a second run
on the same conversation; the second request's recorded body must carry it verbatim."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from rillet import (
    Conversation,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    TurnRequest,
    UniMessage,
    run_agent,
    user,
)
from rillet.providers import (
    AnthropicDialect,
    Dialect,
    GeminiDialect,
    OpenAIChatDialect,
    OpenAIResponsesDialect,
)
from rillet.transports.testing import fixture_reply, open_loopback_provider

from ..agent_support import FIXTURES, LIMIT, QUESTION, body_of, loop_clock, provider_at, text_reply

clock = pytest.fixture(name="loop_clock")(loop_clock)


def fidelities(name: str) -> list[dict[str, Any]]:
    """The fidelity of every `.done` item of a recorded reply, in order."""
    items = json.loads((FIXTURES / f"{name}.expected.json").read_text("utf-8"))
    return [i["fidelity"] for i in items if i["type"].endswith(".done") and i.get("fidelity")]


def anthropic_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in body["messages"] if m["role"] == "assistant" for b in m["content"]]


def check_anthropic_signature(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    [thinking] = [b for b in anthropic_blocks(body) if b["type"] == "thinking"]
    assert thinking["signature"] == fidelity[0]["signature"]


def check_anthropic_redacted(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    blocks = [b for b in anthropic_blocks(body) if b["type"] != "text"]
    assert [b.get("signature", b.get("data")) for b in blocks] == [f["signature"] for f in fidelity]
    assert "redacted_thinking" in {b["type"] for b in blocks}


def check_responses_encrypted(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    [reasoning] = [i for i in body["input"] if i.get("type") == "reasoning"]
    assert reasoning["encrypted_content"] == fidelity[0]["encrypted_content"]


def check_gemini_signature(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    model = [c for c in body["contents"] if c["role"] == "model"]
    signed = [p["thoughtSignature"] for c in model for p in c["parts"] if "thoughtSignature" in p]
    assert signed == [f["signature"] for f in fidelity]


def check_openrouter_details(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    [assistant] = [m for m in body["messages"] if m["role"] == "assistant"]
    assert [d.get("signature") for d in assistant["reasoning_details"]] == [
        f["signature"] for f in fidelity
    ]


def check_deepseek_field(body: dict[str, Any], fidelity: list[dict[str, Any]]) -> None:
    [assistant] = [m for m in body["messages"] if m["role"] == "assistant"]
    assert assistant[fidelity[0]["reasoning_field"]]


CASES: dict[str, tuple[type[Dialect], str, str, Any]] = {
    "anthropic-signature": (
        AnthropicDialect,
        "anthropic-messages/thinking_signature",
        "anthropic-messages/text.sse",
        check_anthropic_signature,
    ),
    "anthropic-redacted": (
        AnthropicDialect,
        "anthropic-messages/redacted_thinking",
        "anthropic-messages/text.sse",
        check_anthropic_redacted,
    ),
    "responses-encrypted": (
        OpenAIResponsesDialect,
        "openai-responses/reasoning_encrypted",
        "openai-responses/text.sse",
        check_responses_encrypted,
    ),
    "gemini-thought-signature": (
        GeminiDialect,
        "gemini/thinking_signature",
        "gemini/text.sse",
        check_gemini_signature,
    ),
    "openrouter-reasoning-details": (
        OpenAIChatDialect,
        "openai-chat/reasoning_openrouter_signature",
        "",
        check_openrouter_details,
    ),
    "deepseek-reasoning-field": (
        OpenAIChatDialect,
        "openai-chat/reasoning_deepseek",
        "",
        check_deepseek_field,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_fidelity_goes_back_verbatim_on_the_next_request(
    loop_clock: trio.testing.MockClock, case: str
) -> None:
    dialect, recorded, follow_up, check = CASES[case]
    first = fixture_reply(FIXTURES / f"{recorded}.sse")
    second = fixture_reply(FIXTURES / follow_up) if follow_up else text_reply("Sure.")
    conversation = Conversation(system_prompt="Be brief.")
    async with open_loopback_provider([first, second]) as server:
        with trio.fail_after(LIMIT):
            provider = provider_at(server, dialect())
            one = await run_agent(QUESTION, provider, conversation=conversation)
            assert one.status == "completed", one.code
            two = await run_agent(
                TurnRequest(messages=[user("And tomorrow?")]), provider, conversation=conversation
            )
            assert two.status == "completed", two.code
    expected = fidelities(recorded)
    assert expected
    recorded_items = conversation.messages[1].content_items
    kept = [getattr(i, "fidelity", None) for i in recorded_items]
    assert [f for f in kept if f] == expected
    body = body_of(server, 1)
    check(body, expected)
    assert [m.role for m in conversation.messages] == ["user", "assistant", "user", "assistant"]


def test_a_gemini_function_call_keeps_its_signature_next_to_its_result() -> None:
    signature = fidelities("gemini/function_call")[0]["signature"]
    call = ToolCallDone(
        name="get_weather",
        arguments={"location": "Florence, Italy"},
        tool_call_id="get_weather",
        fidelity={"signature": signature},
    )
    conversation = Conversation()
    conversation.add_user("Weather in Florence?")
    conversation.record(
        UniMessage(role="assistant", content_items=[call], finish_reason="tool_call")
    )
    conversation.add_tool_results([ToolResultDone(text="22 C", tool_call_id="get_weather")])
    body = _build(GeminiDialect(), conversation)
    model, result = body["contents"][1], body["contents"][2]
    assert model["parts"] == [
        {
            "functionCall": {"name": "get_weather", "args": {"location": "Florence, Italy"}},
            "thoughtSignature": signature,
        }
    ]
    assert result["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"output": "22 C"}}}
    ]


def test_tool_results_follow_their_calls_order() -> None:
    calls = [
        ToolCallDone(name="a", arguments={}, tool_call_id="1"),
        ToolCallDone(name="b", arguments={}, tool_call_id="2"),
    ]
    conversation = Conversation()
    conversation.add_user("go")
    conversation.record(UniMessage(role="assistant", content_items=list(calls)))
    assert conversation.tool_calls() == calls
    message = conversation.add_tool_results(
        [ToolResultDone(text="b", tool_call_id="2"), ToolResultDone(text="a", tool_call_id="1")]
    )
    assert [i.tool_call_id for i in message.content_items] == ["1", "2"]  # type: ignore[union-attr]
    assert conversation.tool_calls() == []


def test_only_assistant_messages_are_recorded_and_state_round_trips_as_json() -> None:
    conversation = Conversation(system_prompt="x")
    with pytest.raises(ValueError, match="assistant"):
        conversation.record(user("hi"))
    conversation.add_user("hi")
    thinking = ThinkingDone(thinking="", fidelity={"signature": "EqQBCgIYAh"})
    conversation.record(UniMessage(role="assistant", content_items=[thinking, TextDone(text="y")]))
    again = Conversation.decode(conversation.encode())
    assert again.messages == conversation.messages
    assert again.system_prompt == "x"


def _build(dialect: Dialect, conversation: Conversation) -> dict[str, Any]:
    from rillet.providers import Provider, Secret

    provider = Provider(
        dialect=dialect, base_url="http://127.0.0.1:9", model="m", api_key=Secret("k" * 16)
    )
    parsed: dict[str, Any] = dialect.build_request(conversation.request(), provider).json()
    return parsed
