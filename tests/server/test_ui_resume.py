"""Kept UI streams (`ServerConfig.ui_resume`), as `useChat({ resume: true })` uses them: a
reader that leaves mid-answer (a reload) leaves the run going, and `GET
/v1/ui/chat/{id}/stream` gives the whole stream again from its first part, then the rest as
it comes, with one provider request in all; a chat with no stream running answers 204;
`DELETE` there, or the chat's next message, stops the run and its provider request. Without
the option a reader that leaves stops its run, and there is nothing to resume."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from rillet.transports.server import _kept
from rillet.transports.testing import Reply, openai_text_stream, split

from ..server_support import serving

pytestmark = pytest.mark.slow

WORDS = [f"w{i} " for i in range(40)]
SLOW = 0.05  # seconds between the provider's chunks: two seconds of answer


def _slow_reply() -> Reply:
    return Reply(chunks=split(openai_text_stream(WORDS), 60), chunk_delay=SLOW)


def _ask(chat: str) -> dict[str, Any]:
    said = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Tell me"}]}
    return {"id": chat, "messages": [said]}


def _parts(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line[6:7] == "{"]


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(p["delta"] for p in parts if p["type"] == "text-delta")


async def _read_a_little(url: str, chat: str) -> list[dict[str, Any]]:
    """Start the chat's stream on a socket of its own and leave once its first words came
    (a reload)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_ask(chat)).encode()
    head = (
        f"POST /v1/ui/chat HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    seen = b""
    async with stream:
        await stream.send_all(head + body)
        while b'"text-delta"' not in seen:
            seen += await stream.receive_some(65536)
    text = seen.decode()
    return _parts(text[text.index("\r\n\r\n") :])


async def test_a_reader_that_leaves_resumes_the_whole_stream_and_pays_once() -> None:
    with trio.fail_after(30):
        async with serving([_slow_reply()], ui_resume=True) as served:
            first = await _read_a_little(served.url, "chat-1")
            resumed = await served.client.get("/v1/ui/chat/chat-1/stream")
            again = await served.client.get("/v1/ui/chat/chat-1/stream")  # it has ended
    assert first[0]["type"] == "start"
    assert resumed.status_code == 200
    assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
    parts = _parts(resumed.text)
    assert parts[0] == first[0]  # the same message, from its first part
    assert _text(parts) == "".join(WORDS)
    assert parts[-1]["type"] == "finish"
    assert resumed.text.rstrip().endswith("data: [DONE]")
    assert again.status_code == 204
    assert len(served.loopback.requests) == 1  # one provider request for the whole answer


async def test_a_chat_without_a_stream_and_a_server_without_the_option_answer_204() -> None:
    with trio.fail_after(30):
        async with serving([_slow_reply()], ui_resume=True) as served:
            nothing = await served.client.get("/v1/ui/chat/never-started/stream")
        assert nothing.status_code == 204
        async with serving([_slow_reply()]) as served:
            await _read_a_little(served.url, "chat-2")
            resumed = await served.client.get("/v1/ui/chat/chat-2/stream")
            while served.loopback.open_connections:  # noqa: ASYNC110 (the run was stopped)
                await trio.sleep(0.01)
    assert resumed.status_code == 204


async def test_delete_stops_the_run_and_its_provider_request() -> None:
    with trio.fail_after(30):
        async with serving([_slow_reply()], ui_resume=True) as served:
            await _read_a_little(served.url, "chat-3")
            stopped = await served.client.delete("/v1/ui/chat/chat-3/stream")
            while served.loopback.open_connections:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.01)
            after = await served.client.get("/v1/ui/chat/chat-3/stream")
    assert stopped.status_code == 204
    assert after.status_code == 204


async def test_the_chats_next_message_stops_the_answer_still_coming() -> None:
    script = [_slow_reply(), Reply(chunks=split(openai_text_stream(["done"]), 60))]
    with trio.fail_after(30):
        async with serving(script, ui_resume=True) as served:
            await _read_a_little(served.url, "chat-4")
            second = await served.client.post("/v1/ui/chat", json=_ask("chat-4"))
            while served.loopback.open_connections > 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert _text(_parts(second.text)) == "done"


async def test_a_stream_past_what_a_replay_keeps_is_stopped_and_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_kept, "REPLAY_BYTES", 2_000)
    with trio.fail_after(30):
        async with serving([_slow_reply()], ui_resume=True) as served:
            reply = await served.client.post("/v1/ui/chat", json=_ask("chat-5"))
    parts = _parts(reply.text)
    assert parts[-1]["type"] == "error"  # its end: the run was stopped
    assert len(_text(parts)) < len("".join(WORDS))
