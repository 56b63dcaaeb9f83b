"""The reply's id and the answering model, as each provider said them, on the turn's result:
recorded replies of four wires played by the loopback provider on 127.0.0.1, read by a real
turn; the ids are read from the recordings here by a plain JSON scan of their own."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._turn._api import run_turn
from rillet.providers._registry import dialect_from_name
from rillet.transports.testing import fixture_reply, open_loopback_provider

from ..handler_support import KEY, REQUEST
from ..wire_cases import wire_path


def _said(folder: str, path_text: str) -> tuple[str, str]:
    """The first id and model the recording states, by the wire's own field names."""
    for line in path_text.splitlines():
        if not line.startswith("data: {"):
            continue
        data: dict[str, Any] = json.loads(line[6:])
        if folder == "anthropic-messages" and data.get("type") == "message_start":
            return data["message"]["id"], data["message"]["model"]
        if folder == "openai-responses" and data.get("type") == "response.created":
            return data["response"]["id"], data["response"]["model"]
        if folder == "gemini" and "responseId" in data:
            return data["responseId"], data["modelVersion"]
        if folder == "openai-chat" and "id" in data:
            return data["id"], data["model"]
    raise AssertionError(f"{folder}: no id in the recording")


@pytest.mark.parametrize(
    "folder", ["openai-chat", "anthropic-messages", "gemini", "openai-responses"]
)
async def test_the_result_names_the_reply_and_the_model_that_answered(folder: str) -> None:
    path = wire_path(folder, "text")
    expected = _said(folder, path.read_text())
    with trio.fail_after(20):
        async with (
            open_loopback_provider(lambda *_: fixture_reply(path)) as server,
            httpx.AsyncClient() as client,
        ):
            provider = Provider(
                dialect_from_name(folder), f"{server.url}/v1", "asked-model", api_key=Secret(KEY)
            )
            result = await run_turn(REQUEST, provider, client=client)
    assert result.ok, result.error
    assert (result.response_id, result.response_model) == expected
    assert result.response_model != "asked-model"
