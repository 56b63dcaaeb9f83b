"""Tools the server runs, driven by the AI SDK's own `AbstractChat` (the `ai` package, pinned;
npm-installed on first use, skipped without node): a tool the server runs ends in the tool part
`output-available` with its progress seen as a data part; a tool that needs approval stops at
`approval-requested`, and `addToolApprovalResponse` sends the answer back on its own, the call
then run (or denied) and the answer following in the same assistant message."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import RecordedRequest, Reply, open_loopback_provider

from ..cli.test_cli_agents import ANSWER, calls, tool_then_answer
from ..server_support import chat_provider
from .test_ai_sdk_interop import POLICY, ai_entry

CLIENT = Path(__file__).resolve().parent.parent / "interop" / "ai_sdk_agent_client.mjs"


def _script(request: RecordedRequest, n: int) -> Reply:
    """The weather tool for a question about it, `delete_file` otherwise; the answer once a
    tool's result is in the conversation."""
    body = request.body.replace(b" ", b"")
    if b'"role":"tool"' in body:
        return tool_then_answer("x", {})(request, n)  # type: ignore[no-any-return]
    if b"weatherplease" in body:  # the question (spaces gone); tool names say "weather" too
        return Reply(chunks=(calls("get_weather", {"city": "Paris"}),))
    return Reply(chunks=(calls("delete_file", {"path": "notes.txt"}),))


async def _collect(entry: Path) -> tuple[dict[str, Any], list[RecordedRequest]]:
    with trio.fail_after(120):
        async with open_loopback_provider(_script) as loopback, trio.open_nursery() as nursery:
            config = ServerConfig(
                provider=chat_provider(loopback.url), port=0, policy=POLICY, tools="demo"
            )
            url = await nursery.start(functools.partial(serve, config))
            spec = {"entry": str(entry), "url": f"{url}/v1/ui/chat"}
            done = await trio.run_process(
                ["node", str(CLIENT)],
                stdin=json.dumps(spec).encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return json.loads(done.stdout), list(loopback.requests)


@pytest.fixture(scope="module")
def chats() -> tuple[dict[str, Any], list[RecordedRequest]]:
    return trio.run(_collect, ai_entry())


def _assistant(chat: dict[str, Any]) -> dict[str, Any]:
    (message,) = [m for m in chat["messages"] if m["role"] == "assistant"]
    found: dict[str, Any] = message
    return found


def _tool(message: dict[str, Any]) -> dict[str, Any]:
    (part,) = [p for p in message["parts"] if p["type"].startswith("tool-")]
    found: dict[str, Any] = part
    return found


def _text(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


def test_a_tool_the_server_runs_ends_output_available_and_shows_progress(
    chats: tuple[dict[str, Any], list[RecordedRequest]],
) -> None:
    chat = chats[0]["runs"]
    assert chat["error"] == ""
    assert chat["status"] == "ready"
    message = _assistant(chat)
    part = _tool(message)
    assert part["type"] == "tool-get_weather"
    assert part["state"] == "output-available"
    assert "Paris" in part["output"]
    assert _text(message) == "".join(ANSWER)
    assert [d["type"] for d in chat["data"]] == ["data-tool-status"]
    assert chat["data"][0]["data"]["status"] == "running"
    assert not any(p["type"] == "data-tool-status" for p in message["parts"])  # transient


def test_an_approved_call_runs_and_the_same_message_goes_on(
    chats: tuple[dict[str, Any], list[RecordedRequest]],
) -> None:
    chat = chats[0]["approved"]
    assert chat["error"] == ""
    (asked,) = chat["asked"]
    assert asked["type"] == "tool-delete_file"
    assert asked["input"] == {"path": "notes.txt"}
    message = _assistant(chat)  # one assistant message, continued
    part = _tool(message)
    assert part["state"] == "output-available"
    assert part["approval"]["approved"] is True
    assert _text(message) == "".join(ANSWER)


def test_a_denied_call_ends_output_denied_and_the_model_is_told(
    chats: tuple[dict[str, Any], list[RecordedRequest]],
) -> None:
    chat = chats[0]["denied"]
    assert chat["error"] == ""
    message = _assistant(chat)
    part = _tool(message)
    assert part["state"] == "output-denied"
    assert _text(message) == "".join(ANSWER)
    told = [
        m["content"]
        for r in chats[1]
        for m in json.loads(r.body)["messages"]
        if m["role"] == "tool" and "denied" in m["content"]
    ]
    assert told
