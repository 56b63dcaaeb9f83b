"""The `anthropic` Python SDK (PyPI, pinned) against rillet's `POST /v1/messages`.

Someone with code written for Anthropic points `Anthropic(base_url=...)` at `rillet serve` and it
must just work, whichever provider the model routes to. The SDK pulls in pydantic, which rillet
must never depend on, so it runs in a virtualenv of its own under `tests/artifacts/` (made on
first use), as a subprocess that prints what the SDK returned or raised.

Behind the server is the loopback provider speaking OpenAI's Chat Completions wire, and
Anthropic's own for a routed `anthropic/...` model (so a thinking block's signature makes the
round trip byte for byte): the SDK's view is checked against what the provider was sent.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_stream,
    split,
    sse,
    status_reply,
)

from ..wire_cases import wire_path
from .test_openai_interop import FRAGMENTS, run_client, venv_python

pytestmark = pytest.mark.slow

ANTHROPIC_VERSION = "2.17.0"
ROOT = Path(__file__).resolve().parent.parent.parent
VENV = Path(
    os.environ.get("RILLET_ANTHROPIC_VENV") or ROOT / "tests" / "artifacts" / "anthropic-venv"
)
SERVER_KEY = "anthropic-interop-key-0123456789"
MODEL = "loop-gpt"
ROUTED = "anthropic/claude-sonnet-4-5"
POLICY = Policy(
    rate_limit_retries=0, transport_retries=0, rescue=False, backoff_base=0.01, random=lambda: 0.0
)
WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
THOUGHT = ["Three times seven", " is 21."]


def _chunks(*deltas: dict[str, Any], finish: str = "stop") -> bytes:
    head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    usage = {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}
    return sse(
        chunk({"role": "assistant", "content": None}),
        *(chunk(delta) for delta in deltas),
        chunk({}, finish),
        {**head, "choices": [], "usage": usage},
        "[DONE]",
    )


def _tool_call_stream() -> bytes:
    first = {"index": 0, "id": "call_w1", "type": "function"}
    return _chunks(
        {"tool_calls": [{**first, "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]},
        finish="tool_calls",
    )


def _last_text(body: dict[str, Any]) -> str:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return "TOOL_RESULT"
    content = last["content"]
    if isinstance(content, list):
        parts = [p.get("text") or json.dumps(p.get("content")) for p in content]
        return "".join(p for p in parts if isinstance(p, str))
    return str(content)


def upstream(request: RecordedRequest, _: int) -> Reply:
    """The loopback provider's script: the reply follows the last user message's keyword."""
    text = _last_text(msgspec.json.decode(request.body))
    if request.path.startswith("/anthropic/"):
        case = "text"
        if "THINK" in text:
            case = "thinking_signature"
        elif "REDACTED" in text:
            case = "redacted_thinking"
        elif "OVERLOADED" in text:
            case = "error_overloaded"
        return fixture_reply(wire_path("anthropic-messages", case), chunk_size=41)
    if "TOOL_RESULT" in text:
        return Reply(chunks=split(openai_text_stream(["18 °C, light rain."]), 23))
    if "WEATHER" in text:
        return Reply(chunks=split(_tool_call_stream(), 29))
    if "THINK" in text:
        deltas = [{"reasoning_content": part} for part in THOUGHT] + [{"content": "21"}]
        return Reply(chunks=split(_chunks(*deltas), 31))
    if "LIMITED" in text:
        return status_reply(429, retry_after=7)
    if "OVERLOADED" in text:
        return status_reply(503)
    if "LONG" in text:
        return status_reply(400, body={"error": {"message": "too many tokens", "type": "x"}})
    return Reply(chunks=split(openai_text_stream(FRAGMENTS, prompt_tokens=21), 17))


# the client side: runs in the SDK's virtualenv, reads the jobs as JSON on stdin, prints what
# the SDK returned or raised as JSON on stdout
CLIENT = r"""
import json, os, sys
import anthropic
from anthropic import Anthropic

os.environ.pop("ANTHROPIC_API_KEY", None)
spec = json.load(sys.stdin)
client = Anthropic(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
out = {}

def error_of(exc):
    return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None),
            "body": getattr(exc, "body", None), "message": str(exc),
            "request_id": getattr(exc, "request_id", None)}

def whole(name, c=client, **kw):
    try:
        out[name] = {"message": c.messages.create(**kw).model_dump(), "error": None}
    except anthropic.APIError as exc:
        out[name] = {"message": None, "error": error_of(exc)}

def events(name, **kw):
    seen, error = [], None
    try:
        for event in client.messages.create(stream=True, **kw):
            seen.append(event.model_dump())
    except anthropic.APIError as exc:
        error = error_of(exc)
    out[name] = {"events": seen, "error": error}

def helper(name, **kw):
    texts, final, error = [], None, None
    try:
        with client.messages.stream(**kw) as stream:
            for text in stream.text_stream:
                texts.append(text)
            final = stream.get_final_message().model_dump()
    except anthropic.APIError as exc:
        error = error_of(exc)
    out[name] = {"texts": texts, "final": final, "error": error}

user = lambda text: [{"role": "user", "content": text}]
m, routed = spec["model"], spec["routed"]
whole("text", model=m, max_tokens=64, system="Be brief.", messages=user("Say hello"))
events("events", model=m, max_tokens=64, messages=user("Say hello"))
helper("helper", model=m, max_tokens=64, messages=user("Say hello"))
helper("tool", model=m, max_tokens=64, messages=user("WEATHER in Paris?"), tools=[spec["tool"]],
       tool_choice={"type": "auto"})
call = out["tool"]["final"]["content"]
history = user("WEATHER in Paris?") + [
    {"role": "assistant", "content": call},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call[0]["id"],
                                   "content": [{"type": "text", "text": "18 °C, pluie fine"}]}]},
]
whole("tool_answer", model=m, max_tokens=64, messages=history, tools=[spec["tool"]])
thinking = {"type": "enabled", "budget_tokens": 2048}
helper("think", model=m, max_tokens=4096, thinking=thinking, messages=user("THINK: 3 × 7?"))
again = user("THINK: 3 × 7?") + [
    {"role": "assistant", "content": out["think"]["final"]["content"]},
    {"role": "user", "content": "And 4 × 7?"},
]
whole("think_again", model=m, max_tokens=4096, thinking=thinking, messages=again)
helper("a_think", model=routed, max_tokens=4096, thinking=thinking,
       messages=user("THINK: 27 × 453"))
again = user("THINK: 27 × 453") + [
    {"role": "assistant", "content": out["a_think"]["final"]["content"]},
    {"role": "user", "content": "Thanks"},
]
whole("a_think_again", model=routed, max_tokens=4096, thinking=thinking, messages=again)
whole("a_redacted", model=routed, max_tokens=4096, thinking=thinking, messages=user("REDACTED"))
events("a_overloaded", model=routed, max_tokens=64, messages=user("OVERLOADED"))
# this SDK has no arguments of its own for the sampling settings: they go in its `extra_body`
sampling = {"temperature": 0.5, "top_p": 0.9, "top_k": 5}
whole("settings", model=m, max_tokens=40, messages=user("SETTINGS"), extra_body=sampling,
      stop_sequences=["END"], metadata={"user_id": "end-user-1"})
system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
whole("a_settings", model=routed, max_tokens=40, system=system, extra_body={"top_k": 5},
      stop_sequences=["END"], metadata={"user_id": "end-user-1"}, messages=user("A_SETTINGS"),
      tools=[{**spec["tool"], "cache_control": {"type": "ephemeral"}}],
      tool_choice={"type": "any", "disable_parallel_tool_use": True},
      extra_headers={"anthropic-beta": "context-1m-2025-08-07"})
image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
url = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
whole("image", model=m, max_tokens=64,
      messages=[{"role": "user", "content": [image, url, {"type": "text", "text": "IMAGES"}]}])
whole("server_tool", model=m, max_tokens=64, messages=user("Search"),
      tools=[{"type": "web_search_20250305", "name": "web_search"}])
whole("limited", model=m, max_tokens=64, messages=user("LIMITED"))
events("limited_streamed", model=m, max_tokens=64, messages=user("LIMITED, STREAMED"))
whole("overloaded", model=m, max_tokens=64, messages=user("OVERLOADED"))
whole("too_long", model=m, max_tokens=64, messages=user("LONG"))
whole("unknown_model", model="nobody/nothing", max_tokens=64, messages=user("Say hello"))
# this SDK sends its key as a Bearer token; Anthropic's own clients of other ages and
# languages send it as `x-api-key`
headed = Anthropic(base_url=spec["base_url"], api_key=None, auth_token=None, max_retries=0,
                   default_headers={"x-api-key": spec["key"]})
whole("x_api_key", c=headed, model=m, max_tokens=64, messages=user("Say hello"))
keyless = Anthropic(base_url=spec["base_url"], api_key="not-the-key", max_retries=0)
whole("wrong_key", c=keyless, model=m, max_tokens=64, messages=user("Say hello"))
try:
    client.messages.count_tokens(model=m, messages=user("Say hello"))
except anthropic.APIError as exc:
    out["count_tokens"] = error_of(exc)
json.dump(out, sys.stdout, ensure_ascii=False)
"""


def sdk_python() -> Path:
    """The interpreter of the virtualenv holding `anthropic==ANTHROPIC_VERSION`, made if
    missing (`venv_python`)."""
    return venv_python("anthropic", ANTHROPIC_VERSION, VENV)


def _config(loopback_url: str, **limits: Any) -> ServerConfig:
    provider = Provider(dialect_from_name("openai"), f"{loopback_url}/openai/v1", MODEL)
    return ServerConfig(
        provider=provider,
        port=0,
        api_key=Secret(SERVER_KEY),
        policy=POLICY,
        limits=Limits(**limits),
        route_kinds=("anthropic",),
        route_env={
            "ANTHROPIC_BASE_URL": f"{loopback_url}/anthropic",
            "ANTHROPIC_API_KEY": "upstream-anthropic-key",
        },
    )


async def _collect(python: Path) -> dict[str, Any]:
    with trio.fail_after(120):
        async with open_loopback_provider(upstream) as loopback, trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve, _config(loopback.url)))
            spec = {"base_url": url, "key": SERVER_KEY, "model": MODEL, "routed": ROUTED}
            done = await run_client(python, CLIENT, {**spec, "tool": WEATHER_TOOL})
            async with httpx.AsyncClient(timeout=30) as http:  # what the SDK does not show
                post = functools.partial(
                    http.post, f"{url}/v1/messages", headers={"x-api-key": SERVER_KEY}
                )
                say = [{"role": "user", "content": "Say hello"}]
                raw = await post(
                    json={"model": MODEL, "max_tokens": 9, "stream": True, "messages": say}
                )
                no_max = await post(json={"model": MODEL, "messages": say})
                a_field = await post(
                    json={"model": MODEL, "max_tokens": 9, "messages": say, "container": "c1"}
                )
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["_raw"] = raw
    out["_no_max_tokens"] = no_max
    out["_unknown_field"] = a_field
    out["_requests"] = [
        {"path": r.path, "headers": r.headers, "body": msgspec.json.decode(r.body), "raw": r.body}
        for r in loopback.requests
    ]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def _sent(sdk: dict[str, Any], keyword: str, prefix: str = "/openai/") -> list[dict[str, Any]]:
    return [
        r
        for r in sdk["_requests"]
        if r["path"].startswith(prefix) and keyword in _last_text(r["body"])
    ]


def _fixture_signature() -> str:
    expected = wire_path("anthropic-messages", "thinking_signature").with_suffix(".expected.json")
    done = next(i for i in json.loads(expected.read_text()) if i["type"] == "thinking.done")
    return str(done["fidelity"]["signature"])


# --- tests ----------------------------------------------------------------------------------------


def test_a_whole_message(sdk: dict[str, Any]) -> None:
    message = sdk["text"]["message"]
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", MODEL)
    assert message["id"].startswith("msg_")
    assert message["content"] == [{"type": "text", "text": "".join(FRAGMENTS), "citations": None}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["input_tokens"] == 21
    assert message["usage"]["output_tokens"] == len(FRAGMENTS)
    sent = _sent(sdk, "Say hello")[0]["body"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["model"] == MODEL
    assert sent["max_completion_tokens"] == 64


def test_streamed_events_come_in_anthropics_order(sdk: dict[str, Any]) -> None:
    seen = sdk["events"]["events"]
    assert sdk["events"]["error"] is None
    kinds = [event["type"] for event in seen]
    deltas = len(FRAGMENTS)
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    texts = [e["delta"]["text"] for e in seen if e["type"] == "content_block_delta"]
    assert texts == FRAGMENTS
    assert {e["index"] for e in seen if "index" in e} == {0}
    end = seen[-2]
    assert end["delta"]["stop_reason"] == "end_turn"
    assert end["usage"]["output_tokens"] == len(FRAGMENTS)
    assert end["usage"]["input_tokens"] == 21


def test_the_raw_stream_names_each_event_and_pings(sdk: dict[str, Any]) -> None:
    raw: httpx.Response = sdk["_raw"]
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["request-id"].startswith("req_")
    frames = [f for f in raw.text.split("\n\n") if f]
    for frame in frames:
        event, data = frame.split("\n")
        name = event.removeprefix("event: ")
        assert json.loads(data.removeprefix("data: "))["type"] == name
    assert frames[1] == 'event: ping\ndata: {"type":"ping"}'


def test_the_stream_helper_gives_text_and_the_final_message(sdk: dict[str, Any]) -> None:
    helper = sdk["helper"]
    assert helper["error"] is None
    assert helper["texts"] == FRAGMENTS
    final = helper["final"]
    assert final["content"][0]["text"] == "".join(FRAGMENTS)
    assert final["stop_reason"] == "end_turn"
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (21, 4)


def test_a_tool_use_round_trip(sdk: dict[str, Any]) -> None:
    final = sdk["tool"]["final"]
    assert final["stop_reason"] == "tool_use"
    (call,) = final["content"]
    assert (call["type"], call["id"], call["name"]) == ("tool_use", "call_w1", "get_weather")
    assert call["input"] == {"city": "Paris"}
    sent = _sent(sdk, "WEATHER")[0]["body"]
    assert sent["tools"][0]["function"]["parameters"] == WEATHER_TOOL["input_schema"]
    assert sent["tool_choice"] == "auto"
    answer = sdk["tool_answer"]["message"]
    assert answer["content"][0]["text"] == "18 °C, light rain."
    history = _sent(sdk, "TOOL_RESULT")[0]["body"]["messages"]
    assistant = next(m for m in history if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    tool = next(m for m in history if m["role"] == "tool")
    assert (tool["tool_call_id"], tool["content"]) == ("call_w1", "18 °C, pluie fine")


def test_thinking_from_an_openai_upstream_streams_and_goes_back(sdk: dict[str, Any]) -> None:
    final = sdk["think"]["final"]
    thinking, text = final["content"]
    assert thinking["type"] == "thinking"
    assert thinking["thinking"] == "".join(THOUGHT)
    assert thinking["signature"].startswith("rillet1.")  # its fidelity, for the way back
    assert text["text"] == "21"
    assert sdk["think"]["texts"] == ["21"]
    assert _sent(sdk, "THINK")[0]["body"]["reasoning_effort"] == "low"  # 2048 tokens of budget
    # sent back, the thinking reaches the provider where it reads it
    history = _sent(sdk, "And 4 × 7?")[0]["body"]["messages"]
    assistant = next(m for m in history if m["role"] == "assistant")
    assert assistant["reasoning_content"] == "".join(THOUGHT)
    assert sdk["think_again"]["message"]["content"][0]["text"] == "".join(FRAGMENTS)


def test_anthropic_thinking_signatures_round_trip_byte_for_byte(sdk: dict[str, Any]) -> None:
    signature = _fixture_signature()
    final = sdk["a_think"]["final"]
    thinking = final["content"][0]
    assert (thinking["type"], thinking["signature"]) == ("thinking", signature)
    assert final["stop_reason"] == "end_turn"
    assert final["model"] == ROUTED
    first = _sent(sdk, "THINK: 27", "/anthropic/")[0]
    assert first["body"]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["headers"]["x-api-key"] == "upstream-anthropic-key"
    again = _sent(sdk, "Thanks", "/anthropic/")[0]
    block = again["body"]["messages"][1]["content"][0]
    assert block == {"type": "thinking", "thinking": thinking["thinking"], "signature": signature}
    assert f'"signature":"{signature}"'.encode() in again["raw"]
    assert sdk["a_think_again"]["error"] is None


def test_redacted_thinking_comes_back_as_its_block(sdk: dict[str, Any]) -> None:
    content = sdk["a_redacted"]["message"]["content"]
    redacted = [block for block in content if block["type"] == "redacted_thinking"]
    assert redacted
    assert redacted[0]["data"]


def test_an_upstream_failure_mid_stream_is_an_error_event(sdk: dict[str, Any]) -> None:
    seen, error = sdk["a_overloaded"]["events"], sdk["a_overloaded"]["error"]
    texts = [e["delta"]["text"] for e in seen if e["type"] == "content_block_delta"]
    assert "".join(texts) == "Sure, here is the"
    assert error["class"] == "APIStatusError"
    assert error["body"]["type"] == "error"
    assert error["body"]["error"]["type"] == "overloaded_error"
    assert "anthropic" in error["body"]["error"]["message"]


def test_settings_reach_an_openai_upstream_where_it_has_them(sdk: dict[str, Any]) -> None:
    assert sdk["settings"]["error"] is None
    sent = _sent(sdk, "SETTINGS")[0]["body"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.5, 0.9, 5)
    assert sent["stop"] == ["END"]
    assert sent["user"] == "end-user-1"
    assert sent["max_completion_tokens"] == 40


def test_an_anthropic_upstream_gets_every_field_as_given(sdk: dict[str, Any]) -> None:
    assert sdk["a_settings"]["error"] is None
    sent = _sent(sdk, "A_SETTINGS", "/anthropic/")[0]["body"]
    assert sent["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert sent["tools"] == [{**WEATHER_TOOL, "cache_control": {"type": "ephemeral"}}]
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert (sent["top_k"], sent["stop_sequences"]) == (5, ["END"])
    assert sent["metadata"] == {"user_id": "end-user-1"}
    assert sent["model"] == "claude-sonnet-4-5"
    headers = _sent(sdk, "A_SETTINGS", "/anthropic/")[0]["headers"]
    assert headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert headers["anthropic-version"] == "2023-06-01"


def test_images_reach_the_provider(sdk: dict[str, Any]) -> None:
    assert sdk["image"]["error"] is None
    parts = _sent(sdk, "IMAGES")[0]["body"]["messages"][-1]["content"]
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert urls == ["data:image/png;base64,iVBO", "https://example.com/cat.png"]


def test_what_the_provider_cannot_take_is_refused_not_dropped(sdk: dict[str, Any]) -> None:
    error = sdk["server_tool"]["error"]
    assert (error["class"], error["status"]) == ("BadRequestError", 400)
    assert error["body"]["type"] == "error"
    assert error["body"]["error"]["type"] == "invalid_request_error"
    assert "tools[0]" in error["body"]["error"]["message"]
    assert not _sent(sdk, "Search")
    unknown: httpx.Response = sdk["_unknown_field"]
    assert unknown.status_code == 400
    assert "container" in unknown.json()["error"]["message"]


def test_max_tokens_is_required(sdk: dict[str, Any]) -> None:
    refused: httpx.Response = sdk["_no_max_tokens"]
    assert refused.status_code == 400
    assert refused.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


def test_upstream_errors_are_the_sdks_exception_classes(sdk: dict[str, Any]) -> None:
    cases = {
        "limited": ("RateLimitError", 429, "rate_limit_error"),
        "overloaded": ("OverloadedError", 529, "overloaded_error"),
        "too_long": ("BadRequestError", 400, "invalid_request_error"),
        "unknown_model": ("NotFoundError", 404, "not_found_error"),
        "wrong_key": ("AuthenticationError", 401, "authentication_error"),
    }
    for name, (cls, status, kind) in cases.items():
        error = sdk[name]["error"]
        assert (error["class"], error["status"]) == (cls, status), name
        assert error["body"]["error"]["type"] == kind, name
        assert error["request_id"].startswith("req_"), name
    assert "too many tokens" in sdk["too_long"]["error"]["body"]["error"]["message"]
    # streamed, a refusal before the first event keeps its status too
    streamed = sdk["limited_streamed"]
    assert streamed["events"] == []
    assert (streamed["error"]["class"], streamed["error"]["status"]) == ("RateLimitError", 429)


def test_the_key_may_come_as_x_api_key(sdk: dict[str, Any]) -> None:
    assert sdk["x_api_key"]["message"]["content"][0]["text"] == "".join(FRAGMENTS)
    said = [r for r in sdk["_requests"] if r["path"].startswith("/openai/")]
    assert all("x-api-key" not in r["headers"] for r in said)  # the client's key stays here


def test_count_tokens_is_said_not_to_be_served(sdk: dict[str, Any]) -> None:
    error = sdk["count_tokens"]
    assert (error["class"], error["status"]) == ("NotFoundError", 404)
    assert "not served" in error["body"]["error"]["message"]


# --- cancellation ---------------------------------------------------------------------------------

CANCEL_CLIENT = r"""
import json, sys, time
from anthropic import Anthropic

spec = json.load(sys.stdin)
client = Anthropic(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
with client.messages.stream(model=spec["model"], max_tokens=64,
                            messages=[{"role": "user", "content": "hi"}]) as stream:
    for text in stream.text_stream:
        print(json.dumps(text), flush=True)
        break
time.sleep(spec["linger"])  # still running: the stream's close, not the exit, cancels it
"""


async def test_closing_the_sdks_stream_cancels_the_upstream_request() -> None:
    python = sdk_python()
    stream = openai_text_stream(["first", "never"])
    frames = tuple(frame + b"\n\n" for frame in stream.split(b"\n\n") if frame)
    stalled = Reply(chunks=frames, stall_after=2)  # the role chunk and "first", then silence
    client_done = trio.Event()
    printed: list[bytes] = []
    with trio.fail_after(60):
        async with (
            open_loopback_provider([stalled]) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await nursery.start(functools.partial(serve, _config(loopback.url)))
            spec = {"base_url": url, "key": SERVER_KEY, "model": MODEL, "linger": 8}

            async def client() -> None:
                printed.append((await run_client(python, CANCEL_CLIENT, spec)).stdout)
                client_done.set()

            nursery.start_soon(client)
            await loopback.wait_for_requests(1)
            await loopback.wait_connections_closed()
            assert not client_done.is_set()
            await client_done.wait()
            nursery.cancel_scope.cancel()
    assert printed[0].decode().split() == ['"first"']
