"""Usage and cost on every real recording that completes: the tokens by kind that rillet reports
(`TurnResult.usage`, the `usage` run event) are those the provider's own usage object states,
read here independently from the recorded frames by each provider's documented meaning, and the
cost is that usage at a price whose every kind differs (so a token priced as the wrong kind, or
twice, shows). Never a negative count, never a negative cost.

The providers' meanings: Anthropic's `input_tokens` leave out the cache's reads and writes;
OpenAI's `prompt_tokens` / `input_tokens` include the cached ones and the completion includes the
reasoning; Gemini's `promptTokenCount` includes the cached content and `candidatesTokenCount`
leaves out the thoughts; Ollama counts the prompt and the reply. Where a compatible server's
counts contradict themselves (more cached tokens than the prompt held), no count is negative and
the reads are kept as stated.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
from rillet import Policy, Price, TokenUsage, TurnRequest, UsageEvent, run_turn, user
from rillet.providers import Provider, dialect_from_name
from rillet.transports.replay import ReplayTransport

from .test_real_corpus import EXPECTED, REAL, cases

if TYPE_CHECKING:
    from trio.testing import MockClock

PRICE = Price(input="3", cached_input="0.3", cache_write="3.75", output="15")
COMPLETED = sorted(
    rel
    for rel, e in EXPECTED.items()
    if e["expect"] == "completed" and not rel.endswith(".json")  # streamed recordings
)


def _frames(rel: str) -> list[dict[str, Any]]:
    """Every JSON object the recording carries, in order (SSE `data:` lines, NDJSON lines)."""
    out = []
    for raw in (REAL / rel).read_text("utf-8").splitlines():
        line = raw.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _stated(rel: str) -> TokenUsage | None:
    """The usage the recording states, by its provider's documented meaning; None if none."""
    kind = rel.split("/")[0]
    frames = _frames(rel)
    if kind == "anthropic-messages":
        fields: dict[str, int] = {}
        for frame in frames:
            usage = frame.get("usage") or (frame.get("message") or {}).get("usage")
            if isinstance(usage, dict):
                fields.update({k: v for k, v in usage.items() if _int(v) is not None})
        if not fields:
            return None
        read = fields.get("cache_read_input_tokens", 0)
        written = fields.get("cache_creation_input_tokens", 0)
        details: dict[str, Any] = {}
        for frame in frames:  # the thinking share of the output, where the reply says it
            usage = frame.get("usage") or (frame.get("message") or {}).get("usage") or {}
            details.update(usage.get("output_tokens_details") or {})
        return TokenUsage(
            input=fields.get("input_tokens", 0) + read + written,
            cache_read=read,
            cache_write=written,
            output=fields.get("output_tokens"),
            reasoning=_int(details.get("thinking_tokens")),
        )
    if kind == "openai-chat":
        usages = [  # Groq's is in its own `x_groq` object
            u
            for f in frames
            for u in (f.get("usage"), (f.get("x_groq") or {}).get("usage"))
            if isinstance(u, dict)
        ]
        if not usages:
            return None
        usage = usages[-1]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        reasoning = _int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))
        prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        output = completion
        # xAI counts the reasoning beside the completion: its total says so
        if reasoning and usage.get("total_tokens") == (prompt or 0) + (completion or 0) + reasoning:
            output = (completion or 0) + reasoning
        return TokenUsage(input=prompt, cache_read=_int(cached), output=output, reasoning=reasoning)
    if kind == "openai-responses":
        done = [
            f["response"]["usage"]
            for f in frames
            if isinstance(f.get("response"), dict) and isinstance(f["response"].get("usage"), dict)
        ]
        if not done:
            return None
        usage = done[-1]
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
        return TokenUsage(
            input=_int(usage.get("input_tokens")),
            cache_read=_int(cached),
            output=_int(usage.get("output_tokens")),
            reasoning=_int(reasoning),
        )
    if kind == "gemini":
        metas = [f["usageMetadata"] for f in frames if isinstance(f.get("usageMetadata"), dict)]
        if not metas:
            return None
        meta = metas[-1]
        thoughts = _int(meta.get("thoughtsTokenCount"))
        candidates = _int(meta.get("candidatesTokenCount"))
        return TokenUsage(
            input=_int(meta.get("promptTokenCount")),
            cache_read=_int(meta.get("cachedContentTokenCount")),
            output=None
            if candidates is None and thoughts is None
            else (candidates or 0) + (thoughts or 0),
            reasoning=thoughts,
        )
    if kind == "ollama-chat":
        last = [f for f in frames if f.get("done") is True]
        if not last:
            return None
        return TokenUsage(
            input=_int(last[-1].get("prompt_eval_count")),
            output=_int(last[-1].get("eval_count")),
        )
    raise AssertionError(f"no reader for {kind}")


def _same(stated: int | None, reported: int | None) -> bool:
    """A count not stated may be reported as nothing or none."""
    return (stated or 0) == (reported or 0)


async def _replayed(rel: str) -> tuple[Any, list[UsageEvent]]:
    transport = ReplayTransport(REAL / rel, chunk_size=256, status=200)
    provider = Provider(dialect_from_name(rel.split("/")[0]), "http://replay.invalid", "replay")
    async with httpx.AsyncClient(transport=transport) as client, trio.open_nursery() as nursery:

        async def start(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await run_turn(
                TurnRequest(messages=[user("replay")]),
                provider,
                client=client,
                policy=Policy(),
                prices=PRICE,
                task_status=task_status,
            )

        turn = await nursery.start(start)
        events = [e async for e in turn.run_events() if isinstance(e, UsageEvent)]
        result = await turn.result()
    return result, events


@pytest.mark.parametrize("rel", cases(COMPLETED))
async def test_the_usage_and_cost_of_a_real_recording_are_what_its_provider_stated(
    rel: str, autojump_clock: MockClock
) -> None:
    result, events = await _replayed(rel)
    assert result.ok, (rel, result.error)
    stated = _stated(rel)
    reported = result.usage
    if stated is None:
        assert reported is None or not any(msgspec.structs.astuple(reported)), rel
        return
    assert reported is not None, rel
    for count in msgspec.structs.astuple(reported):
        assert count is None or count >= 0, (rel, reported)
    prompt_read = (stated.cache_read or 0) > (stated.input or 0)  # a self-contradicting server
    for kind in ("cache_read", "cache_write", "output", "reasoning"):
        assert _same(getattr(stated, kind), getattr(reported, kind)), (rel, kind, stated, reported)
    if prompt_read:
        assert (reported.input or 0) >= (reported.cache_read or 0), (rel, reported)
    else:
        assert _same(stated.input, reported.input), (rel, stated, reported)
        assert result.cost() == PRICE.charge(stated), rel
    (event,) = events
    assert event.cost == result.cost() == result.charge, rel
    assert event.cost is not None
    assert event.cost >= 0, rel
