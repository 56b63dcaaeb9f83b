"""The `openai` SDK as the client of `rillet serve`, for what a gateway must pass through whole:
the request's fields as the SDK sends them (a strict tool from `pydantic_function_tool`, a
`reasoning_effort` of `minimal`, a speaker's `name`, structured output), a model's refusal as
`parse()` and the `stream()` helper read it, the upstream's refusal of the server's own key,
and its refusal of the request with the `param`, `code` and `type` it gave.

The SDK runs in its own virtualenv (see `test_openai_interop`); behind the server is the
recording loopback provider speaking OpenAI's wire."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
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

SERVER_KEY = "openai-fidelity-key-0123456789"
MODEL = "loop-gpt"
REFUSAL = ["I'm sorry, ", "I can't help with that."]
POLICY = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)


def _refusal_stream() -> bytes:
    """A refusal as OpenAI streams it: `refusal` fragments in place of `content`, then `stop`."""
    head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    return sse(
        chunk({"role": "assistant", "content": None, "refusal": ""}),
        *(chunk({"refusal": words}) for words in REFUSAL),
        chunk({}, "stop"),
        {**head, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 8}},
        "[DONE]",
    )


def _upstream(request: RecordedRequest, _: int) -> Reply:
    said = msgspec.json.decode(request.body)["messages"][-1]["content"]
    if "REFUSE" in said:
        return Reply(chunks=split(_refusal_stream(), 37))
    if "KEY" in said:  # the provider refuses the key the server holds
        error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
        return status_reply(401, body={"error": {**error, "code": "invalid_api_key"}})
    if "TEMPERATURE" in said:  # OpenAI's refusal of a value (a reasoning model's temperature)
        return status_reply(400, body={"error": INVALID_TEMPERATURE})
    return Reply(chunks=split(openai_text_stream(['{"city": "Paris"}']), 19))


INVALID_TEMPERATURE = {
    "message": "Unsupported value: 'temperature' does not support 0.2 with this model.",
    "type": "invalid_request_error",
    "param": "temperature",
    "code": "unsupported_value",
}


CLIENT = r"""
import json, sys
import openai
from openai import OpenAI
from pydantic import BaseModel

class Weather(BaseModel):
    city: str

spec = json.load(sys.stdin)
client = OpenAI(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
out = {}

def error_of(exc):
    return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None),
            "body": getattr(exc, "body", None)}

def said(text, name=None):
    message = {"role": "user", "content": text}
    if name:
        message["name"] = name
    return [message]

def refusal_parsed():
    parsed = client.chat.completions.parse(model=spec["model"], messages=said("REFUSE it"),
                                           response_format=Weather)
    message = parsed.choices[0].message
    return {"refusal": message.refusal, "parsed": message.parsed, "content": message.content,
            "finish": parsed.choices[0].finish_reason}

def refusal_streamed():
    with client.chat.completions.stream(model=spec["model"], messages=said("REFUSE, streamed"),
                                        response_format=Weather) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    return {"kinds": sorted(set(kinds)), "refusal": final.choices[0].message.refusal,
            "content": final.choices[0].message.content,
            "finish": final.choices[0].finish_reason}

for name, job in (("parse_refusal", refusal_parsed), ("stream_refusal", refusal_streamed)):
    try:
        out[name] = job()
    except (openai.OpenAIError, ValueError) as exc:  # ContentFilterFinishReasonError, or
        # the refusal read as JSON it is not
        out[name] = {"raised": type(exc).__name__}
fields = client.chat.completions.parse(
    model=spec["model"], messages=said("Weather in Paris", name="ana"), response_format=Weather,
    tools=[openai.pydantic_function_tool(Weather, name="get_weather")],
    reasoning_effort="minimal", parallel_tool_calls=False, seed=7, user="end-user-1",
    metadata={"team": "a"}, service_tier="flex", prompt_cache_key="conversation-9")
out["fields"] = {"parsed": fields.choices[0].message.parsed.model_dump()}
for name, streamed in (("upstream_key", False), ("upstream_key_streamed", True)):
    try:
        list(client.chat.completions.create(model=spec["model"], messages=said(f"KEY {name}"),
                                            stream=True)) if streamed else \
            client.chat.completions.create(model=spec["model"], messages=said(f"KEY {name}"))
        out[name] = None
    except openai.APIError as exc:
        out[name] = error_of(exc)
for name, streamed in (("upstream_400", False), ("upstream_400_streamed", True)):
    try:
        list(client.chat.completions.create(model=spec["model"], temperature=0.2, stream=True,
                                            messages=said(f"TEMPERATURE {name}"))) \
            if streamed else client.chat.completions.create(
                model=spec["model"], temperature=0.2, messages=said(f"TEMPERATURE {name}"))
        out[name] = None
    except openai.APIError as exc:
        out[name] = error_of(exc)
json.dump(out, sys.stdout, ensure_ascii=False)
"""


async def _collect(python: Path) -> dict[str, Any]:
    with trio.fail_after(120):
        async with open_loopback_provider(_upstream) as loopback, trio.open_nursery() as nursery:
            provider = Provider(
                dialect_from_name("openai"),
                f"{loopback.url}/v1",
                MODEL,
                api_key=Secret("sk-upstream-key-the-provider-refuses"),
            )
            config = ServerConfig(
                provider=provider, port=0, api_key=Secret(SERVER_KEY), policy=POLICY
            )
            url = await nursery.start(functools.partial(serve, config))
            spec = {"base_url": f"{url}/v1", "key": SERVER_KEY, "model": MODEL}
            done = await run_client(python, CLIENT, spec)
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["_sent"] = [msgspec.json.decode(r.body) for r in loopback.requests]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def _sent(sdk: dict[str, Any], keyword: str) -> dict[str, Any]:
    bodies: list[dict[str, Any]] = sdk["_sent"]
    (body,) = [b for b in bodies if keyword in b["messages"][-1]["content"]]
    return body


def test_parse_returns_the_models_refusal(sdk: dict[str, Any]) -> None:
    assert sdk["parse_refusal"] == {
        "refusal": "".join(REFUSAL),
        "parsed": None,
        "content": None,
        "finish": "stop",
    }


def test_the_stream_helper_reads_a_streamed_refusal(sdk: dict[str, Any]) -> None:
    streamed = sdk["stream_refusal"]
    assert "refusal.delta" in streamed["kinds"]
    assert "content.delta" not in streamed["kinds"]
    assert (streamed["refusal"], streamed["content"]) == ("".join(REFUSAL), None)
    assert streamed["finish"] == "stop"


def test_the_sdks_request_reaches_the_provider_whole(sdk: dict[str, Any]) -> None:
    assert sdk["fields"]["parsed"] == {"city": "Paris"}
    sent = _sent(sdk, "Weather in Paris")
    (tool,) = sent["tools"]
    assert tool["function"]["strict"] is True  # the SDK's pydantic tools are strict
    assert tool["function"]["parameters"]["additionalProperties"] is False
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["strict"] is True
    assert sent["messages"][-1]["name"] == "ana"
    assert sent["reasoning_effort"] == "minimal"
    expected = {
        "parallel_tool_calls": False,
        "seed": 7,
        "user": "end-user-1",
        "metadata": {"team": "a"},
        "service_tier": "flex",
        "prompt_cache_key": "conversation-9",
    }
    assert {name: sent[name] for name in expected} == expected


def test_the_upstreams_refusal_of_the_servers_key_is_no_authentication_error(
    sdk: dict[str, Any],
) -> None:
    # the client's own key was right: its SDK must not say otherwise
    for error in (sdk["upstream_key"], sdk["upstream_key_streamed"]):
        assert error["class"] == "InternalServerError"
        assert error["status"] == 502
        assert error["body"]["type"] == "server_error"
        assert "refused the server's credentials" in error["body"]["message"]
        assert "sk-upstream-key" not in json.dumps(error)


def test_an_upstream_refusal_of_the_request_keeps_its_param_code_and_type(
    sdk: dict[str, Any],
) -> None:
    for error in (sdk["upstream_400"], sdk["upstream_400_streamed"]):
        assert (error["class"], error["status"]) == ("BadRequestError", 400)
        body = error["body"]
        assert body["param"] == INVALID_TEMPERATURE["param"]
        assert body["code"] == INVALID_TEMPERATURE["code"]
        assert body["type"] == INVALID_TEMPERATURE["type"]
        assert INVALID_TEMPERATURE["message"] in body["message"]
