"""The `openai` SDK's Responses client against `rillet serve`'s `POST /v1/responses` with an
Anthropic Messages provider behind it (the recording loopback provider replaying recorded
Anthropic streams, the model routed as `anthropic/...`): thinking as a reasoning summary, a
tool call as a `function_call` item and its round trip, the token limit as
`response.incomplete`, an upstream failure mid-stream as `response.failed` with its sentence,
upstream refusals as the SDK's own error classes, and a reader that leaves mid-stream cancelling
the provider's request.

The SDK runs in its own virtualenv (see `test_openai_interop`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
from rillet._core._policy import Policy
from rillet.transports.server import Limits
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    fixture_reply,
    openai_text_stream,
    split,
    status_reply,
)

from ..wire_cases import wire_path
from .test_openai_interop import sdk_python
from .test_openai_responses_sdk import CLIENT_HEAD, REFUSED_THEN_LEFT, run_sdk

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

ROUTED = "anthropic/claude-sonnet-4-5"
POLICY = Policy(
    rate_limit_retries=0, transport_retries=0, rescue=False, backoff_base=0.01, random=lambda: 0.0
)
RATE_LIMITED = {"type": "rate_limit_error", "message": "Number of request tokens has exceeded."}
INVALID = {"type": "invalid_request_error", "message": "temperature: must be at most 1.0"}


def _said(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    kinds = [part.get("type") for part in content]
    if "tool_result" in kinds:
        return "TOOL_RESULT"
    return "".join(part.get("text", "") for part in content)


def _upstream(request: RecordedRequest, _: int) -> Reply:
    if not request.path.startswith("/anthropic/"):
        return Reply(chunks=split(openai_text_stream(["not Anthropic"]), 17))
    said = _said(msgspec.json.decode(request.body))
    case = "text"
    if "THINK" in said:
        case = "thinking_signature"
    elif "WEATHER" in said:
        case = "tool_use"
    elif "LIMIT" in said:
        case = "max_tokens"
    elif "OVERLOADED" in said:  # text, then Anthropic's in-stream error
        return fixture_reply(wire_path("anthropic-messages", "error_overloaded"), chunk_size=97)
    elif "RATE" in said:
        return status_reply(429, body={"type": "error", "error": RATE_LIMITED})
    elif "INVALID" in said:
        return status_reply(400, body={"type": "error", "error": INVALID})
    elif "SLOW" in said:
        return fixture_reply(
            wire_path("anthropic-messages", "text"), chunk_size=8, chunk_delay=0.25
        )
    return fixture_reply(wire_path("anthropic-messages", case), chunk_size=41)


CLIENT = r"""
def raw(**fields):
    events = list(client.responses.create(model=model, stream=True, **fields))
    return [e.model_dump() for e in events]

out["thinking"] = raw(input="THINK: 27 times 453?", reasoning={"effort": "high"},
                      max_output_tokens=2048)
with client.responses.stream(model=model, input="THINK again") as stream:
    final = stream.get_final_response()
out["thinking_whole"] = final.model_dump()

tools = [{"type": "function", "name": "get_weather", "description": "The weather.",
          "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                                                          "unit": {"type": "string"}}},
          "strict": False}]
asked = [{"role": "user", "content": [{"type": "input_text", "text": "WEATHER in Paris?"}]}]
first = client.responses.create(model=model, input=asked, tools=tools, tool_choice="auto")
calls = [item for item in first.output if item.type == "function_call"]
answer = client.responses.create(
    model=model, tools=tools,
    input=asked + [item.model_dump(exclude_none=True) for item in first.output]
    + [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}])
out["tool"] = {"first": first.model_dump(), "answer": answer.output_text}

out["limited"] = raw(input="LIMIT: the French Revolution", max_output_tokens=10)
whole_limited = client.responses.create(model=model, input="LIMIT again", max_output_tokens=10)
out["limited_whole"] = whole_limited.model_dump()
out["overloaded"] = raw(input="OVERLOADED")

refused = (("rate", {"input": "RATE"}), ("invalid", {"input": "INVALID"}))
"""


async def _collect(python: Path) -> dict[str, Any]:
    """What the SDK's script printed against a server routing `anthropic/...` to the loopback
    provider, and the bodies the provider got (see `run_sdk`)."""
    out, loopback = await run_sdk(
        python,
        CLIENT_HEAD + CLIENT + REFUSED_THEN_LEFT,
        upstream=_upstream,
        model=ROUTED,
        policy=lambda _: POLICY,
        limits=lambda _: Limits(heartbeat=0.5),
        route_kinds=lambda _: ("anthropic",),
        route_env=lambda url: {
            "ANTHROPIC_BASE_URL": f"{url}/anthropic",
            "ANTHROPIC_API_KEY": "upstream-anthropic-key",
        },
    )
    out["_sent"] = [(r.path, msgspec.json.decode(r.body)) for r in loopback.requests]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def _sent(sdk: dict[str, Any], keyword: str) -> list[dict[str, Any]]:
    return [body for _, body in sdk["_sent"] if keyword in _said(body)]


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_every_request_reached_the_anthropic_provider(sdk: dict[str, Any]) -> None:
    assert {path for path, _ in sdk["_sent"]} == {"/anthropic/v1/messages"}
    assert {body["model"] for _, body in sdk["_sent"]} == {"claude-sonnet-4-5"}


def test_anthropic_thinking_streams_as_a_reasoning_summary(sdk: dict[str, Any]) -> None:
    events = sdk["thinking"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    summary = "".join(e["delta"] for e in _of(events, "response.reasoning_summary_text.delta"))
    assert summary.startswith("Let me work out 27 × 453.")
    (done,) = _of(events, "response.reasoning_summary_text.done")
    assert done["text"] == summary
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert "12231" in final["output"][1]["content"][0]["text"].replace(",", "")
    assert final["usage"]["input_tokens"] == 48
    assert final["usage"]["total_tokens"] == 48 + final["usage"]["output_tokens"]
    (asked,) = _sent(sdk, "27 times")
    assert asked["max_tokens"] == 2048
    assert asked["thinking"]["type"] in ("enabled", "adaptive")
    helped = sdk["thinking_whole"]
    assert [item["type"] for item in helped["output"]] == ["reasoning", "message"]


def test_an_anthropic_tool_use_is_a_function_call_and_its_round_trip(sdk: dict[str, Any]) -> None:
    first = sdk["tool"]["first"]
    assert [item["type"] for item in first["output"]] == ["message", "function_call"]
    call = first["output"][1]
    assert (call["name"], call["call_id"]) == ("get_weather", "toolu_01NRLabsLyVHZPKxbKvkfSMn")
    assert json.loads(call["arguments"]) == {"location": "Paris, France", "unit": "celsius"}
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 2048
    (asked,) = _sent(sdk, "WEATHER")
    assert asked["tools"][0]["name"] == "get_weather"
    assert asked["tool_choice"] == {"type": "auto"}
    (answered,) = _sent(sdk, "TOOL_RESULT")
    (result,) = [p for p in answered["messages"][-1]["content"] if p["type"] == "tool_result"]
    assert result["tool_use_id"] == "toolu_01NRLabsLyVHZPKxbKvkfSMn"
    assert result["content"] in ("18 C", [{"type": "text", "text": "18 C"}])
    assert sdk["tool"]["answer"]


def test_the_token_limit_is_response_incomplete(sdk: dict[str, Any]) -> None:
    events = sdk["limited"]
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["content"][0]["text"].startswith("The French Revolution")
    whole = sdk["limited_whole"]
    assert (whole["status"], whole["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )


def test_an_upstream_failure_mid_stream_is_response_failed(sdk: dict[str, Any]) -> None:
    events = sdk["overloaded"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"]
    assert len(failed["error"]["message"]) > 20  # a sentence, not a bare code
    assert "".join(e["delta"] for e in _of(events, "response.output_text.delta")).startswith(
        "Sure, here"
    )


def test_upstream_refusals_are_the_sdks_own_error_classes(sdk: dict[str, Any]) -> None:
    assert (sdk["rate"]["class"], sdk["rate"]["status"]) == ("RateLimitError", 429)
    assert (sdk["invalid"]["class"], sdk["invalid"]["status"]) == ("BadRequestError", 400)
    assert "temperature" in sdk["invalid"]["body"]["message"]


def test_a_reader_that_leaves_cancels_the_providers_request(sdk: dict[str, Any]) -> None:
    assert sdk["_runs_ended_after"] < 3.0  # the slow answer alone takes over 40 s
