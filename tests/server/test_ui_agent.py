"""Tools the server runs, on the AI SDK's UI message stream (`ServerConfig.tools`): a chat that
brings no tools of its own is an agent run. A tool that runs shows its progress (a transient
`data-tool-status`) and its output; one that needs approval ends the stream with a
`tool-approval-request`, and the conversation sent back with the answer (the tool part
`approval-responded`, as `addToolApprovalResponse` sends it) runs the call, or refuses it, and
goes on in the same assistant message. The loopback provider on 127.0.0.1 plays the model; the
server is real."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio

from ..cli.test_cli_agents import ANSWER, tool_messages, tool_then_answer
from ..server_support import serving

if TYPE_CHECKING:
    from rillet.transports.testing import RecordedRequest

USER = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Weather in Paris?"}]}
REPLY_ID = "msg-assistant-1"


def _chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line[6:7] == "{"]


async def _chat(script: Any, *messages: dict[str, Any]) -> tuple[list[Any], list[RecordedRequest]]:
    with trio.fail_after(60):
        async with serving(script, tools="demo") as served:
            reply = await served.client.post("/v1/ui/chat", json={"messages": list(messages)})
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-vercel-ai-ui-message-stream"] == "v1"
            assert reply.text.endswith("data: [DONE]\n\n")
            return _chunks(reply.text), list(served.loopback.requests)


async def test_a_tool_the_server_runs_shows_its_progress_and_output_then_the_answer() -> None:
    chunks, requests = await _chat(tool_then_answer("get_weather", {"city": "Paris"}), USER)
    types = [c["type"] for c in chunks]
    assert types[:2] == ["start", "start-step"]
    running = next(c for c in chunks if c["type"] == "data-tool-status")
    assert running["data"] == {"toolCallId": "call_1", "name": "get_weather", "status": "running"}
    assert running["transient"] is True
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["toolCallId"] == "call_1"
    assert output["output"] == tool_messages(requests[1])[0]  # what the model was told
    order = [types.index(t) for t in ("tool-input-available", "data-tool-status")]
    assert order == sorted(order)
    assert types.index("tool-output-available") < types.index("text-start")
    assert types.count("start-step") == types.count("finish-step") == 2  # two model steps
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "".join(ANSWER)
    assert chunks[-1]["type"] == "finish"
    assert chunks[-1]["finishReason"] == "stop"
    assert len(requests) == 2


async def _asked() -> tuple[list[Any], dict[str, Any]]:
    """A call that needs approval: the stream's chunks, and the assistant message a client
    builds from them, waiting for its answer."""
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    chunks, requests = await _chat(script, USER)
    assert len(requests) == 1
    ask = next(c for c in chunks if c["type"] == "tool-approval-request")
    message = {
        "id": REPLY_ID,
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-delete_file",
                "toolCallId": ask["toolCallId"],
                "state": "approval-requested",
                "input": {"path": "notes.txt"},
                "approval": {"id": ask["approvalId"]},
            },
        ],
    }
    return chunks, message


async def test_a_tool_that_needs_approval_ends_the_stream_asking_for_it() -> None:
    chunks, message = await _asked()
    types = [c["type"] for c in chunks]
    assert "tool-output-available" not in types  # nothing ran
    assert types[-4:] == ["tool-input-available", "tool-approval-request", "finish-step", "finish"]
    assert chunks[-1]["finishReason"] == "tool-calls"
    assert message["parts"][1]["toolCallId"] == "call_1"


def _answered(message: dict[str, Any], approved: bool) -> dict[str, Any]:
    part = dict(message["parts"][1])
    part["state"] = "approval-responded"
    part["approval"] = {**part["approval"], "approved": approved, "reason": "not that one"}
    return {**message, "parts": [message["parts"][0], part]}


async def test_an_approved_call_runs_and_the_same_message_goes_on_to_the_answer() -> None:
    _, message = await _asked()
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    chunks, requests = await _chat(script, USER, _answered(message, True))
    assert chunks[0] == {
        "type": "start",
        "messageId": REPLY_ID,  # continued, not a second assistant message
        "messageMetadata": chunks[0]["messageMetadata"],
    }
    types = [c["type"] for c in chunks]
    assert "tool-approval-request" not in types
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["toolCallId"] == "call_1"
    assert len(requests) == 1  # the model is asked once more, with the call's result
    assert tool_messages(requests[0]) == [output["output"]]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "".join(ANSWER)
    assert chunks[-1]["finishReason"] == "stop"


async def test_a_denied_call_is_answered_denied_and_the_model_is_told() -> None:
    _, message = await _asked()
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    chunks, requests = await _chat(script, USER, _answered(message, False))
    types = [c["type"] for c in chunks]
    assert {"type": "tool-output-denied", "toolCallId": "call_1"} in chunks
    assert "tool-output-available" not in types
    (told,) = tool_messages(requests[0])
    assert told.startswith("denied")
    assert chunks[-1]["finishReason"] == "stop"


async def test_a_chat_that_brings_its_own_tools_runs_them_on_the_client() -> None:
    tools = [{"name": "get_weather", "parameters": {"type": "object"}}]
    with trio.fail_after(60):
        async with serving(tool_then_answer("get_weather", {}), tools="demo") as served:
            reply = await served.client.post(
                "/v1/ui/chat", json={"messages": [USER], "tools": tools}
            )
    types = [c["type"] for c in _chunks(reply.text)]
    assert "tool-input-available" in types
    assert "tool-output-available" not in types
    assert "data-tool-status" not in types
