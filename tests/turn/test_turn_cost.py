"""What a reply cost, where a person and a bill see it: its tokens by kind (cache reads and
writes, reasoning) and its cost at the run's prices in the `usage` run event and the result,
on recorded replies from the loopback provider on 127.0.0.1; and `max_cost`, which refuses a
request the run cannot pay for (nothing sent) and caps a reply at what the rest buys."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
from rillet import (
    ConfigurationError,
    CostLimitExceeded,
    Price,
    PriceTable,
    TokenUsage,
    UsageEvent,
    encode_json,
    explain,
)
from rillet._core._dialect import Provider, Secret
from rillet._core._events import TextDone, UniMessage
from rillet._core._request import TurnRequest
from rillet._turn._api import run_turn
from rillet._turn._options import RunOptions
from rillet._turn._ratelimit import RateLimiter
from rillet.providers._registry import dialect_from_name
from rillet.transports.testing import (
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_stream,
)

from ..handler_support import KEY, REQUEST, policy
from ..wire_cases import wire_path

if TYPE_CHECKING:
    from rillet._turn._turn import TurnResult
    from rillet.transports.testing import LoopbackProvider
    from trio.testing import MockClock

LIMIT = 10
GPT = Price(input="1.25", cached_input="0.125", output="10")  # per million tokens
CLAUDE = Price(input="3", cached_input="0.30", cache_write="3.75", output="15")
M = Decimal(1_000_000)


async def events_of(
    provider: Provider, request: TurnRequest = REQUEST, **options: Any
) -> tuple[TurnResult, list[dict[str, Any]]]:
    """One turn read through its handle: its result and its run events, as JSON."""
    with trio.fail_after(LIMIT):
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            opts = RunOptions(client=client, policy=policy(), limiter=RateLimiter(), **options)

            async def start(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                await run_turn(request, provider, options=opts, task_status=task_status)

            turn = await nursery.start(start)
            events = [json.loads(encode_json(e)) async for e in turn.run_events()]
            result = await turn.result()
    return result, events


def provider_at(server: LoopbackProvider, kind: str, model: str) -> Provider:
    return Provider(dialect_from_name(kind), f"{server.url}/v1", model, api_key=Secret(KEY))


async def test_the_usage_event_keeps_every_kind_apart_and_says_the_cost() -> None:
    """OpenAI's recorded usage: 1,210 prompt tokens of which 1,024 were read from the cache,
    86 completion tokens of which 64 were reasoning."""
    reply = fixture_reply(wire_path("openai-chat", "usage_final_chunk"))
    async with open_loopback_provider([reply]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        result, events = await events_of(provider, prices=PriceTable({"gpt-5-mini": GPT}))
    assert result.ok
    (usage,) = [e for e in events if e["type"] == "usage"]
    expected = ((1210 - 1024) * GPT.input + 1024 * Decimal("0.125") + 86 * GPT.output) / M
    assert usage["cached_tokens"] == 1024
    assert usage["prompt_tokens"] == 1210 - 1024  # MMSP's counts, as they always were
    assert usage["thoughts_tokens"] == 64
    assert usage["response_tokens"] == 86 - 64
    assert Decimal(usage["cost"]) == expected  # exact, as a decimal string
    assert isinstance(usage["cost"], str)
    assert [e["type"] for e in events][-3:] == ["usage", "answer.done", "run.done"]
    assert result.usage == TokenUsage(input=1210, cache_read=1024, output=86, reasoning=64)
    assert result.charge == result.cost() == result.cost(GPT) == expected


async def test_cache_writes_are_kept_apart_and_priced_at_their_own_rate() -> None:
    """Anthropic's recorded reply (not streamed): 410 uncached input tokens and 1,200 written
    to the cache, 95 output."""
    reply = fixture_reply(wire_path("anthropic-messages", "non_streaming"))
    async with open_loopback_provider([reply]) as server:
        provider = provider_at(server, "anthropic", "claude-sonnet-4-5")
        result, events = await events_of(provider, stream=False, prices=CLAUDE)
    assert result.ok, result.error
    (usage,) = [e for e in events if e["type"] == "usage"]
    assert usage["cache_write_tokens"] == 1200
    assert usage["prompt_tokens"] == 410 + 1200
    expected = (410 * CLAUDE.input + 1200 * Decimal("3.75") + 95 * CLAUDE.output) / M
    assert Decimal(usage["cost"]) == expected
    assert result.usage == TokenUsage(input=1610, cache_read=0, cache_write=1200, output=95)
    # billing the writes at the input price as well would be 1,200 × 3 too much
    assert result.cost() == expected


async def test_without_prices_the_usage_event_has_no_cost_and_a_model_without_one_none() -> None:
    reply = fixture_reply(wire_path("openai-chat", "usage_final_chunk"))
    async with open_loopback_provider([reply, reply]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        result, events = await events_of(provider)
        (usage,) = [e for e in events if e["type"] == "usage"]
        assert "cost" not in usage
        assert result.cost() is None
        # the table has no price for the model asked, but one for the model that answered
        answered = PriceTable({"gpt-5-mini-2025-08-07": GPT})
        result, _ = await events_of(provider, prices=answered)
        assert result.cost() == result.cost(GPT)
    assert result.cost(PriceTable({"another": GPT})) is None


def _asking(words: int, max_tokens: int | None = None) -> TurnRequest:
    text = " ".join(["word"] * words)
    message = UniMessage(role="user", content_items=[TextDone(text=text)])
    return TurnRequest(messages=[message], max_tokens=max_tokens)


async def test_a_request_the_run_cannot_pay_for_is_never_sent() -> None:
    # 4,000 words cost at least 4,000 × 1.25 / 1e6 = 0.005; the run has 0.001
    async with open_loopback_provider([Reply(chunks=(openai_text_stream(["Hi"]),))]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        result, events = await events_of(
            provider, _asking(4000), prices=GPT, max_cost=Decimal("0.001")
        )
        assert server.requests == []
    assert result.requests == 0
    assert result.code == "max_cost"
    assert isinstance(result.error, CostLimitExceeded)
    assert events[-1]["type"] == "run.done"
    assert events[-1]["code"] == "max_cost"
    assert events[-1]["retryable"] is False
    assert "spend" in explain(result.error)


async def test_a_reply_is_capped_at_what_the_rest_buys_and_a_cut_says_max_cost() -> None:
    stream = openai_text_stream(["Hello", " there"], finish_reason="length")
    async with open_loopback_provider([Reply(chunks=(stream,))]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        request = _asking(8, max_tokens=100_000)
        result, events = await events_of(provider, request, prices=GPT, max_cost="0.01")
        body = json.loads(server.requests[0].body)
    # the prompt is estimated at its characters over four (and never below its words)
    prompt = max(8, len(encode_json(request.messages[0])) // 4)
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    assert cap is not None
    assert cap < 100_000
    assert abs(cap - int((Decimal("0.01") - prompt * GPT.input / M) * M / GPT.output)) <= 2
    assert result.code == "max_cost"
    assert events[-1]["code"] == "max_cost"
    assert result.text == "Hello there"  # what came is kept, as for a length cut


async def test_a_max_cost_below_the_requests_own_limit_leaves_it_alone() -> None:
    async with open_loopback_provider([Reply(chunks=(openai_text_stream(["Hi"]),))]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        result, _ = await events_of(provider, _asking(3, max_tokens=50), prices=GPT, max_cost=5)
        body = json.loads(server.requests[0].body)
    assert body.get("max_completion_tokens", body.get("max_tokens")) == 50
    assert result.code == "completed"


async def test_max_cost_without_a_price_for_the_model_is_refused_before_anything() -> None:
    async with open_loopback_provider([Reply(chunks=(openai_text_stream(["Hi"]),))]) as server:
        provider = provider_at(server, "openai", "gpt-5-mini")
        with pytest.raises(ConfigurationError, match="gpt-5-mini"):
            await run_turn(
                REQUEST, provider, prices=PriceTable({"other": GPT}), max_cost=Decimal(1)
            )
        assert server.requests == []
    with pytest.raises(ValueError, match="needs prices"):
        RunOptions(max_cost=1)


def test_usage_event_json_round_trips_its_cost_exactly() -> None:
    event = UsageEvent(run_id="r", seq=3, elapsed_ms=1, prompt_tokens=2, cost=Decimal("0.0000031"))
    data = encode_json(event)
    assert b'"cost":"0.0000031"' in data
    assert msgspec.json.decode(data, type=UsageEvent).cost == Decimal("0.0000031")


async def test_a_limited_run_sends_no_hedge_the_provider_might_bill_too(
    autojump_clock: MockClock,
) -> None:
    from rillet.transports.upstream import MemoryReply, MemoryUpstream

    from .test_hedge import EVENTS, SSE

    provider = Provider(dialect_from_name("openai"), "http://hedge.invalid/v1", "m")
    for limit, sent in ((None, 2), (Decimal(1), 1)):
        slow = MemoryReply(EVENTS, headers=SSE, delay=3.0)
        upstream = MemoryUpstream([slow, MemoryReply(EVENTS, headers=SSE)])
        with trio.fail_after(600):  # virtual time: the slow reply waits before every piece
            result = await run_turn(
                REQUEST,
                provider,
                upstream=upstream,
                policy=policy(hedge_after=1.0),
                limiter=RateLimiter(),
                prices=GPT,
                max_cost=limit,
            )
        assert result.ok
        assert len(upstream.requests) == sent, limit
