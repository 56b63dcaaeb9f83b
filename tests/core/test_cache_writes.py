"""Cache writes are kept apart from the rest of the prompt: an Anthropic stream whose prompt was
written to the cache (or an OpenAI-compatible server that reports the written share, as
OpenRouter does) gives the turn result its `cache_write_tokens` and a cost that prices them
at the write price, while the stop event's JSON stays MMSP's four usage fields."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import trio
from rillet import Price, encode_json
from rillet._core._dialect import Provider, Secret
from rillet._turn._api import run_turn
from rillet.providers import AnthropicDialect, OpenAIChatDialect
from rillet.transports.testing import Reply, open_loopback_provider, sse

from ..handler_support import REQUEST

CLAUDE = Price(input="3", cached_input="0.30", cache_write="3.75", output="15")


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _stream(written: int, read: int) -> bytes:
    # Anthropic's first turn with a cached system prompt: input_tokens leaves out both the
    # tokens written to the cache and those read from it.
    usage = {
        "input_tokens": 3,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                               "content": [], "stop_reason": None, "usage": usage}  # fmt: skip
    block = {"type": "text", "text": ""}
    delta = {"type": "text_delta", "text": "Hi"}
    end = {"stop_reason": "end_turn"}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": message}),
        ("content_block_start", {"index": 0, "content_block": block}),
        ("content_block_delta", {"index": 0, "delta": delta}),
        ("content_block_stop", {"index": 0}),
        ("message_delta", {"delta": end, "usage": {**usage, "output_tokens": 95}}),
        ("message_stop", {}),
    ]
    return b"".join(_event(name, {"type": name, **data}) for name, data in events)


async def _turn(written: int, read: int) -> Any:
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=(_stream(written, read),))]) as server:
            provider = Provider(AnthropicDialect(), server.url, "m", api_key=Secret("k"))
            return await run_turn(REQUEST, provider)


async def test_cache_writes_reach_the_result_and_are_priced_as_written() -> None:
    result = await _turn(written=2051, read=0)
    assert result.ok
    usage = result.message.usage_metadata
    assert usage is not None
    assert (usage.prompt_tokens, usage.cached_tokens, usage.response_tokens) == (2054, 0, 95)
    assert result.cache_write_tokens == 2051
    assert result.cost(CLAUDE) == Decimal("0.00912525")  # 3 × 3 + 2051 × 3.75 + 95 × 15
    # the stop event's usage is MMSP's, nothing added
    assert json.loads(encode_json(usage)) == {
        "cached_tokens": 0,
        "prompt_tokens": 2054,
        "thoughts_tokens": None,
        "response_tokens": 95,
    }


async def test_cache_reads_and_writes_in_one_turn_are_each_priced_once() -> None:
    result = await _turn(written=100, read=2048)
    assert result.cache_write_tokens == 100
    # 3 × 3 + 100 × 3.75 + 2048 × 0.30 + 95 × 15
    assert result.cost(CLAUDE) == Decimal("0.0024234")


async def test_a_turn_without_cache_writes_says_none_were_written() -> None:
    result = await _turn(written=0, read=0)
    assert result.cache_write_tokens == 0
    assert result.cost(CLAUDE) == Decimal("0.001434")  # 3 × 3 + 95 × 15


async def test_a_chat_server_reporting_cache_writes_has_them_priced_as_written() -> None:
    # OpenRouter's documented usage: prompt_tokens counts the 100 written to the cache.
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    usage = {
        "prompt_tokens": 194,
        "completion_tokens": 2,
        "total_tokens": 196,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 100},
    }
    delta = {"role": "assistant", "content": "Hi"}
    body = sse(
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": usage},
        "[DONE]",
    )
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=(body,))]) as server:
            provider = Provider(OpenAIChatDialect(), f"{server.url}/v1", "m")
            result = await run_turn(REQUEST, provider)
    assert result.ok
    assert result.cache_write_tokens == 100
    assert result.cost(CLAUDE) == Decimal("0.000687")  # 94 × 3 + 100 × 3.75 + 2 × 15
