"""Prices from the `genai-prices` table (`rillet[prices]`): each kind of token at the table's
own rate for the model (read from the table, so a new release of its prices keeps the test
true), the provider found by its base URL or else by the model's name, a long prompt's tier,
None for a model the table does not know, and a sentence naming the extra when the package is
missing."""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import Any

import genai_prices
import pytest
from rillet import ConfigurationError, GenAIPrices, TokenUsage

M = Decimal(1_000_000)
OPENAI = "https://api.openai.com/v1"
ANTHROPIC = "https://api.anthropic.com/v1"


def rates(model: str, url: str) -> Any:
    """The table's own prices for `model` (per million tokens)."""
    usage = genai_prices.Usage(input_tokens=1, output_tokens=1)
    return genai_prices.calc_price(usage, model, provider_api_url=url).model_price


def base(price: Any) -> Decimal:
    return Decimal(getattr(price, "base", price))


def test_each_kind_is_priced_at_the_tables_rate_for_the_model() -> None:
    # OpenAI's recorded usage: 1,210 prompt tokens (1,024 cached), 86 output (64 reasoning)
    usage = TokenUsage(input=1210, cache_read=1024, output=86, reasoning=64)
    table = rates("gpt-5-mini", OPENAI)
    by_hand = (
        (1210 - 1024) * base(table.input_mtok)
        + 1024 * base(table.cache_read_mtok)
        + 86 * base(table.output_mtok)
    ) / M
    prices = GenAIPrices()
    assert prices.cost(usage, "gpt-5-mini", url=OPENAI) == by_hand
    # a loopback or gateway URL the table does not know: found by the model's name
    assert prices.cost(usage, "gpt-5-mini", url="http://127.0.0.1:9/v1") == by_hand
    assert prices.cost(usage, "no-such-model-anywhere") is None


def test_cache_writes_and_a_long_prompts_tier_are_the_tables() -> None:
    # Anthropic's recorded reply: 410 uncached input tokens, 1,200 written to the cache, 95 out
    model = "claude-sonnet-4-5-20250929"
    table = rates(model, ANTHROPIC)
    usage = TokenUsage(input=1610, cache_read=0, cache_write=1200, output=95)
    by_hand = (
        410 * base(table.input_mtok)
        + 1200 * base(table.cache_write_mtok)
        + 95 * base(table.output_mtok)
    ) / M
    prices = GenAIPrices()
    assert prices.cost(usage, model, url=ANTHROPIC) == by_hand
    tiers = getattr(table.input_mtok, "tiers", None)
    if not tiers:
        pytest.skip("the table has no tiers for this model any more")
    long = tiers[0].start + 1000
    priced = prices.cost(TokenUsage(input=long, output=0), model, url=ANTHROPIC)
    assert priced == long * Decimal(tiers[0].price) / M  # the whole prompt at the higher rate


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    with pytest.raises(ConfigurationError, match=r"rillet\[prices\]"):
        GenAIPrices()
