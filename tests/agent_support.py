"""What the agent tests share: a provider of every dialect on the loopback server, recorded
tool-call and text replies for each, and how each dialect's request carries a tool result."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
from rillet import RunDone, RunEvent, TurnRequest, user
from rillet.providers import (
    AnthropicDialect,
    Dialect,
    GeminiDialect,
    MMSPDialect,
    OllamaDialect,
    OpenAIChatDialect,
    OpenAIResponsesDialect,
    Provider,
    Secret,
)
from rillet.transports.testing import (
    LoopbackProvider,
    Reply,
    fixture_reply,
    openai_text_stream,
    sse,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "providers"
KEY = "sk-agent-test-0123456789"
QUESTION = TurnRequest(messages=[user("What is the weather?")])
LIMIT = 3600.0  # virtual seconds: beyond every scripted wait, never reached by a passing test


def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness: bytes in flight on loopback
    are never mistaken for a quiet moment (see tests/turn/test_turn_loopback.py)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


def provider_at(
    server: LoopbackProvider, dialect: Dialect | None = None, **fields: Any
) -> Provider:
    """A provider of `dialect` (OpenAI Chat by default) at the loopback server."""
    return Provider(
        dialect=dialect or OpenAIChatDialect(),
        base_url=server.url,
        model=fields.pop("model", "test-model"),
        api_key=Secret(KEY),
        **fields,
    )


def mmsp_reply(name: str) -> Reply:
    """An MMSP server's SSE stream replaying a recorded MMSP event log."""
    lines = (FIXTURES / name).read_text("utf-8").splitlines()
    return Reply(chunks=(sse(*[line for line in lines if line.strip()], "[DONE]"),))


def text_reply(*fragments: str) -> Reply:
    """An OpenAI Chat stream of text (with its usage chunk)."""
    return Reply(chunks=(openai_text_stream(list(fragments)),))


def tool_result_in(body: dict[str, Any], dialect: str) -> list[tuple[str, str]]:
    """(tool call id or name, result text) for every tool result a request body carries, read
    the way each dialect's wire writes it."""
    out: list[tuple[str, str]] = []
    if dialect in ("openai-chat", "ollama"):
        for m in body["messages"]:
            if m["role"] == "tool":
                out.append((m.get("tool_call_id") or m.get("tool_name"), m["content"]))
    elif dialect == "anthropic":
        for m in body["messages"]:
            for block in m["content"] if isinstance(m["content"], list) else ():
                if block["type"] == "tool_result":
                    out.append((block["tool_use_id"], block["content"][0]["text"]))
    elif dialect == "gemini":
        for content in body["contents"]:
            for part in content["parts"]:
                if "functionResponse" in part:
                    response = part["functionResponse"]
                    out.append((response["name"], response["response"]["output"]))
    elif dialect == "openai-responses":
        for item in body["input"]:
            if item.get("type") == "function_call_output":
                out.append((item["call_id"], item["output"]))
    elif dialect == "mmsp":
        for m in body["messages"]:
            for item in m["content_items"]:
                if item["type"] == "tool_result.done":
                    out.append((item["tool_call_id"], item["text"]))
    return out


@attrs.frozen
class Case:
    """One dialect's recorded tool-call reply, its text reply, and the call it makes."""

    dialect: Callable[[], Dialect]
    tool_call: Reply
    text: Reply
    call_key: str  # how the dialect's tool result names the call (its id, or the name)
    place: str  # the city or location the recorded call asks about


CASES: dict[str, Case] = {
    "openai-chat": Case(
        OpenAIChatDialect,
        fixture_reply(FIXTURES / "openai-chat/tool_call.sse"),
        text_reply("It is ", "sunny."),
        "call_Wq3LzR8yUv1XbN5cT7mK2pJd",
        "São Paulo",
    ),
    "anthropic": Case(
        AnthropicDialect,
        fixture_reply(FIXTURES / "anthropic-messages/tool_use.sse"),
        fixture_reply(FIXTURES / "anthropic-messages/text.sse"),
        "toolu_01NRLabsLyVHZPKxbKvkfSMn",
        "Paris, France",
    ),
    "gemini": Case(
        GeminiDialect,
        fixture_reply(FIXTURES / "gemini/function_call.sse"),
        fixture_reply(FIXTURES / "gemini/text.sse"),
        "get_weather",
        "Florence, Italy",
    ),
    "openai-responses": Case(
        OpenAIResponsesDialect,
        fixture_reply(FIXTURES / "openai-responses/tool_call.sse"),
        fixture_reply(FIXTURES / "openai-responses/text.sse"),
        "call_Kr4k0wW34th3rC4ll1d0001",
        "Kraków",
    ),
    "ollama": Case(
        OllamaDialect,
        fixture_reply(FIXTURES / "ollama-chat/tool_call.ndjson"),
        fixture_reply(FIXTURES / "ollama-chat/text.ndjson"),
        "call_k3v9x2qa",
        "Tokyo",
    ),
    "mmsp": Case(
        MMSPDialect,
        mmsp_reply("openai-chat/tool_call.mmsp.jsonl"),
        mmsp_reply("openai-chat/usage_final_chunk.mmsp.jsonl"),
        "call_Wq3LzR8yUv1XbN5cT7mK2pJd",
        "São Paulo",
    ),
}


def body_of(server: LoopbackProvider, number: int) -> dict[str, Any]:
    """The JSON body of the server's request `number` (0-based)."""
    parsed: dict[str, Any] = json.loads(server.requests[number].body)
    return parsed


def check_stream(events: list[RunEvent], run_id: str) -> None:
    """One run id, `seq` from 1 without gaps, `elapsed_ms` monotonic, one `run.done` last."""
    assert {e.run_id for e in events} == {run_id}
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    elapsed = [e.elapsed_ms for e in events]
    assert elapsed == sorted(elapsed)
    assert [type(e) for e in events].count(RunDone) == 1
    assert isinstance(events[-1], RunDone)


def kinds(events: list[RunEvent]) -> list[str]:
    """Each event's `type`."""
    return [str(type(e).__struct_config__.tag) for e in events]
