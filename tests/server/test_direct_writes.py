"""The short way a served stream's deltas take: written on the turn's own task while the
socket takes them, through the wire's pump when it does not (`ChannelSink`). A client that
reads slowly fills its socket partway through a long answer, so both ways alternate; on every
wire it must still read each fragment once, in order, and the stream's end."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from rillet.frames import SSEDecoder

from ..server_support import _RCVBUF, serving, text_reply

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.slow

# 1,500 fragments of ~600 bytes: far more than the two sockets' buffers hold
WORDS = [f"<{i:04d}>" + "x" * 590 + " " for i in range(1500)]
HI_CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
HI_MMSP = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}],
    "config": {},
}
HI_UI = {"messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}]}
HI_RESPONSES = {"model": "gpt-4o-mini", "input": "Hi", "stream": True}
HI_MESSAGES = {
    "model": "gpt-4o-mini",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "Hi"}],
    "stream": True,
}


def _chat_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


def _mmsp_text(data: dict[str, Any]) -> str:
    items = data.get("content_items") or []
    return "".join(item.get("text", "") for item in items if item.get("type") == "text.delta")


def _ui_text(data: dict[str, Any]) -> str:
    return str(data["delta"]) if data.get("type") == "text-delta" else ""


def _responses_text(data: dict[str, Any]) -> str:
    return str(data["delta"]) if data.get("type") == "response.output_text.delta" else ""


def _messages_text(data: dict[str, Any]) -> str:
    delta = data.get("delta") if data.get("type") == "content_block_delta" else None
    return str(delta["text"]) if isinstance(delta, dict) and "text" in delta else ""


WIRES: dict[str, tuple[str, dict[str, Any], Callable[[dict[str, Any]], str], str]] = {
    "chat": ("/v1/chat/completions", HI_CHAT, _chat_text, "[DONE]"),
    "mmsp": ("/v1/stream", HI_MMSP, _mmsp_text, "[DONE]"),
    "ui": ("/v1/ui/chat", HI_UI, _ui_text, "[DONE]"),
    "responses": ("/v1/responses", HI_RESPONSES, _responses_text, "response.completed"),
    "messages": ("/v1/messages", HI_MESSAGES, _messages_text, "message_stop"),
}


@pytest.mark.parametrize("wire", sorted(WIRES))
async def test_a_slow_reader_gets_every_fragment_once_in_order(wire: str) -> None:
    path, payload, text_of, end = WIRES[wire]
    small = {"transport": httpx.AsyncHTTPTransport(socket_options=[_RCVBUF])}
    with trio.fail_after(60):
        async with serving([text_reply(WORDS, chunk_delay=0.0005)], client_options=small) as served:
            decoder = SSEDecoder()
            events = []
            async with served.client.stream("POST", path, json=payload) as response:
                assert response.status_code == 200
                reads = 0
                async for chunk in response.aiter_raw():
                    events += decoder.feed(chunk)
                    reads += 1
                    if reads in (2, 300, 600):  # the socket fills behind us meanwhile
                        await trio.sleep(0.3)
            events += decoder.close()
    if end == "[DONE]":
        assert events[-1].data == end
        events.pop()
    else:
        assert json.loads(events[-1].data)["type"] == end
    datas = [json.loads(event.data) for event in events]
    failed = ("error", "response.failed")
    assert not [data for data in datas if "error" in data or data.get("type") in failed]
    assert "".join(text_of(data) for data in datas) == "".join(WORDS)
