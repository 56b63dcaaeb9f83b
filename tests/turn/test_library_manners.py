"""The library's manners, as a new user meets them: outcomes that print their names, `partial`
only for an incomplete answer, `on_text` / `on_thinking` / `on_reset` callbacks, a clear error
from asyncio, keywords through `nursery.start`, and `stream=False` on the retry ladder (the
README's examples run as written in `tests/test_readme.py`)."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import pytest
import trio
import trio.testing
from rillet import (
    Outcome,
    Policy,
    TextDelta,
    TurnRequest,
    UniEvent,
    open_turn,
    run_turn,
    user,
)
from rillet._core._dialect import Provider
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import (
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    split,
)

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "providers" / "anthropic-messages"
FRAGMENTS = ["Streams ", "break; ", "rillet ", "retries ", "and resets."]
TEXT = "".join(FRAGMENTS)
REQUEST = TurnRequest(messages=[user("hi")])
NO_WAIT = Policy(backoff_base=0.0, jitter=0.0)


def _chat(url: str) -> Provider:
    return Provider(OpenAIChatDialect(), f"{url}/v1", "m")


def _broken_then_whole() -> list[Reply]:
    stream = openai_text_stream(FRAGMENTS)
    return [
        Reply(chunks=split(stream, 40), drop_after_bytes=len(stream) // 2),
        Reply(chunks=split(stream, 40)),
    ]


def test_outcomes_print_their_names_and_keep_their_order() -> None:
    assert str(Outcome.COMPLETED) == "Completed"
    assert f"{Outcome.RESCUED}" == "Rescued"
    assert f"{Outcome.TOTAL_TIMEOUT:>14}" == "  TotalTimeout"
    assert repr(Outcome.INIT_FAILED) == "<Outcome.INIT_FAILED: 5>"
    assert int(Outcome.COMPLETED) == 0
    assert Outcome.EVENT_TIMEOUT < Outcome.FAILED < Outcome.CANCELLED
    assert Outcome.COMPLETED.name == "COMPLETED"
    assert sorted(Outcome) == list(Outcome)


async def test_a_completed_answer_after_a_retry_is_not_partial() -> None:
    async with open_loopback_provider(_broken_then_whole()) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=NO_WAIT)
    assert result.outcome is Outcome.COMPLETED
    assert result.attempts == 2
    assert result.text == TEXT
    assert not result.partial


async def test_an_answer_that_broke_off_is_partial() -> None:
    stream = openai_text_stream(FRAGMENTS)
    script = [Reply(chunks=split(stream, 40), drop_after_bytes=len(stream) // 2)]
    policy = Policy(transport_retries=0, rescue=False)
    async with open_loopback_provider(script) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=policy)
    assert not result.ok
    assert result.text
    assert TEXT.startswith(result.text)
    assert result.partial


async def test_on_text_gets_every_fragment_once_and_on_reset_marks_the_retry() -> None:
    calls: list[tuple[str, object]] = []
    async with (
        open_loopback_provider(_broken_then_whole()) as provider,
        open_turn(
            REQUEST,
            _chat(provider.url),
            policy=NO_WAIT,
            on_text=lambda text: calls.append(("text", text)),
            on_reset=lambda attempt: calls.append(("reset", attempt)),
        ) as turn,
    ):
        deltas: list[tuple[str, object]] = []
        async for item in turn.uni_events():
            if isinstance(item, UniEvent):
                deltas += [
                    ("text", c.text)
                    for c in item.content_items
                    if isinstance(c, TextDelta) and c.text
                ]
            else:
                deltas.append(("reset", item.attempt))
        result = await turn.result()
    assert result.outcome is Outcome.COMPLETED
    assert calls == deltas  # each fragment once, in order, with the reset where it happened
    assert [c for c in calls if c[0] == "reset"] == [("reset", 2)]
    after = calls[calls.index(("reset", 2)) + 1 :]
    assert "".join(str(text) for _, text in after) == TEXT == result.text


async def test_on_thinking_gets_the_reasoning_and_restarts_after_a_reset() -> None:
    path = FIXTURES / "thinking_signature.sse"
    expected = json.loads((FIXTURES / "thinking_signature.expected.json").read_text())
    thinking = "".join(e["thinking"] for e in expected if e["type"] == "thinking.delta")
    text = "".join(e["text"] for e in expected if e["type"] == "text.delta")
    size = path.stat().st_size
    script = [fixture_reply(path, drop_after_bytes=size // 2), fixture_reply(path)]
    got: dict[str, list[str]] = {"thinking": [], "text": []}

    def reset(_: int) -> None:
        got["thinking"].clear()
        got["text"].clear()

    async with open_loopback_provider(script) as provider:
        result = await run_turn(
            REQUEST,
            Provider(AnthropicDialect(), provider.url, "claude"),
            policy=NO_WAIT,
            on_text=got["text"].append,
            on_thinking=got["thinking"].append,
            on_reset=reset,
        )
    assert result.attempts == 2
    assert thinking
    assert "".join(got["thinking"]) == thinking
    assert "".join(got["text"]) == text == result.text
    assert all(got["thinking"])  # a signature-only fragment is not passed on as text


async def test_nursery_start_takes_keywords_through_functools_partial() -> None:
    seen: list[str] = []
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 40))]
    async with open_loopback_provider(script) as provider, trio.open_nursery() as nursery:
        start = functools.partial(run_turn, on_text=seen.append, policy=NO_WAIT)
        turn = await nursery.start(start, REQUEST, _chat(provider.url))
        result = await turn.result()
    assert result.text == TEXT
    assert "".join(seen) == TEXT


def test_asyncio_callers_are_told_rillet_runs_on_trio() -> None:
    provider = Provider(OpenAIChatDialect(), "http://127.0.0.1:9/v1", "m")

    async def with_run_turn() -> None:
        await run_turn(REQUEST, provider)

    async def with_open_turn() -> None:
        async with open_turn(REQUEST, provider):
            pass

    for call in (with_run_turn, with_open_turn):
        with pytest.raises(RuntimeError, match=r"rillet runs on trio.*from asyncio.*trio\.run"):
            asyncio.run(call())


async def test_stream_false_sends_non_streaming_requests_on_the_retry_ladder() -> None:
    boom = b'{"error": {"message": "try again", "type": "server_error"}}'
    script = [
        Reply(status=500, chunks=(boom,), content_type="application/json"),
        Reply(chunks=(openai_text_body(TEXT),), content_type="application/json"),
    ]
    async with open_loopback_provider(script) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=NO_WAIT, stream=False)
        bodies = [json.loads(r.body) for r in provider.requests]
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert result.attempts == 2
    assert [b["stream"] for b in bodies] == [False, False]


async def test_stream_false_reads_an_error_status_as_a_stream_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 503 is a rate limit whose `Retry-After` is waited (not a transport failure retried at
    once), and `x-should-retry: false` is one request, whether the turn streams or not."""
    busy = b'{"error": {"message": "busy", "type": "server_error"}}'
    whole = Reply(chunks=(openai_text_body(TEXT),), content_type="application/json")
    script = [
        Reply(status=503, chunks=(busy,), content_type="application/json",
              headers=(("retry-after", "7"),)),
        whole,
    ]  # fmt: skip
    async with open_loopback_provider(script) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=NO_WAIT, stream=False)
        at = [r.at for r in provider.requests]
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert len(at) == 2
    assert at[1] - at[0] == pytest.approx(7.0, abs=1e-3)
    script = [
        Reply(status=500, chunks=(busy,), content_type="application/json",
              headers=(("x-should-retry", "false"),)),
        whole,
    ]  # fmt: skip
    async with open_loopback_provider(script) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=NO_WAIT, stream=False)
        sent = len(provider.requests)
    assert result.outcome is Outcome.INIT_FAILED
    assert sent == 1
    assert result.requests == 1


async def test_stream_false_tries_a_permanent_error_once() -> None:
    refusal = b'{"error": {"message": "no", "type": "invalid_request_error"}}'
    script = [Reply(status=400, chunks=(refusal,), content_type="application/json")] * 2
    async with open_loopback_provider(script) as provider:
        result = await run_turn(REQUEST, _chat(provider.url), policy=NO_WAIT, stream=False)
        sent = len(provider.requests)
    assert result.outcome is Outcome.INIT_FAILED
    assert sent == 1
    assert result.attempts == 1
    assert not result.partial
