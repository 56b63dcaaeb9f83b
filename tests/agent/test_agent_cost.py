"""What an agent run cost: every step's usage priced at the host's prices and summed, for one
model's prices or a price per model; a model with no price is an error naming it, never a cost
of nothing. The steps are a recorded OpenAI tool call, then an answer, from the loopback
provider on 127.0.0.1."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import TYPE_CHECKING

import pytest
from rillet import Price, UsageEvent

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


async def test_the_run_prices_each_step_as_it_goes_and_its_cost_is_their_sum(
    loop_clock: trio.testing.MockClock,
) -> None:
    case = CASES["openai-chat"]
    result, events, _ = await run_collect(
        [case.tool_call, case.text], tools=[get_weather], prices=GPT
    )
    assert result.ok
    costs = [Decimal(e.cost) for e in events if isinstance(e, UsageEvent) and e.cost is not None]
    assert len(costs) == 2  # one usage event per step, each with its cost
    assert sum(costs) == result.cost() == result.cost(GPT)


async def test_max_cost_stops_the_run_before_the_step_it_cannot_pay_for(
    loop_clock: trio.testing.MockClock,
) -> None:
    """The first step (a tool call) spends nearly all of the run's money: the second step's
    prompt alone would cost more than is left, so it is never sent."""
    case = CASES["openai-chat"]
    first, _, _ = await run_collect([case.tool_call, case.text], tools=[get_weather], prices=GPT)
    spent = first.turns[0].cost(GPT)
    assert spent is not None
    limit = spent + Decimal("0.000001")  # a millionth more: not the next prompt's price
    result, events, server = await run_collect(
        [case.tool_call, case.text], tools=[get_weather], prices=GPT, max_cost=limit
    )
    assert len(server.requests) == 1
    assert result.status == "error"
    assert result.code == "max_cost"
    assert events[-1].code == "max_cost"  # type: ignore[union-attr]
    assert result.cost() == spent <= limit
    # with money enough, the second step's reply is capped at what the rest buys
    roomy = spent * 3
    result, _, server = await run_collect(
        [case.tool_call, case.text], tools=[get_weather], prices=GPT, max_cost=roomy
    )
    assert result.ok
    assert len(server.requests) == 2
    bodies = [json.loads(r.body) for r in server.requests]
    caps = [b.get("max_completion_tokens", b.get("max_tokens")) for b in bodies]
    assert caps[0] > caps[1] > 0  # the second step has less left to spend
    left = roomy - spent
    assert caps[1] <= left * 10**6 / GPT.output
