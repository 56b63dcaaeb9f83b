"""`POST /v1/runs` takes the conversation in rillet's shape (`content_items`) or in OpenAI's
Chat Completions shape (`role` and `content`): both reach the provider as the same request,
and a body that is neither is a 400 that says what is wrong."""

from __future__ import annotations

import json
from typing import Any

import trio

from ..server_support import serving


def _sent(served: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(served.loopback.requests[-1].body)
    return body


async def _run_with(messages: list[dict[str, Any]], **fields: Any) -> tuple[int, Any, Any]:
    with trio.fail_after(10):
        async with serving() as served:
            reply = await served.client.post("/v1/runs", json={"messages": messages, **fields})
            if reply.status_code != 201:
                return reply.status_code, reply.json(), None
            await served.wait_for(reply.json()["run_id"])
            return reply.status_code, reply.json(), _sent(served)


async def test_openai_shaped_messages_start_the_same_run_as_rillets_own() -> None:
    own = [
        {"role": "user", "content_items": [{"type": "text.done", "text": "What is 2+2?"}]},
        {"role": "assistant", "content_items": [{"type": "text.done", "text": "4."}]},
        {"role": "user", "content_items": [{"type": "text.done", "text": "And 3+3?"}]},
    ]
    openai: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]},
    ]
    status, _, by_own = await _run_with(own, system_prompt="Answer briefly.")
    assert status == 201
    status, _, by_openai = await _run_with(openai)
    assert status == 201
    assert by_openai["messages"] == by_own["messages"]
    assert by_openai["messages"][0] == {"role": "system", "content": "Answer briefly."}


async def test_a_body_that_mixes_the_shapes_or_says_nothing_is_a_400_saying_so() -> None:
    mixed: list[dict[str, Any]] = [
        {"role": "user", "content_items": [{"type": "text.done", "text": "hi"}]},
        {"role": "user", "content": "hi"},
    ]
    status, answer, _ = await _run_with(mixed)
    assert status == 400
    assert "mixes" in answer["error"]["message"]
    status, answer, _ = await _run_with([{"role": "wizard", "content": "hi"}])
    assert status == 400
    assert "role" in answer["error"]["message"]
    status, answer, _ = await _run_with(
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}],
        system_prompt="c",
    )
    assert status == 400
    assert "system prompt once" in answer["error"]["message"]
