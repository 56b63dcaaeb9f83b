"""What an agent run cost: every step's usage priced at the host's prices and summed, for one
model's prices or a price per model; a model with no price is an error naming it, never a cost
of nothing. The steps are a recorded OpenAI tool call, then an answer, from the loopback
provider on 127.0.0.1."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import TYPE_CHECKING

import pytest
from rillet import Price

from ..agent_support import CASES, loop_clock
from .test_agent import get_weather, run_collect

if TYPE_CHECKING:
    import trio.testing

clock = pytest.fixture(name="loop_clock")(loop_clock)

GPT = Price(input="2", cached_input="0.5", output="8")


def _by_hand(prompt: int, cached: int, response: int) -> Decimal:
    """One step's cost per million tokens: uncached prompt, cached prompt, output."""
    return (prompt * Decimal(2) + cached * Decimal("0.5") + response * Decimal(8)) / 10**6


async def test_an_agent_runs_cost_is_every_steps_usage_at_its_prices(
    loop_clock: trio.testing.MockClock,
) -> None:
    case = CASES["openai-chat"]
    result, _, _ = await run_collect([case.tool_call, case.text], tools=[get_weather])
    assert result.ok
    assert len(result.turns) == 2
    expected = Decimal(0)
    for turn in result.turns:
        usage = turn.message.usage_metadata
        assert usage is not None
        expected += _by_hand(
            usage.prompt_tokens or 0, usage.cached_tokens or 0, usage.response_tokens or 0
        )
    assert expected > 0
    assert result.cost(GPT) == expected
    model = result.turns[0].provider.model if result.turns[0].provider else ""
    assert result.cost({model: GPT}) == expected
    with pytest.raises(KeyError, match=re.escape(model)):  # the model with no price
        result.cost({"another-model": GPT})
