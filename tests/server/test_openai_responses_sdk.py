"""The `openai` SDK's Responses client against `rillet serve`'s `POST /v1/responses`, with a
provider of OpenAI's Chat Completions wire behind it (the recording loopback provider): a whole
response, the raw event stream, the `stream()` helper, a function tool round trip, reasoning
shown as a summary, structured output with `parse()`, the upstream's refusal of a parameter as
the SDK's own error class, a field the server cannot honour refused, and a client that leaves
mid-stream cancelling the provider's request.

The SDK runs in its own virtualenv (see `test_openai_interop`)."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_stream,
    split,
    sse,
    status_reply,
)

from .test_openai_interop import run_client, sdk_python

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

SERVER_KEY = "responses-sdk-key-0123456789"
MODEL = "loop-gpt"
POLICY = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)
HEAD = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {**HEAD, "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9}}


def _tool_call_stream() -> bytes:
    first = {"index": 0, "id": "call_w1", "type": "function"}
    return sse(
        _chunk({"role": "assistant", "content": None}),
        _chunk({"tool_calls": [{**first, "function": {"name": "get_weather", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        _chunk({}, "tool_calls"),
        USAGE,
        "[DONE]",
    )


def _reasoning_stream() -> bytes:
    return sse(
        _chunk({"role": "assistant", "content": None}),
        _chunk({"reasoning_content": "Paris is "}),
        _chunk({"reasoning_content": "in France."}),
        _chunk({"content": "It is in France."}),
        _chunk({}, "stop"),
        USAGE,
        "[DONE]",
    )


INVALID_TEMPERATURE = {
    "message": "Unsupported value: 'temperature' does not support 0.2 with this model.",
    "type": "invalid_request_error",
    "param": "temperature",
    "code": "unsupported_value",
}


def _said(body: dict[str, Any]) -> str:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return f"TOOL_RESULT {last['content']}"
    content = last["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _upstream(request: RecordedRequest, _: int) -> Reply:
    said = _said(msgspec.json.decode(request.body))
    if said.startswith("TOOL_RESULT"):
        return Reply(chunks=split(openai_text_stream(["It is ", said.split()[-1], "."]), 23))
    if "WEATHER" in said:
        return Reply(chunks=split(_tool_call_stream(), 31))
    if "THINK" in said:
        return Reply(chunks=split(_reasoning_stream(), 29))
    if "TEMPERATURE" in said:
        return status_reply(400, body={"error": INVALID_TEMPERATURE})
    if "JSON" in said:
        return Reply(chunks=split(openai_text_stream(['{"city": ', '"Paris"}']), 17))
    if "SLOW" in said:
        return Reply(chunks=split(openai_text_stream(["w "] * 40), 40), chunk_delay=0.25)
    return Reply(chunks=split(openai_text_stream(["Hello", ", ", "world", "!"]), 21))


CLIENT_HEAD = r"""
import json, sys
import openai
from openai import OpenAI

spec = json.load(sys.stdin)
client = OpenAI(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
model = spec["model"]
out = {}

def error_of(exc):
    return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None),
            "body": getattr(exc, "body", None)}
"""
"""The start of a client script: the SDK's client for the server in `spec`, `out` for what it
prints, and `error_of` for what it raised."""

CLIENT = r"""
from pydantic import BaseModel

class Weather(BaseModel):
    city: str

whole = client.responses.create(model=model, input="Say hello")
out["whole"] = {"text": whole.output_text, "status": whole.status, "id": whole.id,
                "object": whole.object, "types": [item.type for item in whole.output],
                "usage": whole.usage.model_dump() if whole.usage else None}

events = list(client.responses.create(model=model, input="Say hello, streamed", stream=True))
out["raw"] = {"types": [e.type for e in events], "seq": [e.sequence_number for e in events],
              "deltas": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
              "final": events[-1].response.output_text, "status": events[-1].response.status}

with client.responses.stream(model=model, input="Say hello, helped",
                             instructions="Be brief.") as stream:
    deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    final = stream.get_final_response()
out["helper"] = {"deltas": deltas, "text": final.output_text}

tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False},
          "strict": True}]
asked = [{"role": "user", "content": "WEATHER in Paris?"}]
with client.responses.stream(model=model, input=asked, tools=tools) as stream:
    arguments = "".join(e.delta for e in stream
                        if e.type == "response.function_call_arguments.delta")
    first = stream.get_final_response()
calls = [item for item in first.output if item.type == "function_call"]
answer = client.responses.create(
    model=model, tools=tools,
    input=asked + [calls[0].model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": calls[0].call_id,
                    "output": "sunny"}])
out["tool"] = {"streamed_arguments": arguments, "name": calls[0].name,
               "arguments": calls[0].arguments, "call_id": calls[0].call_id,
               "answer": answer.output_text}

thought = client.responses.create(model=model, input="THINK: where is Paris?",
                                  reasoning={"effort": "low", "summary": "auto"})
summaries = [s.text for item in thought.output if item.type == "reasoning" for s in item.summary]
out["reasoning"] = {"summary": summaries, "text": thought.output_text,
                    "types": [item.type for item in thought.output]}

parsed = client.responses.parse(model=model, input="JSON for Paris", text_format=Weather)
out["parsed"] = parsed.output_parsed.model_dump() if parsed.output_parsed else None

refused = (
    ("upstream_400", {"input": "TEMPERATURE", "temperature": 0.2}),
    ("refused_field", {"input": "hi", "previous_response_id": "resp_1"}),
    ("built_in_tool", {"input": "hi", "tools": [{"type": "web_search"}]}),
)
"""

REFUSED_THEN_LEFT = r"""
for name, fields in refused:
    try:
        client.responses.create(model=model, **fields)
        out[name] = None
    except openai.APIError as exc:
        out[name] = error_of(exc)

with client.responses.create(model=model, input="SLOW story", stream=True) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            break  # the reader leaves mid-stream
json.dump(out, sys.stdout, ensure_ascii=False)
"""
"""The end of a client script: each of its `refused` requests' error (`error_of`), then a
stream it leaves after the first text (the upstream's `SLOW story` answer)."""


async def run_sdk(
    python: Path,
    script: str,
    *,
    upstream: Script = _upstream,
    model: str = MODEL,
    **config: Any,
) -> tuple[dict[str, Any], LoopbackProvider]:
    """Run the SDK's `script` against a server with the scripted `upstream` behind it (its
    OpenAI Chat provider at `/v1`, and what `config` adds to the server's configuration, a
    function of the loopback's URL each); what the script printed (JSON), and the upstream.
    It waits, at most 10 s, for the server's runs to end, and gives how long that took as
    `_runs_ended_after`: a reader that left stopped its run long before the slow answer ends."""
    with trio.fail_after(150):
        async with open_loopback_provider(upstream) as loopback, trio.open_nursery() as nursery:
            provider = Provider(
                dialect_from_name("openai"),
                f"{loopback.url}/v1",
                MODEL,
                api_key=Secret("sk-upstream-0123456789abcdef"),
            )
            settings: dict[str, Any] = {"port": 0, "api_key": Secret(SERVER_KEY), "policy": POLICY}
            settings |= {name: value(loopback.url) for name, value in config.items()}
            server = ServerConfig(provider=provider, **settings)
            url = await nursery.start(functools.partial(serve, server))
            spec = {"base_url": f"{url}/v1", "key": SERVER_KEY, "model": model}
            done = await run_client(python, script, spec)
            assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
            left = trio.current_time()
            with trio.move_on_after(10):
                key = {"authorization": f"Bearer {SERVER_KEY}"}
                async with httpx.AsyncClient() as http:
                    while True:
                        metrics = await http.get(f"{url}/metrics.json", headers=key)
                        if not metrics.json()["runs_active"]:
                            break
                        await trio.sleep(0.05)
            ended = trio.current_time() - left
            nursery.cancel_scope.cancel()
    out: dict[str, Any] = json.loads(done.stdout)
    out["_runs_ended_after"] = ended
    return out, loopback


async def _collect(python: Path) -> dict[str, Any]:
    out, loopback = await run_sdk(python, CLIENT_HEAD + CLIENT + REFUSED_THEN_LEFT)
    out["_sent"] = [msgspec.json.decode(r.body) for r in loopback.requests]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def _sent(sdk: dict[str, Any], keyword: str) -> dict[str, Any]:
    bodies: list[dict[str, Any]] = sdk["_sent"]
    (body,) = [b for b in bodies if keyword in _said(b)]
    return body


def test_a_whole_response_has_its_message_and_usage(sdk: dict[str, Any]) -> None:
    whole = sdk["whole"]
    assert (whole["text"], whole["status"], whole["object"]) == (
        "Hello, world!",
        "completed",
        "response",
    )
    assert whole["types"] == ["message"]
    assert whole["id"].startswith("resp_")
    assert whole["usage"]["input_tokens"] == 12
    assert whole["usage"]["output_tokens"] == 4
    assert whole["usage"]["total_tokens"] == 16


def test_the_event_stream_is_numbered_from_zero_and_ends_completed(sdk: dict[str, Any]) -> None:
    raw = sdk["raw"]
    assert raw["seq"] == list(range(len(raw["seq"])))
    assert raw["types"][:2] == ["response.created", "response.in_progress"]
    assert raw["types"][2:4] == ["response.output_item.added", "response.content_part.added"]
    assert raw["types"][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert raw["deltas"] == raw["final"] == "Hello, world!"
    assert raw["status"] == "completed"


def test_the_stream_helper_assembles_the_final_response(sdk: dict[str, Any]) -> None:
    assert sdk["helper"] == {"deltas": "Hello, world!", "text": "Hello, world!"}
    sent = _sent(sdk, "helped")
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}


def test_a_function_tool_round_trip(sdk: dict[str, Any]) -> None:
    tool = sdk["tool"]
    assert tool["name"] == "get_weather"
    assert tool["call_id"] == "call_w1"
    assert json.loads(tool["arguments"]) == {"city": "Paris"}
    assert json.loads(tool["streamed_arguments"]) == {"city": "Paris"}
    assert tool["answer"] == "It is sunny."
    asked = _sent(sdk, "WEATHER")
    (function,) = [t["function"] for t in asked["tools"]]
    assert function["name"] == "get_weather"
    assert function["strict"] is True  # passed through whole
    answered = _sent(sdk, "TOOL_RESULT")
    assert answered["messages"][-2]["tool_calls"][0]["id"] == "call_w1"
    assert answered["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_w1",
        "content": "sunny",
    }


def test_thinking_comes_back_as_a_reasoning_summary(sdk: dict[str, Any]) -> None:
    reasoning = sdk["reasoning"]
    assert reasoning["types"] == ["reasoning", "message"]
    assert reasoning["summary"] == ["Paris is in France."]
    assert reasoning["text"] == "It is in France."
    assert _sent(sdk, "THINK")["reasoning_effort"] == "low"


def test_structured_output_reaches_the_provider_as_its_response_format(sdk: dict[str, Any]) -> None:
    assert sdk["parsed"] == {"city": "Paris"}
    form = _sent(sdk, "JSON")["response_format"]
    assert form["type"] == "json_schema"
    assert form["json_schema"]["name"] == "Weather"
    assert form["json_schema"]["strict"] is True


def test_an_upstream_refusal_of_a_parameter_is_the_sdks_bad_request(sdk: dict[str, Any]) -> None:
    error = sdk["upstream_400"]
    assert (error["class"], error["status"]) == ("BadRequestError", 400)
    assert error["body"]["param"] == "temperature"
    assert error["body"]["code"] == "unsupported_value"


def test_what_the_server_cannot_honour_is_refused_by_name(sdk: dict[str, Any]) -> None:
    refused = sdk["refused_field"]
    assert (refused["class"], refused["status"]) == ("BadRequestError", 400)
    assert refused["body"]["code"] == "unsupported_parameter"
    assert refused["body"]["param"] == "previous_response_id"
    tool = sdk["built_in_tool"]
    assert tool["body"]["code"] == "unsupported_value"
    assert tool["body"]["param"] == "tools[0].type"
    assert not [b for b in sdk["_sent"] if _said(b) == "hi"]  # neither reached the provider


def test_a_reader_that_leaves_cancels_the_providers_request(sdk: dict[str, Any]) -> None:
    assert sdk["_runs_ended_after"] < 3.0  # the slow answer alone takes 10 s
