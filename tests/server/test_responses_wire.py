"""OpenAI's Responses wire piece by piece: the request's refusals for each upstream wire
(sans-I/O), and the real server over loopback with Anthropic's Messages wire behind it (real
recorded streams): thinking as a reasoning summary, an answer cut at the token limit, a failure
mid-stream, and a field Anthropic's wire has no place for."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider
from rillet._core._policy import Policy
from rillet.providers._openai_chat._inbound import BadRequest
from rillet.providers._openai_responses._inbound import decode_responses_body, responses_request
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import RecordedRequest, Reply, fixture_reply, open_loopback_provider

from ..wire_cases import wire_path

# --- the request ----------------------------------------------------------------------------------


def _request(dialect: str, **body: Any) -> Any:
    body = {"model": "m", "input": "hi", **body}
    return responses_request(decode_responses_body(msgspec.json.encode(body)), dialect)


SCHEMA = {"type": "json_schema", "name": "W", "schema": {"type": "object"}, "strict": True}


@pytest.mark.parametrize(
    ("dialect", "field", "value", "param"),
    [
        ("anthropic", "text", {"format": SCHEMA}, "text.format"),
        ("anthropic", "text", {"verbosity": "low"}, "text.verbosity"),
        ("gemini", "top_p", 0.5, "top_p"),
        ("mmsp", "text", {"format": {"type": "json_object"}}, "text.format"),
        ("anthropic", "parallel_tool_calls", False, "parallel_tool_calls"),
        ("anthropic", "include", ["message.output_text.logprobs"], "include"),
        ("openai-chat", "truncation", "auto", "truncation"),
        ("openai-chat", "max_tool_calls", 3, "max_tool_calls"),
        ("openai-chat", "top_logprobs", 2, "top_logprobs"),
    ],
)
def test_what_the_upstream_wire_cannot_take_is_refused_by_name(
    dialect: str, field: str, value: Any, param: str
) -> None:
    with pytest.raises(BadRequest, match="cannot be sent to this model's provider") as refused:
        _request(dialect, **{field: value})
    assert (refused.value.param, refused.value.code) == (param, "unsupported_parameter")


HINTS = {
    "metadata": {"k": "v"},
    "prompt_cache_key": "conversation-1",
    "safety_identifier": "end-user-1",
    "parallel_tool_calls": True,
    "include": ["reasoning.encrypted_content"],
    "store": False,
    "truncation": "disabled",
    "top_p": 0.9,
    "reasoning": {"effort": "low", "summary": "auto"},
}


def test_hints_and_defaults_go_to_anthropic_with_what_its_wire_can_carry() -> None:
    request = _request("anthropic", **HINTS)
    assert request.extra_body["anthropic"] == {"top_p": 0.9, "metadata": {"user_id": "end-user-1"}}
    assert request.thinking_level == "low"


def test_a_responses_provider_gets_every_field_whole() -> None:
    odd = {"truncation": "auto", "max_tool_calls": 3, "text": {"format": SCHEMA}}
    request = _request("openai-responses", **{**HINTS, **odd})
    sent = request.extra_body["openai-responses"]
    assert {k: sent[k] for k in odd} == odd
    assert sent["prompt_cache_key"] == "conversation-1"


def test_a_chat_provider_gets_the_fields_of_its_own_names() -> None:
    request = _request("openai-chat", **HINTS, text={"format": SCHEMA, "verbosity": "low"})
    sent = request.extra_body["openai-chat"]
    assert sent["response_format"]["json_schema"]["name"] == "W"
    assert (sent["verbosity"], sent["reasoning_effort"], sent["top_p"]) == ("low", "low", 0.9)
    assert sent["prompt_cache_key"] == "conversation-1"


# --- the server, Anthropic's wire behind it ----------------------------------------------------


def _config(url: str) -> ServerConfig:
    provider = Provider(dialect_from_name("anthropic"), url, "claude-loop")
    policy = Policy(rate_limit_retries=0, transport_retries=0, backoff_base=0.01)
    return ServerConfig(provider=provider, port=0, policy=policy)


def _events(text: str) -> list[dict[str, Any]]:
    frames = [f for f in text.split("\n\n") if f.startswith("event: ")]
    out = []
    for frame in frames:
        name, data = frame.split("\n", 1)
        event = msgspec.json.decode(data.removeprefix("data: "))
        assert event["type"] == name.removeprefix("event: ")
        out.append(event)
    return out


async def _post(reply: Reply, body: dict[str, Any]) -> tuple[httpx.Response, list[RecordedRequest]]:
    with trio.fail_after(20):
        async with (
            open_loopback_provider([reply]) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await nursery.start(functools.partial(serve, _config(loopback.url)))
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.post(f"{url}/v1/responses", json=body)
            nursery.cancel_scope.cancel()
    return answer, loopback.requests


def _recorded(case: str, **fields: Any) -> Reply:
    return fixture_reply(wire_path("anthropic-messages", case), chunk_size=53, **fields)


ASK = {"model": "claude-loop", "input": "27 × 453?", "max_output_tokens": 400}


async def test_anthropic_thinking_streams_as_a_reasoning_summary_then_the_message() -> None:
    reasoning = {"effort": "low", "summary": "auto"}
    answer, sent = await _post(
        _recorded("thinking_signature"), {**ASK, "stream": True, "reasoning": reasoning}
    )
    events = _events(answer.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.reasoning_summary_text.delta" in kinds
    final = events[-1]["response"]
    assert (events[-1]["type"], final["status"]) == ("response.completed", "completed")
    reasoning_item, message = final["output"]
    assert reasoning_item["summary"][0]["text"].endswith("= 12231.")
    assert message["content"][0]["text"] == "27 × 453 = **12,231**."
    assert final["usage"]["input_tokens"] == 48
    assert final["usage"]["output_tokens"] == 112
    assert final["usage"]["total_tokens"] == 160
    body = msgspec.json.decode(sent[0].body)
    assert body["max_tokens"] == 400
    assert body["thinking"]["type"] in ("enabled", "adaptive")


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_cut_at_the_token_limit_is_incomplete(stream: bool) -> None:
    answer, _ = await _post(_recorded("max_tokens"), {**ASK, "stream": stream})
    if stream:
        last = _events(answer.text)[-1]
        assert last["type"] == "response.incomplete"
        response = last["response"]
    else:
        response = answer.json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["content"][0]["text"].endswith("reshaped")


async def test_an_upstream_failure_mid_stream_is_a_failed_response_saying_what_happened() -> None:
    answer, _ = await _post(_recorded("error_overloaded"), {**ASK, "stream": True})
    events = _events(answer.text)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Sure, here is the"
    last = events[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["status"] == "failed"
    error = last["response"]["error"]
    assert error["code"]
    assert "overloaded" in error["message"]  # a sentence saying what happened and what to do


async def test_a_field_anthropics_wire_cannot_take_is_refused_and_nothing_goes_upstream() -> None:
    schema = {"format": SCHEMA}
    answer, sent = await _post(_recorded("text"), {**ASK, "text": schema})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == ("text.format", "unsupported_parameter")
    assert "(anthropic)" in error["message"]
    assert not sent
