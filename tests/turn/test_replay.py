"""The replay transport: a recorded wire file through the whole pipeline, as if the provider
sent it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import trio
from rillet import Outcome, Policy, TurnRequest, encode_json, run_turn, user
from rillet.providers import AnthropicDialect, OllamaDialect, Provider
from rillet.transports.replay import ReplayTransport, content_type_for

from ..wire_cases import FIXTURES, expected


async def _replay(path: Path, dialect: object, **options: object) -> list[str]:
    transport = ReplayTransport(path, **options)  # type: ignore[arg-type]
    provider = Provider(dialect, "http://replay.invalid", "replay")  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport) as client:
        result = await run_turn(
            TurnRequest(messages=[user("replay")]),
            provider,
            client=client,
            policy=Policy(transport_retries=0, rescue=False),
        )
    assert result.outcome is Outcome.COMPLETED
    assert transport.requests == 1
    return [
        json.dumps(json.loads(encode_json(item)), ensure_ascii=False)
        for item in result.message.content_items
    ]


def _done_entries(folder: str, case: str) -> list[str]:
    return [e for e in expected(folder, case) if json.loads(e)["type"].endswith(".done")]


async def test_a_recording_replays_to_the_message_it_recorded() -> None:
    path = FIXTURES / "anthropic-messages" / "tool_use.sse"
    got = await _replay(path, AnthropicDialect(), chunk_size=7)
    assert got == _done_entries("anthropic-messages", "tool_use")


async def test_ndjson_recordings_replay_too() -> None:
    path = FIXTURES / "ollama-chat" / "thinking.ndjson"
    got = await _replay(path, OllamaDialect(), chunk_size=3)
    assert got == _done_entries("ollama-chat", "thinking")


async def test_the_pace_is_the_chosen_one(autojump_clock: trio.testing.MockClock) -> None:
    path = FIXTURES / "anthropic-messages" / "text.sse"
    size = len(path.read_bytes())
    start = trio.current_time()
    await _replay(path, AnthropicDialect(), chunk_size=100, delay=0.5)
    chunks = -(-size // 100)
    assert trio.current_time() - start == chunks * 0.5


def test_content_types_follow_the_suffix() -> None:
    assert content_type_for(Path("a.sse")) == "text/event-stream"
    assert content_type_for(Path("a.ndjson")) == "application/x-ndjson"
    assert content_type_for(Path("a.json")) == "application/json"
