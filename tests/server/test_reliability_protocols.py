"""The protocol endpoints against a hostile client, one level above HTTP: what one request may
make the server send back or spend upstream. The HTTP endpoints run on a real server on
127.0.0.1 (`serving`); the MCP server is the real `python -m rillet.mcp` subprocess spoken to in
raw JSON-RPC lines over its stdio. The loopback provider on 127.0.0.1 is behind both."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

import msgspec
import pytest
import trio
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

from ..server_support import serving

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WORDS = ["w "] * 50
_PROGRESS = "notifications/progress"


def _frames(data: bytes) -> tuple[bytes, ...]:
    return tuple(part + b"\n\n" for part in data.split(b"\n\n") if part)


async def _mcp_call(url: str, meta: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
    """One `tools/call` to a fresh stdio server with `meta` as its `_meta`: the result, and
    every line the server wrote before it."""
    command = [sys.executable, "-m", "rillet.mcp", "--provider", f"{url}/v1", "--model", "m"]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    process = await trio.lowlevel.open_process(command, stdin=-1, stdout=-1, env=env)
    assert process.stdin is not None
    assert process.stdout is not None
    lines: list[bytes] = []
    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
        hello["clientInfo"] = {"name": "test", "version": "1"}
        call = {"name": "run_turn", "arguments": {"prompt": "hi"}, "_meta": meta}
        for message in (
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call},
        ):
            await process.stdin.send_all(json.dumps(message).encode() + b"\n")
        pending = b""
        while data := await process.stdout.receive_some(1 << 20):
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                message = json.loads(line)
                if message.get("id") == 1:
                    return message, lines
                lines.append(line)
        raise AssertionError("the server ended without answering")
    finally:
        process.kill()
        await process.wait()


@pytest.mark.slow
async def test_mcp_a_huge_progress_token_gets_no_progress_and_the_call_still_answers() -> None:
    # Every progress notification repeats the token: 100,000 characters repeated for each of
    # the turn's ~55 run events would answer 5.5 MB to a 100 KB request.
    reply = Reply(chunks=_frames(openai_text_stream(WORDS)))
    huge = "t" * 100_000
    within = "k" * 200
    with trio.fail_after(60):
        async with open_loopback_provider([reply, reply]) as provider:
            answered, before = await _mcp_call(provider.url, {"progressToken": huge})
            kept, progress = await _mcp_call(provider.url, {"progressToken": within})
    assert answered["result"]["content"][0]["text"] == "".join(WORDS)
    assert answered["result"]["isError"] is False
    assert not [line for line in before if _PROGRESS.encode() in line]
    assert sum(len(line) for line in before) < 10_000
    # a token within the bound still gets every run event as progress
    assert kept["result"]["content"][0]["text"] == "".join(WORDS)
    notes = [json.loads(line) for line in progress]
    tokens = [n["params"]["progressToken"] for n in notes if n.get("method") == _PROGRESS]
    assert set(tokens) == {within}
    assert len(tokens) > len(WORDS)


# --- refusals that quote the client -------------------------------------------------------------

_HUGE = "x" * 500_000
_QUOTING = {
    "chat-model": ("/v1/chat/completions", {"model": _HUGE, "messages": [{"role": "user"}]}, 404),
    "chat-role": ("/v1/chat/completions", {"messages": [{"role": _HUGE, "content": "hi"}]}, 400),
    "chat-part-type": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": {"k": [_HUGE[:300_000]] * 3}}]}]},
        400,
    ),
    "ui-role": ("/v1/ui/chat", {"messages": [{"role": _HUGE, "parts": []}]}, 400),
    # values the body's decoder itself refuses, quoting them: an enum's, a tagged union's tag
    "run-thinking-level": ("/v1/runs", {"prompt": "hi", "thinking_level": _HUGE}, 400),
    "run-item-type": (
        "/v1/runs",
        {"messages": [{"role": "user", "content_items": [{"type": _HUGE}]}]},
        400,
    ),
    "mmsp-role": (
        "/v1/stream",
        {"model": "gpt-4o-mini", "messages": [{"role": _HUGE, "content_items": []}]},
        400,
    ),
    "ui-thinking-level": (
        "/v1/ui/chat",
        {"messages": [{"role": "user", "parts": []}], "thinkingLevel": _HUGE},
        400,
    ),
}


@pytest.mark.parametrize("case", list(_QUOTING))
async def test_a_refusal_quotes_a_huge_value_cut_short(case: str) -> None:
    path, body, status = _QUOTING[case]
    with trio.fail_after(10):
        async with serving() as served:
            reply = await served.client.post(path, json=body)
            requests = len(served.loopback.requests)
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    assert len(reply.content) < 1000
    assert "xxxx" in reply.json()["error"]["message"]  # the value is named, only shortened
    assert requests == 0


# --- a request whose reading costs more than its size -------------------------------------------


async def test_a_chat_completion_of_thousands_of_messages_is_refused_before_it_is_read() -> None:
    """Each tool result joins the user message before it, so reading a run of them cost the
    square of its length: 25,000 in one body of under 1 MiB held the server's one thread for
    seconds, every connection waiting. Past 2,048 messages a request is refused unread."""
    tool = {"role": "tool", "tool_call_id": "a"}

    def body(tools: int) -> bytes:
        return msgspec.json.encode(
            {"messages": [{"role": "user", "content": "hi"}, *[tool] * tools]}
        )

    json_type = {"content-type": "application/json"}
    with trio.fail_after(5):
        async with serving() as served:
            chat = "/v1/chat/completions"
            refused = await served.client.post(chat, content=body(25_000), headers=json_type)
            requests = len(served.loopback.requests)
            answered = await served.client.post(chat, content=body(2_047), headers=json_type)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages"
    assert requests == 0
    assert answered.status_code == 200


# --- a whole reply whose client left --------------------------------------------------------------


def _whole_request(url: str) -> bytes:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    host = url.removeprefix("http://")
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


@pytest.mark.parametrize("ahead", [0, 96 * 1024], ids=["closed", "96 KiB sent ahead first"])
async def test_a_client_that_leaves_a_whole_chat_completion_stops_its_provider_request(
    ahead: int,
) -> None:
    """A `stream: false` reply has no head before the turn ends, so no SSE comment can probe
    the connection: a `100 Continue` does, and the reset that answers it cancels the turn
    instead of letting the provider generate 10 s of answer nobody reads. While the reply is
    under way the server reads ahead of the next request, at most 64 KiB: a client that sent
    more and then closed was never seen leaving (nothing read its socket any more), so such a
    client is cut off rather than left unread."""
    slow = Reply(chunks=_frames(openai_text_stream(["w "] * 40)), chunk_delay=0.25)
    with trio.fail_after(5):
        async with serving([slow]) as served:
            stream = await _connect(served.url)
            await stream.send_all(_whole_request(served.url))
            while not served.loopback.open_connections:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.01)
            if ahead:
                with contextlib.suppress(trio.BrokenResourceError):  # cut off: fine
                    await stream.send_all(b"x" * ahead)
            await stream.aclose()
            while served.loopback.open_connections:  # noqa: ASYNC110 (closed, not pooled)
                await trio.sleep(0.01)
            metrics = (await served.client.get("/metrics.json")).json()
    assert len(served.loopback.requests) == 1
    assert metrics["runs_active"] == 0


async def test_a_client_that_half_closes_still_gets_its_whole_chat_completion() -> None:
    reply = Reply(chunks=_frames(openai_text_stream(WORDS)), chunk_delay=0.01)
    with trio.fail_after(10):
        async with serving([reply]) as served:
            stream = await _connect(served.url)
            await stream.send_all(_whole_request(served.url))
            await stream.send_eof()
            received = b""
            while data := await stream.receive_some(65536):
                received += data
            await stream.aclose()
    final = received[received.index(b"HTTP/1.1 200 ") :]  # after any interim 100 Continue
    head, _, body = final.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    completion = json.loads(body)
    assert completion["choices"][0]["message"]["content"] == "".join(WORDS)
