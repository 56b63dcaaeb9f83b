"""The `openai` Python SDK (PyPI, pinned) against rillet's `POST /v1/chat/completions`.

Someone with code written for OpenAI points `OpenAI(base_url=...)` at `rillet serve` and it must
just work. The SDK pulls in pydantic, which rillet must never depend on, so it runs in a
virtualenv of its own under `tests/artifacts/` (made on first use: `python -m venv`, then
`pip install openai==<pinned>`), as a subprocess that prints what the SDK returned or raised.

Behind the server is the loopback provider speaking OpenAI's own wire (and Anthropic's, for a
routed `anthropic/...` model): the SDK's view is checked against what the provider was sent and
what it answered, including a retry after text had already reached the client.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
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

pytestmark = pytest.mark.slow

OPENAI_VERSION = "3.57.0"
ROOT = Path(__file__).resolve().parent.parent.parent
VENV = Path(os.environ.get("RILLET_OPENAI_VENV") or ROOT / "tests" / "artifacts" / "openai-venv")
SERVER_KEY = "openai-interop-key-0123456789"
MODEL = "loop-gpt"

FRAGMENTS = ["Bonjour", " — こんにちは", " 👋🏽", " ✓"]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HEARTBEAT = 0.1
CONTEXT_FULL = {
    "message": "This model's maximum context length is 128000 tokens. However, your messages"
    " resulted in 130017 tokens. Please reduce the length of the messages.",
    "type": "invalid_request_error",
    "param": "messages",
}
POLICY = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)


def _tool_call_stream() -> bytes:
    head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    first = {"index": 0, "id": "call_w1", "type": "function"}
    return sse(
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{**first, "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        chunk({}, "tool_calls"),
        {
            **head,
            "choices": [],
            "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
        },
        "[DONE]",
    )


def _last_text(body: dict[str, Any]) -> str:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return "TOOL_RESULT"
    content = last["content"]
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content)


class Upstream:
    """The loopback provider's script: the reply follows the last user message's keyword."""

    def __init__(self) -> None:
        self.resets = 0

    def __call__(self, request: RecordedRequest, _: int) -> Reply:
        if request.path.startswith("/anthropic/"):
            return fixture_reply(wire_path("anthropic-messages", "text"), chunk_size=41)
        text = _last_text(msgspec.json.decode(request.body))
        stream = openai_text_stream(FRAGMENTS, prompt_tokens=21)
        if "TOOL_RESULT" in text:
            return Reply(chunks=split(openai_text_stream(["18 °C, light rain."]), 23))
        if "WEATHER" in text:
            return Reply(chunks=split(_tool_call_stream(), 29))
        if "SLOW" in text:  # silent before its head and between frames: keep-alives go out
            frames = tuple(f + b"\n\n" for f in stream.split(b"\n\n") if f)
            return Reply(chunks=frames, headers_delay=0.35, chunk_delay=0.25)
        if "LIMITED" in text:
            return status_reply(429, retry_after=7)
        if "TOO LONG" in text:  # OpenAI's own refusal of a conversation past the context window
            return status_reply(
                400, body={"error": {**CONTEXT_FULL, "code": "context_length_exceeded"}}
            )
        if "PAST THE WINDOW" in text:  # the same said in words only (vLLM, Anthropic's wording)
            return status_reply(400, body={"error": {**CONTEXT_FULL, "code": None}})
        if "FILTERED" in text:
            return Reply(chunks=(openai_text_stream([], finish_reason="content_filter"),))
        if "RESET" in text:
            self.resets += 1
            if self.resets == 1:  # text reaches the client, then the attempt dies
                cut = stream.index(b"\n\n", stream.index(b"Bonjour")) + 2
                return Reply(
                    chunks=(stream[:cut], stream[cut:]), chunk_delay=0.2, drop_after_bytes=cut
                )
        return Reply(chunks=split(stream, 17))


# the client side: runs in the SDK's virtualenv, reads the jobs as JSON on stdin, prints what
# the SDK returned or raised as JSON on stdout
CLIENT = r"""
import json, sys
import openai
from openai import OpenAI

spec = json.load(sys.stdin)
client = OpenAI(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
out = {}

def error_of(exc):
    return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None),
            "body": getattr(exc, "body", None), "message": str(exc),
            "request_id": getattr(exc, "request_id", None)}

def stream(name, **kw):
    chunks, error = [], None
    try:
        for chunk in client.chat.completions.create(stream=True, **kw):
            chunks.append(chunk.model_dump(exclude_unset=True))
    except openai.APIError as exc:
        error = error_of(exc)
    out[name] = {"chunks": chunks, "error": error}

def whole(name, c=client, **kw):
    try:
        out[name] = {"completion": c.chat.completions.create(**kw).model_dump(), "error": None}
    except openai.APIError as exc:
        out[name] = {"completion": None, "error": error_of(exc)}

out["models"] = [m.model_dump() for m in client.models.list()]
out["model"] = client.models.retrieve(spec["model"]).model_dump()
try:
    client.models.retrieve("nobody-serves-this")
except openai.APIError as exc:
    out["no_model"] = error_of(exc)
user = lambda text: [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
stream("text", model=spec["model"], messages=user("Say hello"),
       stream_options={"include_usage": True})
stream("text_no_usage", model=spec["model"], messages=user("Say hello"))
stream("slow", model=spec["model"], messages=user("SLOW"))
whole("whole", model=spec["model"], messages=user("Say hello"))
raw_create = client.chat.completions.with_raw_response.create
raw = raw_create(model=spec["model"], messages=user("Say hello"))
streamed = raw_create(model=spec["model"], messages=user("Say hello"), stream=True)
out["request_ids"] = {"header": raw.headers.get("x-request-id"), "parsed": raw.parse()._request_id,
                      "streamed": streamed.headers.get("x-request-id")}
list(streamed.parse())
stream("tool", model=spec["model"], messages=user("WEATHER in Paris?"), tools=[spec["tool"]],
       tool_choice="auto", stream_options={"include_usage": True})
whole("tool_whole", model=spec["model"], messages=user("WEATHER in Paris?"), tools=[spec["tool"]])
calls = out["tool_whole"]["completion"]["choices"][0]["message"]["tool_calls"]
history = user("WEATHER in Paris?") + [
    {"role": "assistant", "content": None, "tool_calls": calls},
    {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 °C, pluie fine"},
]
whole("tool_answer", model=spec["model"], messages=history, tools=[spec["tool"]])
whole("settings", model=spec["model"], messages=user("SETTINGS"), stop=["\n\n", "END"], seed=7,
      top_p=0.5, frequency_penalty=0.25, presence_penalty=-0.5, logit_bias={"50256": -100},
      response_format={"type": "json_object"}, user="end-user-1", max_completion_tokens=40,
      store=False, metadata={"team": "a"}, extra_body={"not_openai_at_all": {"x": 1}})
whole("logprobs", model=spec["model"], messages=user("LOGPROBS"), logprobs=True, top_logprobs=2)
whole("no_logprobs", model=spec["model"], messages=user("No log probabilities"), logprobs=False)
whole("limited", model=spec["model"], messages=user("LIMITED"))
whole("too_long", model=spec["model"], messages=user("TOO LONG"))
stream("too_long_streamed", model=spec["model"], messages=user("PAST THE WINDOW"))
retrying = OpenAI(base_url=spec["base_url"], api_key=spec["key"], timeout=30)  # 2 retries
whole("limited_retrying", c=retrying, model=spec["model"], messages=user("LIMITED, AGAIN"))
whole("filtered", model=spec["model"], messages=user("FILTERED"))
whole("unknown_model", model="nobody/nothing", messages=user("Say hello"))
whole("routed", model="anthropic/claude-sonnet-4-5", messages=user("Say hello"))
whole("bad_request", model=spec["model"], messages=[{"role": "wizard", "content": "x"}])
stream("reset", model=spec["model"], messages=user("RESET"))
keyless = OpenAI(base_url=spec["base_url"], api_key="not-the-key", max_retries=0)
whole("wrong_key", c=keyless, model=spec["model"], messages=user("Say hello"))
json.dump(out, sys.stdout, ensure_ascii=False)
"""


def sdk_python() -> Path:
    """The interpreter of the virtualenv holding `openai==OPENAI_VERSION` (`venv_python`)."""
    return venv_python("openai", OPENAI_VERSION, VENV)


def venv_python(package: str, version: str, venv: Path) -> Path:
    """The interpreter of the virtualenv at `venv` holding `package==version`, made if missing
    (built aside, then moved into place). Skips, saying why, when it cannot be made."""
    python = venv / "bin" / "python"
    stamp = venv / f".{package}-{version}"
    if stamp.exists() and python.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{package}-", dir=venv.parent))
    try:
        steps = {
            "python -m venv": [sys.executable, "-m", "venv", str(building)],
            f"pip install {package}=={version}": [
                str(building / "bin" / "python"),
                *("-m", "pip", "install", "-q", "--disable-pip-version-check"),
                f"{package}=={version}",
            ],
        }
        for name, step in steps.items():
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired:
                pytest.skip(f"cannot make the {package} SDK's virtualenv: {name} timed out")
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-2:]
                pytest.skip(f"cannot make the {package} SDK's virtualenv: {name} failed ({tail})")
        (building / f".{package}-{version}").touch()
        building.chmod(0o755)
        shutil.rmtree(venv, ignore_errors=True)
        os.rename(building, venv)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return python


async def run_client(
    python: Path, script: str, spec: dict[str, Any]
) -> subprocess.CompletedProcess[bytes]:
    """The SDK's side: `script` run by the SDK's interpreter, `spec` as JSON on its stdin."""
    return await trio.run_process(
        [str(python), "-c", script],
        stdin=json.dumps(spec).encode(),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )


async def _collect(python: Path) -> dict[str, Any]:
    upstream = Upstream()
    with trio.fail_after(120):
        async with open_loopback_provider(upstream) as loopback, trio.open_nursery() as nursery:
            provider = Provider(dialect_from_name("openai"), f"{loopback.url}/openai/v1", MODEL)
            config = ServerConfig(
                provider=provider,
                port=0,
                api_key=Secret(SERVER_KEY),
                policy=POLICY,
                limits=Limits(heartbeat=HEARTBEAT),
                route_kinds=("anthropic",),
                route_env={
                    "ANTHROPIC_BASE_URL": f"{loopback.url}/anthropic",
                    "ANTHROPIC_API_KEY": "upstream-anthropic-key",
                },
            )
            url = await nursery.start(functools.partial(serve, config))
            spec = {
                "base_url": f"{url}/v1",
                "key": SERVER_KEY,
                "model": MODEL,
                "tool": WEATHER_TOOL,
            }
            done = await run_client(python, CLIENT, spec)
            async with httpx.AsyncClient(timeout=30) as http:  # the same slow reply, read raw
                raw = await http.post(
                    f"{url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {SERVER_KEY}"},
                    json={
                        "model": MODEL,
                        "stream": True,
                        "messages": [{"role": "user", "content": "SLOW"}],
                    },
                )
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["_raw_slow"] = raw.content
    out["_requests"] = [
        {"path": r.path, "headers": r.headers, "body": msgspec.json.decode(r.body)}
        for r in loopback.requests
    ]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def _content(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )


def _sent(sdk: dict[str, Any], keyword: str) -> list[dict[str, Any]]:
    return [
        r
        for r in sdk["_requests"]
        if r["path"].startswith("/openai/") and keyword in _last_text(r["body"])
    ]


# --- tests ----------------------------------------------------------------------------------------


def test_the_sdk_lists_the_served_model(sdk: dict[str, Any]) -> None:
    assert [m["id"] for m in sdk["models"]] == [MODEL]
    assert all(m["object"] == "model" for m in sdk["models"])


def test_the_sdk_retrieves_the_served_model_and_not_another(sdk: dict[str, Any]) -> None:
    assert (sdk["model"]["id"], sdk["model"]["object"]) == (MODEL, "model")
    missing = sdk["no_model"]
    assert (missing["class"], missing["status"]) == ("NotFoundError", 404)
    assert missing["body"]["code"] == "model_not_found"


def test_streamed_text_arrives_whole_with_its_finish_and_usage(sdk: dict[str, Any]) -> None:
    chunks = sdk["text"]["chunks"]
    assert sdk["text"]["error"] is None
    assert _content(chunks) == "".join(FRAGMENTS)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "stop"
    assert set(finish[:-1]) == {None}
    # the usage chunk comes last, with no choices; the loopback counted 21 prompt tokens and
    # one completion token per fragment
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == 21
    assert chunks[-1]["usage"]["completion_tokens"] == len(FRAGMENTS)
    assert chunks[-1]["usage"]["total_tokens"] == 21 + len(FRAGMENTS)


def test_without_include_usage_no_usage_chunk_is_sent(sdk: dict[str, Any]) -> None:
    chunks = sdk["text_no_usage"]["chunks"]
    assert _content(chunks) == "".join(FRAGMENTS)
    assert all(c["choices"] for c in chunks)
    assert all(c.get("usage") is None for c in chunks)


def test_the_sdk_skips_the_keep_alive_comments(sdk: dict[str, Any]) -> None:
    slow = sdk["slow"]
    assert slow["error"] is None
    assert _content(slow["chunks"]) == "".join(FRAGMENTS)
    assert sdk["_raw_slow"].count(b": keep-alive\n\n") >= 3


def test_a_whole_completion(sdk: dict[str, Any]) -> None:
    whole = sdk["whole"]["completion"]
    assert whole["object"] == "chat.completion"
    assert whole["model"] == MODEL
    choice = whole["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "".join(FRAGMENTS)
    assert choice["finish_reason"] == "stop"
    assert whole["usage"]["prompt_tokens"] == 21
    # what the provider was sent: the system message became the system prompt again
    sent = _sent(sdk, "Say hello")[0]["body"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["model"] == MODEL


def test_every_answer_has_a_request_id_the_sdk_reads(sdk: dict[str, Any]) -> None:
    ids = sdk["request_ids"]
    assert ids["header"].startswith("req_")
    assert ids["parsed"] == ids["header"]
    assert ids["streamed"].startswith("req_")
    assert ids["streamed"] != ids["header"]
    # refusals too, before the turn (a wrong key) and from it (an upstream rate limit)
    assert sdk["wrong_key"]["error"]["request_id"].startswith("req_")
    assert sdk["limited"]["error"]["request_id"].startswith("req_")
    assert sdk["bad_request"]["error"]["request_id"].startswith("req_")


def test_a_streamed_tool_call_has_its_id_index_and_arguments(sdk: dict[str, Any]) -> None:
    chunks = sdk["tool"]["chunks"]
    calls = [
        call
        for c in chunks
        for choice in c["choices"]
        for call in choice["delta"].get("tool_calls") or ()
    ]
    assert calls[0]["id"] == "call_w1"
    assert calls[0]["function"]["name"] == "get_weather"
    assert {call["index"] for call in calls} == {0}
    assert all("id" not in call for call in calls[1:])
    arguments = "".join(call["function"].get("arguments") or "" for call in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "tool_calls"
    assert chunks[-1]["usage"]["total_tokens"] == 39
    # the tool went to the provider as it came
    sent = _sent(sdk, "WEATHER")[0]["body"]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tools"][0]["function"]["parameters"] == WEATHER_TOOL["function"]["parameters"]


def test_a_tool_call_round_trip(sdk: dict[str, Any]) -> None:
    whole = sdk["tool_whole"]["completion"]["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    call = whole["message"]["tool_calls"][0]
    assert call["id"] == "call_w1"
    assert call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    answer = sdk["tool_answer"]["completion"]["choices"][0]
    assert answer["message"]["content"] == "18 °C, light rain."
    # the history the SDK sent back reached the provider as a call and its result
    sent = _sent(sdk, "TOOL_RESULT")[0]["body"]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    tool = next(m for m in sent if m["role"] == "tool")
    assert tool["tool_call_id"] == "call_w1"
    assert "18 °C, pluie fine" in json.dumps(tool["content"], ensure_ascii=False)


def test_openais_own_settings_reach_a_provider_of_its_wire(sdk: dict[str, Any]) -> None:
    assert sdk["settings"]["error"] is None
    assert sdk["settings"]["completion"]["choices"][0]["message"]["content"] == "".join(FRAGMENTS)
    sent = _sent(sdk, "SETTINGS")[0]["body"]
    assert sent["stop"] == ["\n\n", "END"]
    assert sent["seed"] == 7
    assert sent["top_p"] == 0.5
    assert sent["frequency_penalty"] == 0.25
    assert sent["presence_penalty"] == -0.5
    assert sent["logit_bias"] == {"50256": -100}
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["user"] == "end-user-1"
    assert sent["max_completion_tokens"] == 40
    # every other field goes on as given, for the provider of OpenAI's wire to judge
    assert sent["store"] is False
    assert sent["metadata"] == {"team": "a"}
    assert sent["not_openai_at_all"] == {"x": 1}


def test_logprobs_asked_for_are_refused_as_openai_refuses_a_parameter(
    sdk: dict[str, Any],
) -> None:
    # no turn brings log probabilities back: a 400 naming the parameter, not `logprobs: null`
    error = sdk["logprobs"]["error"]
    assert (error["class"], error["status"]) == ("BadRequestError", 400)
    assert error["body"]["type"] == "invalid_request_error"
    assert (error["body"]["param"], error["body"]["code"]) == ("logprobs", "unsupported_parameter")
    assert not _sent(sdk, "LOGPROBS")
    # `logprobs: false` asks for nothing and is answered
    whole = sdk["no_logprobs"]["completion"]
    assert whole["choices"][0]["message"]["content"] == "".join(FRAGMENTS)


def test_an_upstream_rate_limit_is_the_sdks_rate_limit_error(sdk: dict[str, Any]) -> None:
    error = sdk["limited"]["error"]
    assert error["class"] == "RateLimitError"
    assert error["status"] == 429
    assert error["body"]["type"] == "rate_limit_error"
    assert error["body"]["code"] == "rate_limited"  # the run's safe code


def test_a_conversation_past_the_context_window_is_context_length_exceeded(
    sdk: dict[str, Any],
) -> None:
    # OpenAI's code for it, which code written for OpenAI checks to shorten the conversation
    for error in (sdk["too_long"]["error"], sdk["too_long_streamed"]["error"]):
        assert (error["class"], error["status"]) == ("BadRequestError", 400)
        assert error["body"]["type"] == "invalid_request_error"
        assert error["body"]["code"] == "context_length_exceeded"
        assert error["body"]["param"] == "messages"
        assert "maximum context length is 128000 tokens" in error["body"]["message"]


def test_the_sdk_does_not_retry_what_the_server_already_retried(sdk: dict[str, Any]) -> None:
    # `x-should-retry: false`: an SDK with its default retries pays the provider no more
    # requests than one with none
    assert sdk["limited_retrying"]["error"]["class"] == "RateLimitError"
    assert len(_sent(sdk, "LIMITED, AGAIN")) == len(_sent(sdk, "LIMITED")) - 1 == 1


def test_a_filtered_reply_finishes_content_filter(sdk: dict[str, Any]) -> None:
    choice = sdk["filtered"]["completion"]["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert choice["message"]["content"] is None


def test_an_unknown_model_is_model_not_found(sdk: dict[str, Any]) -> None:
    error = sdk["unknown_model"]["error"]
    assert error["class"] == "NotFoundError"
    assert error["status"] == 404
    assert error["body"]["code"] == "model_not_found"
    assert error["body"]["param"] == "model"


def test_a_kind_slash_model_name_routes_to_that_provider(sdk: dict[str, Any]) -> None:
    whole = sdk["routed"]["completion"]
    assert whole is not None, sdk["routed"]["error"]
    assert whole["model"] == "anthropic/claude-sonnet-4-5"
    sent = [r for r in sdk["_requests"] if r["path"].startswith("/anthropic/")]
    assert len(sent) == 1
    assert sent[0]["path"] == "/anthropic/v1/messages"
    assert sent[0]["body"]["model"] == "claude-sonnet-4-5"
    assert sent[0]["headers"]["x-api-key"] == "upstream-anthropic-key"
    expected = json.loads(
        wire_path("anthropic-messages", "text").with_suffix(".expected.json").read_text()
    )
    assert whole["choices"][0]["message"]["content"]
    assert whole["choices"][0]["message"]["content"] in json.dumps(expected, ensure_ascii=False)


def test_a_malformed_request_is_a_bad_request(sdk: dict[str, Any]) -> None:
    error = sdk["bad_request"]["error"]
    assert error["class"] == "BadRequestError"
    assert error["status"] == 400
    assert error["body"]["type"] == "invalid_request_error"
    assert error["body"]["param"] == "messages[0].role"


def test_a_retry_voiding_text_the_client_has_ends_the_stream_with_an_error(
    sdk: dict[str, Any],
) -> None:
    reset = sdk["reset"]
    assert _content(reset["chunks"]).startswith("Bonjour")
    assert reset["error"]["class"] == "APIError"
    assert reset["error"]["body"]["code"] == "IncompleteStreamError"
    # the server did retry: the second attempt was sent, and its text was not appended
    assert len(_sent(sdk, "RESET")) == 2
    assert _content(reset["chunks"]) == "Bonjour"


def test_a_wrong_server_key_is_the_sdks_authentication_error(sdk: dict[str, Any]) -> None:
    error = sdk["wrong_key"]["error"]
    assert error["class"] == "AuthenticationError"
    assert error["status"] == 401
    assert error["body"]["type"] == "authentication_error"
