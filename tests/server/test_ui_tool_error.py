"""A UI message stream whose run fails while a tool call's input is still streaming closes that
call as `tool-input-error` before the `error` part, so a reader does not show it streaming
for ever; the error's text is the run's code and sentence, never the provider's words."""

from __future__ import annotations

import json
from typing import Any

import trio
from rillet.transports.testing import Reply, sse

from ..server_support import serving

HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


CALL_START = {
    "index": 0,
    "id": "call_cut",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"ci'},
}
# the call's name and the start of its arguments, then the connection drops: every attempt
CUT = Reply(
    chunks=(
        sse(_chunk({"role": "assistant", "content": ""}), _chunk({"tool_calls": [CALL_START]})),
    ),
    drop_after_bytes=10_000,
)
UI = {"messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Weather?"}]}]}


async def test_a_tool_call_cut_mid_input_ends_as_a_tool_input_error() -> None:
    with trio.fail_after(60):
        async with serving([CUT]) as served:
            reply = await served.client.post("/v1/ui/chat", json=UI)
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line[6:7] == "{"]
    types = [c["type"] for c in chunks]
    assert "tool-input-start" in types
    assert types[-2:] == ["tool-input-error", "error"]
    closed = chunks[-2]
    assert closed["toolCallId"] == "call_cut"
    assert closed["toolName"] == "get_weather"
    assert closed["errorText"] == chunks[-1]["errorText"]
    assert chunks[-1]["errorText"].split(":")[0] in ("connection_failed", "provider_error")
