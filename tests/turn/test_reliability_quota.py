"""Accounts that cannot pay and the waits a body hints (RELIABILITY.md F55, F56, F58): a spent
quota, a balance or an account a provider will not serve is asked for once, however it is
said (a code, a 429, its words); a limit a wait cures is waited for as the body or the header
says; errors of no known type are judged by what they say. Each asserts what the turn cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    InvalidRequestError,
    ProviderError,
    RateLimitError,
)
from rillet._core._explain import explain
from rillet._core._policy import Outcome
from rillet.frames import SSEDecoder
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import Reply, open_loopback_provider, sse

from ..fault_support import check_loop, loop_turn, rescue_after
from ..handler_support import (
    END_OK,
    FRAGMENTS,
    NDJSON_TYPE,
    OK,
    OK_SEEN,
    ROLE,
    TEXT,
    Answer,
    anthropic_events,
    check,
    check_rate_limited_at_once,
    end_error,
    expect,
    gemini_events,
    ok,
    ollama_lines,
    play,
    policy,
    provider_for,
    rescue_ok,
    run_done,
    status,
)

if TYPE_CHECKING:
    from collections.abc import Mapping


# --- F55: a spent quota ---------------------------------------------------------------------------


def quota_body(code: str = "insufficient_quota") -> bytes:
    """OpenAI's answer to an account without credit."""
    return msgspec.json.encode(
        {
            "error": {
                "message": "You exceeded your current quota, please check your plan.",
                "type": code,
                "param": None,
                "code": code,
            }
        }
    )


@pytest.mark.parametrize(
    "headers", [{}, {"retry-after": "1"}, {"retry-after-ms": "20"}], ids=["bare", "ra", "ra-ms"]
)
async def test_f55_an_http_429_insufficient_quota_is_permanent(
    autojump_clock: trio.testing.MockClock, headers: Mapping[str, str]
) -> None:
    answer = Answer(
        status=429, body=[quota_body()], headers=headers, content_type="application/json"
    )
    run = await play([answer, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],  # no wait, no retry, no rescue: no wait cures a spent quota
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("quota_exceeded")),
        text="",
    )
    error = run.result.error
    assert isinstance(error, ProviderError)
    assert not isinstance(error, RateLimitError)
    assert (error.status, error.error_type) == (429, "insufficient_quota")
    assert run.result.retry_after is None
    assert run_done(run).requests == 1


async def test_a_request_too_large_for_the_rate_limit_is_asked_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OpenAI's 429 for a request that alone asks for more tokens than the per-minute limit:
    waiting cannot make it fit, so it is sent once, and the person is told to send less."""
    body = msgspec.json.encode(
        {
            "error": {
                "message": "Request too large for gpt-4o in organization org-x on tokens per min "
                "(TPM): Limit 30000, Requested 35364. The input or output tokens must be reduced "
                "in order to run successfully.",
                "type": "tokens",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    )
    answer = Answer(
        status=429, body=[body], headers={"retry-after": "1"}, content_type="application/json"
    )
    run = await play([answer, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("context_too_long")),
        text="",
    )
    error = run.result.error
    assert type(error) is ProviderError
    assert (error.status, error.error_type) == (429, "request_too_large")
    assert run_done(run).requests == 1
    said = explain(error, provider_for())
    assert said.startswith("the request is larger than the provider takes (429): Request too")
    assert "; it needs at least 35,364 tokens, the limit is 30,000 — send less" in said


async def test_f55_insufficient_quota_in_the_stream_is_permanent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    chunk = sse(
        {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}}
    )
    run = await play([Answer(body=[ROLE, OK[1], chunk]), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("quota_exceeded")),
        text=FRAGMENTS[0],
    )
    error = run.result.error
    assert isinstance(error, ProviderError)
    assert not isinstance(error, RateLimitError)
    assert error.error_type == "insufficient_quota"
    assert error.in_stream


async def test_f55_an_anthropic_billing_error_in_the_stream_is_permanent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = anthropic_events()
    error_event = sse(
        {"type": "error", "error": {"type": "billing_error", "message": "no credit"}},
        event="error",
    )
    run = await play(
        [Answer(body=[*events[:3], error_event]), Answer(body=events)],
        dialect=AnthropicDialect(),
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("quota_exceeded")),
        text=FRAGMENTS[0],
    )
    assert isinstance(run.result.error, ProviderError)
    assert run.result.error.error_type == "billing_error"


async def test_f55_a_plain_rate_limit_is_still_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the contrast: a 429 without a quota code waits and retries
    run = await play([status(429), ok()])
    check(
        run,
        at=[0.0, 5.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f55_insufficient_quota_over_loopback_costs_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(status=429, chunks=(quota_body(),), content_type="application/json")
    run = await loop_turn(rescue_after(reply))
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("quota_exceeded")),
        text="",
    )
    assert run.result.requests == 1


# --- F56: the body's wait hint --------------------------------------------------------------------


def gemini_429(delay: str = "37s") -> bytes:
    """Gemini's RESOURCE_EXHAUSTED with a `RetryInfo` detail."""
    return msgspec.json.encode(
        {
            "error": {
                "code": 429,
                "message": "Resource has been exhausted (e.g. check quota).",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": delay,
                    }
                ],
            }
        }
    )


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({}, 37.0),  # the body's hint wins over the default
        ({"retry-after": "2"}, 2.0),  # a header wins over the body
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "soon"}, 37.0),  # an unusable header counts as none
        ({"retry-after": "0"}, 37.0),  # so does a zero or negative one (D5)
        ({"retry-after": "-5"}, 37.0),
    ],
    ids=["body", "retry-after", "retry-after-ms", "bad-header", "zero-header", "negative-header"],
)
async def test_f56_a_gemini_429_waits_for_its_retry_info(
    autojump_clock: trio.testing.MockClock, headers: Mapping[str, str], wait: float
) -> None:
    limited = Answer(
        status=429, body=[gemini_429()], headers=headers, content_type="application/json"
    )
    run = await play([limited, Answer(body=gemini_events())], dialect=GeminiDialect())
    check(
        run,
        at=[0.0, wait],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *["D"] * 5, "usage", "done", END_OK),
        text=TEXT,
    )


class _HintedDialect(OpenAIChatDialect):
    """OpenAI Chat whose error bodies carry a wait hint (`"retry_in"` seconds), as Gemini's
    `RetryInfo` does: the handler's part of F56 whatever the dialect."""

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        error = super().error_from_response(status, headers, body)
        error.retry_after = msgspec.json.decode(body)["retry_in"]
        return error


def hinted_429(hint: float, **headers: str) -> Answer:
    body = msgspec.json.encode(
        {"error": {"message": "slow down", "type": "rate_limit_error"}, "retry_in": hint}
    )
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return Answer(status=429, body=[body], headers=named, content_type="application/json")


@pytest.mark.parametrize(
    ("hint", "wait"),
    [(37.0, 37.0), (0.0, 5.0), (-3.0, 5.0), (float("inf"), 5.0)],
    ids=["37s", "zero", "negative", "infinite"],
)
async def test_f56_the_dialects_hint_is_honoured_when_usable(
    autojump_clock: trio.testing.MockClock, hint: float, wait: float
) -> None:
    run = await play([hinted_429(hint), ok()], dialect=_HintedDialect())
    check(
        run,
        at=[0.0, wait],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f56_a_header_wins_over_the_dialects_hint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([hinted_429(37.0, retry_after="3"), ok()], dialect=_HintedDialect())
    assert run.times == pytest.approx([0.0, 3.0], abs=1e-6)
    assert run.result.outcome is Outcome.COMPLETED


async def test_f56_a_hint_over_60_s_ends_the_turn_rate_limited_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([hinted_429(61.0), ok()], dialect=_HintedDialect())
    check_rate_limited_at_once(run, 61.0)


# --- F58: `retry:` in a block that never completes ------------------------------------------------


async def test_f58_a_retry_line_in_an_unfinished_block_sets_the_reconnection_time() -> None:
    # read over real HTTP: the stream ends inside a block whose `retry:` line was whole
    body = b"retry: 1000\n\ndata: a\n\nretry: 3000\nid: 9\ndata: never dispatch"
    script = [Reply(chunks=(body[:30], body[30:]))]
    with trio.fail_after(10):
        async with open_loopback_provider(script) as server, httpx.AsyncClient() as client:
            decoder = SSEDecoder()
            events = []
            async with client.stream("GET", f"{server.url}/v1/events") as response:
                async for chunk in response.aiter_raw():
                    events += decoder.feed(chunk)
            events += decoder.close()
    assert [e.data for e in events] == ["a"]
    assert decoder.retry == 3000
    assert decoder.last_event_id == ""  # an id is committed only by a dispatch


def _error_body(**error: str) -> bytes:
    return msgspec.json.encode({"error": error})


XAI_NO_CREDIT = (
    "Your team team-1 has either used all available credits or reached its monthly spending "
    "limit. To continue making API requests, please purchase more credits or raise your "
    "spending limit."
)


@pytest.mark.parametrize(
    ("body", "error_type"),
    [
        (_error_body(code="1113", message="余额不足或无可用资源包,请充值。"), "1113"),  # Z.ai
        (_error_body(code="1112", message="Your account has been locked"), "1112"),  # Z.ai
        (
            _error_body(message="Your account is suspended", type="exceeded_current_quota_error"),
            "exceeded_current_quota_error",  # Moonshot (Kimi)
        ),
        (  # xAI: a flat body, its code a sentence, the account's state in its words
            msgspec.json.encode(
                {"code": "Some resource has been exhausted", "error": XAI_NO_CREDIT}
            ),
            "insufficient_quota",
        ),
    ],
    ids=["zai-arrears", "zai-locked", "moonshot", "xai-no-credit"],
)
async def test_f55_a_429_for_an_account_that_cannot_pay_is_permanent(
    autojump_clock: trio.testing.MockClock, body: bytes, error_type: str
) -> None:
    answer = Answer(status=429, body=[body], content_type="application/json")
    run = await play([answer, ok()], rescue=rescue_ok())
    assert run.result.outcome is Outcome.INIT_FAILED
    error = run.result.error
    assert isinstance(error, ProviderError)
    assert not isinstance(error, RateLimitError)
    assert error.error_type == error_type
    assert run_done(run).requests == 1
    assert "check its plan and billing" in explain(error, provider_for(OpenAIChatDialect()))


@pytest.mark.parametrize(
    "body",
    [
        _error_body(code="1302", message="High concurrency"),  # Z.ai's concurrency limit
        # Gemini's free tier: a per-minute limit that a wait does end, worded as a quota
        msgspec.json.encode(
            {
                "error": {
                    "code": 429,
                    "message": "You exceeded your current quota, please check your plan and "
                    "billing details.",
                    "status": "RESOURCE_EXHAUSTED",
                }
            }
        ),
    ],
    ids=["zai-concurrency", "gemini-billing-words"],
)
async def test_a_429_that_a_wait_cures_is_still_waited_for(
    autojump_clock: trio.testing.MockClock, body: bytes
) -> None:
    answer = Answer(status=429, body=[body], content_type="application/json")
    run = await play([answer, ok()])
    assert run.result.outcome is Outcome.COMPLETED
    assert run_done(run).requests == 2


@pytest.mark.parametrize(
    ("said", "requests"),
    [
        ("the input length exceeds the context length", 1),  # never fits: asked once
        ("an error was encountered while running the model: unexpected EOF", 4),  # may pass
    ],
    ids=["context", "crash"],
)
async def test_an_ollama_error_of_no_type_is_judged_by_what_it_says(
    autojump_clock: trio.testing.MockClock, said: str, requests: int
) -> None:
    lines = ollama_lines()
    broken = Answer(
        body=[lines[0], msgspec.json.encode({"error": said}) + b"\n"], content_type=NDJSON_TYPE
    )
    run = await play([broken], dialect=OllamaDialect(), pol=policy(rescue=False))
    assert run.result.outcome is Outcome.FAILED
    assert run_done(run).requests == requests
    if requests == 1:
        assert isinstance(run.result.error, InvalidRequestError)
        line = explain(run.result.error, provider_for(OllamaDialect()))
        assert "the conversation is longer than the model takes" in line
