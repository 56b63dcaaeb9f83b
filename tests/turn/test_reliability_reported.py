"""What a provider reports goes to a person as its cause, asked for no more often than it can
help (RELIABILITY.md S50-S54): an SSE stream's `error:` line (S50), a rate limit the request
alone exceeds (S51), a wait past the turn's deadline (S52). Each asserts what the turn cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest
from rillet import InvalidRequestError, ProviderError, RateLimitError, TurnRequest, user
from rillet._core._budget import least_tokens
from rillet._core._explain import explain
from rillet._core._policy import Outcome
from rillet._core._runevents import StatusEvent
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.transports.testing import Reply

from ..fault_support import check_loop, loop_turn, rescue_after
from ..handler_support import (
    END_OK,
    FRAGMENTS,
    OK,
    ROLE,
    TEXT,
    Answer,
    Run,
    anthropic_events,
    check,
    check_rate_limited_at_once,
    end_error,
    expect,
    gemini_events,
    ok,
    play,
    policy,
    provider_for,
    rescue_ok,
    run_done,
)

if TYPE_CHECKING:
    import trio.testing

# --- S50: an `error:` line in an SSE stream -------------------------------------------------------

CONTEXT_LINE = (
    b'error: {"code":400,"message":"the request exceeds the available context size. try'
    b' increasing the context size or enable context shift","type":"invalid_request_error"}\n\n'
)
"""llama.cpp's server (builds through 2025) ending a stream whose prompt overflows its context:
an SSE field of its own, then `data: [DONE]`."""
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "line-alone"])
async def test_s50_a_context_overflow_on_an_error_line_is_asked_for_once(
    autojump_clock: trio.testing.MockClock, cut: bool
) -> None:
    body = [ROLE, CONTEXT_LINE, DONE] if cut else [ROLE + CONTEXT_LINE + DONE]
    run = await play([Answer(body=body), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,  # the role chunk came first
        saw=expect("start", end_error("context_too_long")),
        text="",
    )
    error = run.result.error
    assert isinstance(error, InvalidRequestError)
    assert error.in_stream
    assert error.status == 400
    said = explain(error, provider_for())
    assert said.startswith("the conversation is longer than the model takes (400): the request")
    assert "— shorten it" in said


async def test_s50_an_error_line_after_text_ends_the_turn_with_its_words(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # llama-box and GPUStack: `{"detail": ...}`; what it says is the cause a person reads
    line = b'error: {"detail": "the slot was released: the prompt is too long"}\n\n'
    run = await play([Answer(body=[ROLE, OK[1], line, DONE]), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("context_too_long")),
        text=FRAGMENTS[0],
    )
    assert "the prompt is too long" in explain(run.result.error, provider_for())


async def test_s50_an_error_line_of_plain_words_is_a_provider_error_that_says_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # nothing says it is deterministic: retried as any in-stream error of no known type
    line = b"error: the server lost its slot\n\n"
    run = await play([Answer(body=[ROLE, line, DONE]), ok()])
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.requests == 2
    said = [e.reason_code for e in run.events if isinstance(e, StatusEvent)]
    assert said == ["provider_error"]  # not `connection_lost`: a cause, not a cut stream


async def test_s50_an_error_line_over_loopback_costs_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(chunks=(ROLE, CONTEXT_LINE, DONE), content_type="text/event-stream")
    run = await loop_turn(rescue_after(reply))
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,  # the role chunk came first
        saw=expect("start", end_error("context_too_long")),
        text="",
    )
    assert run.result.requests == 1
    error = run.result.error
    assert isinstance(error, ProviderError)
    assert "exceeds the available context size" in error.provider_message
    assert run_done(run).code == "context_too_long"


# --- S51: a rate limit the request alone exceeds --------------------------------------------------

# a prompt of 650,000 words: at least 650,000 tokens by any provider's count
LARGE = TurnRequest(messages=[user("lorem ipsum dolor sit amet " * 130_000)])


def gemini_input_tokens_429(quota: int = 250_000, delay: str = "48.9s") -> bytes:
    """Gemini's 429 for a per-minute quota on input tokens, in the shape the service sends (its
    message, `Help`, a `QuotaFailure` naming the input-token metric and its `quotaValue`, and
    `RetryInfo`), as public logs of it record it."""
    metric = "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count"
    return msgspec.json.encode(
        {
            "error": {
                "code": 429,
                "message": "You exceeded your current quota, please check your plan and billing"
                " details. For more information on this error, head to: https://ai.google.dev/"
                f"gemini-api/docs/rate-limits.\n* Quota exceeded for metric: {metric}, limit:"
                f" {quota}, model: gemini-2.5-flash-lite\nPlease retry in {delay}.",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.Help",
                        "links": [{"description": "Learn more about Gemini API quotas"}],
                    },
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [
                            {
                                "quotaMetric": metric,
                                "quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier",
                                "quotaDimensions": {
                                    "location": "global",
                                    "model": "gemini-2.5-flash-lite",
                                },
                                "quotaValue": str(quota),
                            }
                        ],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
                ],
            }
        }
    )


def _asked_once(run: Run) -> None:
    """One request, no wait, no rescue: the turn ended on a request too large for the limit."""
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("context_too_long")),
        text="",
    )


def _limited(body: bytes, **headers: str) -> Answer:
    """A 429 with `body` and these headers (`_` for `-` in their names)."""
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return Answer(status=429, body=[body], headers=named, content_type="application/json")


async def test_s51_a_gemini_quota_on_input_tokens_below_the_request_is_asked_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # before: six requests and 244.5 s of waiting, then RATE_LIMITED with no cause
    run = await play(
        [_limited(gemini_input_tokens_429()), Answer(body=gemini_events())],
        dialect=GeminiDialect(),
        request=LARGE,
    )
    _asked_once(run)
    error = run.result.error
    assert type(error) is ProviderError  # no longer a rate limit: no wait cures it
    assert (error.status, error.error_type) == (429, "request_too_large")
    assert (error.token_limit, error.tokens_needed) == (250_000, least_tokens(LARGE))
    assert isinstance(error.__cause__, RateLimitError)
    said = explain(error, provider_for(GeminiDialect()))
    assert said.startswith("the request is larger than the provider takes (429): You exceeded")
    needs = least_tokens(LARGE)
    assert needs == 650_000
    assert f"it needs at least {needs:,} tokens, the limit is 250,000 — send less" in said
    assert not run_done(run).retryable


async def test_s51_the_same_quota_is_waited_for_by_a_request_it_admits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the contrast: a small request under the same quota waits as RetryInfo says
    run = await play(
        [_limited(gemini_input_tokens_429()), Answer(body=gemini_events())],
        dialect=GeminiDialect(),
    )
    check(
        run,
        at=[0.0, 48.9],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*5", "usage", "done", END_OK),
        text=TEXT,
    )


FOUNDRY_TOKENS = (
    b'{"error":{"code":"RateLimitReached","message":"Rate limit of 40000 per 60s exceeded for'
    b' UserByModelByMinuteTokens. Please wait 60 seconds before retrying.","details":"Rate limit'
    b" of 40000 per 60s exceeded for UserByModelByMinuteTokens. Please wait 60 seconds before"
    b' retrying."}}'
)
"""Azure AI Foundry's 429 for its per-minute token limit (microsoft/foundry-dev-tools#222)."""
AZURE_TOKENS = msgspec.json.encode(
    {
        "error": {
            "code": "429",
            "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API"
            " version 2024-10-21 have exceeded token rate limit of your current AIServices S0"
            " pricing tier. Please retry after 60 seconds.",
        }
    }
)
"""Azure OpenAI's 429 for its token rate limit: the limit is in its `x-ratelimit-limit-tokens`
header, not its words."""
ANTHROPIC_TOKENS = msgspec.json.encode(
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization of 20,000"
            " input tokens per minute. For details, refer to: https://docs.anthropic.com/en/api/"
            "rate-limits. You can see the response headers for current usage. Please reduce the"
            " prompt length or the maximum tokens requested, or try again later.",
        },
    }
)


@pytest.mark.parametrize(
    ("answer", "dialect", "limit"),
    [
        (_limited(FOUNDRY_TOKENS, retry_after="60"), None, 40_000),
        (
            _limited(AZURE_TOKENS, retry_after="60", x_ratelimit_limit_tokens="450000"),
            None,
            450_000,
        ),
        (_limited(ANTHROPIC_TOKENS, retry_after="30"), AnthropicDialect(), 20_000),
    ],
    ids=["azure-foundry-words", "azure-openai-header", "anthropic-words"],
)
async def test_s51_a_token_rate_limit_the_request_alone_exceeds_is_asked_once(
    autojump_clock: trio.testing.MockClock,
    answer: Answer,
    dialect: AnthropicDialect | None,
    limit: int,
) -> None:
    # a request of 650,000 tokens or more against a limit below it: before, six requests
    run = await play([answer, ok()], dialect=dialect, request=LARGE, rescue=rescue_ok())
    _asked_once(run)
    error = run.result.error
    assert isinstance(error, ProviderError)
    assert (error.error_type, error.token_limit) == ("request_too_large", limit)
    assert f"the limit is {limit:,} — send less" in explain(error, provider_for(dialect))


@pytest.mark.parametrize(
    ("answer", "dialect"),
    [
        (_limited(FOUNDRY_TOKENS, retry_after="6"), None),
        (_limited(AZURE_TOKENS, retry_after="6", x_ratelimit_limit_tokens="450000"), None),
        (_limited(ANTHROPIC_TOKENS, retry_after="6"), AnthropicDialect()),
    ],
    ids=["azure-foundry-words", "azure-openai-header", "anthropic-words"],
)
async def test_s51_a_token_rate_limit_a_small_request_fits_is_waited_for(
    autojump_clock: trio.testing.MockClock, answer: Answer, dialect: AnthropicDialect | None
) -> None:
    body = anthropic_events() if dialect is not None else OK
    run = await play([answer, Answer(body=body)], dialect=dialect)
    assert run.result.outcome is Outcome.COMPLETED
    assert run.times == [0.0, 6.0]


async def test_s51_a_gemini_quota_below_the_request_over_loopback_costs_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(status=429, chunks=(gemini_input_tokens_429(),), content_type="application/json")
    run = await loop_turn([reply, reply], dialect=GeminiDialect(), request=LARGE)
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("context_too_long")),
        text="",
    )
    assert run.result.requests == 1


# --- S52: a wait the turn cannot afford -----------------------------------------------------------


async def test_s52_a_wait_past_the_deadline_ends_the_turn_at_once_saying_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [_limited(gemini_input_tokens_429()), Answer(body=gemini_events())],
        dialect=GeminiDialect(),
        pol=policy(total_timeout=30.0),
    )
    check_rate_limited_at_once(run, 48.9)
    error = run.result.error
    assert isinstance(error, RateLimitError)
    assert error.time_left == pytest.approx(30.0)
    said = explain(error, provider_for(GeminiDialect()))
    assert said.endswith(
        "Please retry in 48.9s; the provider asked to wait 48.9 s, more than the 30 s the turn"
        " had left — ask again after the wait, or raise --total-timeout"
    )


async def test_s52_a_wait_past_the_longest_a_turn_takes_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Azure's daily quota: `Please retry after 86400 seconds`
    run = await play([_limited(AZURE_TOKENS, retry_after="86400"), ok()])
    check_rate_limited_at_once(run, 86400.0)
    said = explain(run.result.error, provider_for())
    assert said.endswith(
        "; the provider asked to wait 86400 s, longer than a turn waits (60 s) — ask again once"
        " that time has passed"
    )
