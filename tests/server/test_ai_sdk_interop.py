"""The AI SDK's own client side (the `ai` npm package, pinned) against `POST /v1/ui/chat`.

A front end built on `useChat` points its transport at `rillet serve`. Under node, the script
`tests/interop/ai_sdk_client.mjs` sends each request with the package's `DefaultChatTransport`
(the request `useChat` makes) and assembles the reply with its `readUIMessageStream` (what
`useChat` shows), then prints the parts and the message as JSON. The package is installed with
npm into `tests/artifacts/ai-sdk/` on first use; without node or npm, or when the install fails,
the tests skip and say why.

Behind the server, the loopback provider plays OpenAI's wire; the message the SDK assembled is
checked against what a rillet turn makes of the same reply.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._events import TextDone, ThinkingDone
from rillet._core._policy import Policy
from rillet._core._request import TurnRequest, user
from rillet._turn._api import open_turn
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_stream,
    split,
    status_reply,
)

from ..wire_cases import wire_path
from .test_openai_interop import FRAGMENTS, _tool_call_stream

pytestmark = pytest.mark.slow

AI_VERSION = "7.0.173"
ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE_DIR = Path(os.environ.get("RILLET_AI_SDK_DIR") or ROOT / "tests" / "artifacts" / "ai-sdk")
CLIENT = ROOT / "tests" / "interop" / "ai_sdk_client.mjs"
SERVER_KEY = "ui-interop-key-0123456789"
MODEL = "loop-gpt"
POLICY = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def ai_entry() -> Path:
    """The `ai` package's entry point, npm-installed at `AI_VERSION` if missing (into a folder
    made aside, then moved into place). Skips, saying why, without node, npm or the package."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "node and npm are needed to run the ai package's client (apt install nodejs npm)"
        )
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    major = version.stdout.strip().lstrip("v").split(".")[0]
    if not major.isdigit() or int(major) < 20:
        pytest.skip(f"node {version.stdout.strip() or '?'} is too old for the ai package (20+)")
    entry = PACKAGE_DIR / "node_modules" / "ai" / "dist" / "index.js"
    stamp = PACKAGE_DIR / f".ai-{AI_VERSION}"
    if stamp.exists() and entry.exists():
        return entry
    PACKAGE_DIR.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".ai-sdk-", dir=PACKAGE_DIR.parent))
    try:
        (building / "package.json").write_text('{"private": true, "type": "module"}\n')
        step = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", f"ai@{AI_VERSION}"]
        try:
            done = subprocess.run(step, cwd=building, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot install ai@{AI_VERSION} with npm: timed out")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-2:]
            pytest.skip(f"cannot install ai@{AI_VERSION} with npm ({' / '.join(tail)})")
        (building / f".ai-{AI_VERSION}").touch()
        building.chmod(0o755)
        shutil.rmtree(PACKAGE_DIR, ignore_errors=True)
        os.rename(building, PACKAGE_DIR)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return entry


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
        text = _last_text(msgspec.json.decode(request.body))
        stream = openai_text_stream(FRAGMENTS, prompt_tokens=21)
        if "TOOL_RESULT" in text:
            return Reply(chunks=split(openai_text_stream(["18 °C, light rain."]), 23))
        if "WEATHER" in text:
            return Reply(chunks=split(_tool_call_stream(), 29))
        if "THINK" in text:
            return fixture_reply(wire_path("openai-chat", "reasoning_deepseek"), chunk_size=31)
        if "SLOW" in text:  # silent before its head and between frames: keep-alives go out
            frames = tuple(f + b"\n\n" for f in stream.split(b"\n\n") if f)
            return Reply(chunks=frames, headers_delay=0.35, chunk_delay=0.25)
        if "LIMITED" in text:
            return status_reply(429, retry_after=7)
        if "RESET" in text:
            self.resets += 1
            if self.resets == 1:  # text reaches the client, then the attempt dies
                cut = stream.index(b"\n\n", stream.index(b"Bonjour")) + 2
                return Reply(
                    chunks=(stream[:cut], stream[cut:]), chunk_delay=0.2, drop_after_bytes=cut
                )
        return Reply(chunks=split(stream, 17))


async def _reference(loopback_url: str, text: str) -> dict[str, str]:
    """What a rillet turn makes of the reply the keyword selects: its text and reasoning."""
    provider = Provider(dialect_from_name("openai"), f"{loopback_url}/ref/v1", MODEL)
    request = TurnRequest(messages=[user(text)])
    async with open_turn(request, provider, policy=POLICY) as turn:
        result = await turn.result()
    items = result.message.content_items
    return {
        "text": "".join(i.text for i in items if type(i) is TextDone),
        "reasoning": "".join(i.thinking for i in items if type(i) is ThinkingDone),
    }


async def _collect(entry: Path) -> dict[str, Any]:
    upstream = Upstream()
    with trio.fail_after(120):
        async with open_loopback_provider(upstream) as loopback, trio.open_nursery() as nursery:
            references = {k: await _reference(loopback.url, k) for k in ("Say hello", "THINK")}
            provider = Provider(dialect_from_name("openai"), f"{loopback.url}/srv/v1", MODEL)
            config = ServerConfig(
                provider=provider,
                port=0,
                api_key=Secret(SERVER_KEY),
                policy=POLICY,
                limits=Limits(heartbeat=0.1),
            )
            url = await nursery.start(functools.partial(serve, config))
            tools = {"tools": [WEATHER]}
            spec = {
                "entry": str(entry),
                "url": f"{url}/v1/ui/chat",
                "key": SERVER_KEY,
                "tools": [WEATHER],
                "jobs": [
                    {"name": "text", "text": "Say hello", "body": {"system": "Be brief."}},
                    {"name": "think", "text": "THINK"},
                    {"name": "tool", "text": "WEATHER in Paris?", "body": tools},
                    {"name": "slow", "text": "SLOW"},
                    {"name": "limited", "text": "LIMITED"},
                    {"name": "reset", "text": "RESET"},
                    {"name": "unknown_model", "text": "Say hello", "body": {"model": "x/y"}},
                    {"name": "wrong_key", "text": "Say hello", "key": "not-the-key"},
                ],
            }
            done = await trio.run_process(
                ["node", str(CLIENT)],
                stdin=json.dumps(spec).encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            async with httpx.AsyncClient(timeout=30) as http:
                raw = await http.post(
                    f"{url}/v1/ui/chat",
                    headers={"authorization": f"Bearer {SERVER_KEY}"},
                    json={
                        "id": "c",
                        "messages": [
                            {"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                        ],
                        "trigger": "submit-message",
                    },
                )
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["_references"] = references
    out["_raw"] = raw
    out["_requests"] = [
        {"path": r.path, "body": msgspec.json.decode(r.body)}
        for r in loopback.requests
        if r.path.startswith("/srv/")
    ]
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, ai_entry())


def _types(job: dict[str, Any]) -> list[str]:
    return [chunk["type"] for chunk in job["chunks"]]


def _sent(sdk: dict[str, Any], keyword: str) -> list[dict[str, Any]]:
    return [r["body"] for r in sdk["_requests"] if keyword in _last_text(r["body"])]


# --- tests ----------------------------------------------------------------------------------------


def test_the_stream_has_the_protocols_header_and_ends_with_done(sdk: dict[str, Any]) -> None:
    raw: httpx.Response = sdk["_raw"]
    assert raw.status_code == 200
    assert raw.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n")


def test_text_is_assembled_into_one_text_part(sdk: dict[str, Any]) -> None:
    job = sdk["text"]
    assert job["errors"] == []
    assert _types(job)[:3] == ["start", "start-step", "text-start"]
    assert _types(job)[-3:] == ["text-end", "finish-step", "finish"]
    assert job["chunks"][-1]["finishReason"] == "stop"
    message = job["message"]
    assert message["role"] == "assistant"
    assert message["id"] == job["chunks"][0]["messageId"]
    texts = [p for p in message["parts"] if p["type"] == "text"]
    assert len(texts) == 1
    assert texts[0]["text"] == sdk["_references"]["Say hello"]["text"] == "".join(FRAGMENTS)
    assert texts[0]["state"] == "done"
    # the request useChat sent reached the provider: the system from the body, the user's text
    sent = _sent(sdk, "Say hello")[0]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["messages"][-1]["role"] == "user"


def test_the_reader_skips_the_keep_alive_comments(sdk: dict[str, Any]) -> None:
    job = sdk["slow"]
    assert job["errors"] == []
    texts = [p["text"] for p in job["message"]["parts"] if p["type"] == "text"]
    assert texts == ["".join(FRAGMENTS)]
    assert _types(job)[-1] == "finish"


def test_reasoning_is_a_reasoning_part_before_the_text(sdk: dict[str, Any]) -> None:
    job = sdk["think"]
    reference = sdk["_references"]["THINK"]
    assert reference["reasoning"]
    assert "reasoning-start" in _types(job)
    parts = [p for p in job["message"]["parts"] if p["type"] in ("reasoning", "text")]
    assert [p["type"] for p in parts] == ["reasoning", "text"]
    assert parts[0]["text"] == reference["reasoning"]
    assert parts[1]["text"] == reference["text"]


def test_a_tool_call_streams_its_input_then_makes_it_available(sdk: dict[str, Any]) -> None:
    job = sdk["tool"]
    types = _types(job)
    assert types.index("tool-input-start") < types.index("tool-input-delta")
    assert types.index("tool-input-delta") < types.index("tool-input-available")
    assert job["chunks"][-1]["type"] == "finish"
    assert job["chunks"][-1]["finishReason"] == "tool-calls"
    (part,) = [p for p in job["message"]["parts"] if p["type"].startswith("tool-")]
    assert part["type"] == "tool-get_weather"
    assert part["toolCallId"] == "call_w1"
    assert part["state"] == "input-available"
    assert part["input"] == {"city": "Paris"}
    sent = _sent(sdk, "WEATHER")[0]
    assert sent["tools"][0]["function"]["name"] == "get_weather"


def test_the_message_carries_its_model_and_usage_as_metadata(sdk: dict[str, Any]) -> None:
    job = sdk["tool"]
    assert job["errors"] == []
    # what the AI SDK's own reader made of the `start` and `finish` parts' metadata
    metadata = job["message"]["metadata"]
    assert metadata["model"]
    assert metadata["provider"]
    usage = metadata["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert usage["inputTokens"] > 0
    assert usage["outputTokens"] > 0


def test_the_tool_output_sent_back_reaches_the_provider(sdk: dict[str, Any]) -> None:
    job = sdk["tool_answer"]
    texts = [p["text"] for p in job["message"]["parts"] if p["type"] == "text"]
    assert texts == ["18 °C, light rain."]
    messages = _sent(sdk, "TOOL_RESULT")[0]["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["tool_call_id"] == "call_w1"
    assert json.loads(tool["content"]) == {"temperature": "18 °C", "sky": "pluie fine"}


def test_use_chats_tool_loop_continues_one_assistant_message(sdk: dict[str, Any]) -> None:
    chat = sdk["chat"]
    assert chat["status"] == "ready", chat["error"]
    # the answer after the tool's output is the same assistant message, not a second one
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    parts = chat["messages"][1]["parts"]
    tools = [p for p in parts if p["type"] == "tool-get_weather"]
    assert len(tools) == 1
    assert tools[0]["state"] == "output-available"
    assert [p["text"] for p in parts if p["type"] == "text"] == ["18 °C, light rain."]


def test_a_failed_turn_is_an_error_part_the_reader_reports(sdk: dict[str, Any]) -> None:
    job = sdk["limited"]
    assert _types(job)[-1] == "error"
    assert job["chunks"][-1]["errorText"].startswith("rate_limited: ")  # the run's code first
    assert job["errors"] == [job["chunks"][-1]["errorText"]]


def test_a_retry_voiding_shown_text_resets_the_step(sdk: dict[str, Any]) -> None:
    job = sdk["reset"]
    types = _types(job)
    reset = types.index("reset-step")
    before = [c["delta"] for c in job["chunks"][:reset] if c["type"] == "text-delta"]
    assert "".join(before) == "Bonjour"
    assert types[-1] == "finish"
    # the reader dropped the voided attempt's text: the message holds the second one's, once
    texts = [p["text"] for p in job["message"]["parts"] if p["type"] == "text"]
    assert texts == ["".join(FRAGMENTS)]
    assert len(_sent(sdk, "RESET")) == 2


def test_an_unknown_model_and_a_wrong_key_are_http_errors(sdk: dict[str, Any]) -> None:
    assert sdk["unknown_model"]["status"] == 404
    assert "model_not_found" in sdk["unknown_model"]["errors"][0]
    assert sdk["wrong_key"]["status"] == 401
    assert sdk["wrong_key"]["chunks"] == []
