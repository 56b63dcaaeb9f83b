"""Token counts are never negative: a prompt's uncached tokens from usage that counts the cached
ones inside the prompt (OpenAI's), beside it (its total says so), or past it (an Azure AI
Foundry stream: 7 prompt tokens and 161 cached), the provider's numbers kept as given where
they cannot be reconciled; end to end through a Chat Completions stream on loopback."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from rillet._core._dialect import Provider, uncached_tokens
from rillet._turn._api import run_turn
from rillet.providers import OpenAIChatDialect
from rillet.transports.testing import Reply, open_loopback_provider, sse

from ..handler_support import REQUEST


@pytest.mark.parametrize(
    ("prompt", "cached", "output", "total", "uncached"),
    [
        (100, 40, 10, 110, 60),  # OpenAI's: the cached ones inside the prompt
        (100, 40, 10, None, 60),
        (100, 40, 10, 150, 100),  # counted beside the prompt: its total says so
        (7, 161, 5, None, 7),  # more cached than prompt: kept as given, never -154
        (7, 161, 5, 173, 7),
        (100, None, 10, 110, 100),
        (None, 40, 10, None, None),
    ],
)
def test_the_uncached_prompt_is_never_negative(
    prompt: int | None,
    cached: int | None,
    output: int | None,
    total: int | None,
    uncached: int | None,
) -> None:
    assert uncached_tokens(prompt, cached, output, total) == uncached


async def test_a_stream_reporting_more_cached_than_prompt_tokens_gives_no_negative_count() -> None:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 173,
        "prompt_tokens_details": {"cached_tokens": 161},
    }
    body = sse(chunk({"role": "assistant", "content": "Hi"}), chunk({}, "stop"),
               {**head, "choices": [], "usage": usage}, "[DONE]")  # fmt: skip
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=(body,))]) as server:
            provider = Provider(OpenAIChatDialect(), f"{server.url}/v1", "m")
            result = await run_turn(REQUEST, provider)
    assert result.ok
    counted = result.message.usage_metadata
    assert counted is not None
    assert (counted.prompt_tokens, counted.cached_tokens) == (7, 161)
    assert counted.response_tokens == 5
