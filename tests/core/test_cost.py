"""A turn's cost in money: each token priced once, at its own price, with exact arithmetic, on
real recorded usage from each provider read end to end through a loopback server."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import trio
from rillet import Price, UsageMetadata, usage_cost
from rillet._core._dialect import Dialect, Provider, Secret
from rillet._turn._api import run_turn
from rillet.providers import AnthropicDialect, GeminiDialect, OpenAIChatDialect
from rillet.transports.testing import fixture_reply, open_loopback_provider

from ..handler_support import REQUEST

FIXTURES = Path(__file__).parent.parent / "fixtures" / "providers"

# Prices per million tokens, as a host would pass them (strings keep them exact).
CHAT = Price(input="2.50", cached_input="1.25", output="10")
CLAUDE = Price(input="3", cached_input="0.30", cache_write="3.75", output="15")
FLASH = Price(input="0.30", cached_input="0.075", output="2.50")


@pytest.mark.parametrize(
    ("dialect", "fixture", "price", "cost"),
    [
        # 1210 prompt tokens of which 1024 cached; 86 out, 64 of them reasoning:
        # 186 × 2.50 + 1024 × 1.25 + 86 × 10 (reasoning billed as output).
        (OpenAIChatDialect(), "openai-chat/usage_final_chunk", CHAT, "0.002605"),
        # input_tokens 377 beside cache_read_input_tokens 2048; 68 out:
        # 377 × 3 + 2048 × 0.30 + 68 × 15.
        (AnthropicDialect(), "anthropic-messages/tool_use", CLAUDE, "0.0027654"),
        # promptTokenCount 4120 of which cachedContentTokenCount 4096; 8 out:
        # 24 × 0.30 + 4096 × 0.075 + 8 × 2.50.
        (GeminiDialect(), "gemini/cached_usage", FLASH, "0.0003344"),
    ],
)
async def test_a_recorded_turn_costs_each_token_once(
    dialect: Dialect, fixture: str, price: Price, cost: str
) -> None:
    reply = fixture_reply(FIXTURES / f"{fixture}.sse", chunk_size=53)
    with trio.fail_after(10):
        async with open_loopback_provider([reply]) as server:
            provider = Provider(dialect, server.url, "m", api_key=Secret("k"))
            result = await run_turn(REQUEST, provider)
    assert result.ok
    usage = result.message.usage_metadata
    assert usage is not None
    assert usage_cost(usage, price) == Decimal(cost)


def test_cache_writes_are_billed_at_the_write_price_and_not_also_as_input() -> None:
    # Anthropic's first cached turn: input_tokens 3, cache_creation_input_tokens 2051, 95 out;
    # the prompt counts the written tokens, and they cost 3.75 instead of 3, not on top of it.
    usage = UsageMetadata(prompt_tokens=2054, cached_tokens=0, response_tokens=95)
    cost = usage_cost(usage, CLAUDE, cache_write_tokens=2051)
    assert cost == Decimal("0.00912525")  # 3 × 3 + 2051 × 3.75 + 95 × 15
    assert usage_cost(usage, CLAUDE) == Decimal("0.007587")  # unknown writes: billed as input


def test_cached_reads_default_to_the_input_price_and_nothing_reported_costs_nothing() -> None:
    assert usage_cost(UsageMetadata(), CHAT) == 0
    flat = Price(input=2, output=8)
    assert usage_cost(UsageMetadata(prompt_tokens=10, cached_tokens=30), flat) == Decimal("0.00008")


def test_a_count_that_cannot_be_reconciled_never_gives_a_negative_cost() -> None:
    # An Azure AI Foundry stream: 7 prompt tokens beside 161 cached, kept as given.
    usage = UsageMetadata(prompt_tokens=7, cached_tokens=161, response_tokens=5)
    assert usage_cost(usage, CHAT) == Decimal("0.00026875")  # 7 × 2.50 + 161 × 1.25 + 5 × 10
    # More writes claimed than the prompt holds: at most the prompt is billed as written.
    assert usage_cost(usage, CLAUDE, cache_write_tokens=50) == Decimal("0.00014955")
    assert usage_cost(usage, CLAUDE, cache_write_tokens=-3) == usage_cost(usage, CLAUDE)
