"""One safe code per cause: a real provider on loopback answers with the status and body that
cause each code, and the run's `run.done` carries it, in the run events and in the JSON Lines
sink's file alike, with whether retrying can help. A chain and an agent end with the same code
their failing step's turn did."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
from rillet import (
    RUN_CODES,
    AnswerDelta,
    CallbackSink,
    Policy,
    RunDone,
    TurnRequest,
    decode_run_event,
    encode_json,
    open_agent,
    open_turn,
    run_agent,
    run_turn,
    user,
)
from rillet.providers import OpenAIChatDialect, Provider, Secret
from rillet.transports.sinks import JSONLSink
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    refused_url,
    status_reply,
)

if TYPE_CHECKING:
    import trio.testing

API_KEY = "sk-test-0123456789abcdef"


def provider(url: str) -> Provider:
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{url}/v1",
        model="gpt-4o-mini",
        api_key=Secret(API_KEY),
    )


def error(message: str, kind: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": kind, "code": code}}


NEVER = "3600"  # a wait past the longest the turn takes: the turn ends at once

CASES: list[tuple[str, Reply, str]] = [
    ("401", status_reply(401, body=error("Incorrect API key provided")), "authentication_failed"),
    (
        "400-key-not-valid",  # Gemini's way of refusing a key
        status_reply(
            400,
            body={
                "error": {
                    "code": 400,
                    "message": "API key not valid. Please pass a valid API key.",
                    "status": "INVALID_ARGUMENT",
                }
            },
        ),
        "authentication_failed",
    ),
    ("403", status_reply(403, body=error("no access", "permission_error")), "permission_denied"),
    (
        "404-model",
        status_reply(
            404,
            body=error("The model `x` does not exist", "invalid_request_error", "model_not_found"),
        ),
        "model_not_found",
    ),
    (
        "400",
        status_reply(400, body=error("bad temperature", "invalid_request_error")),
        "invalid_request",
    ),
    ("422", status_reply(422, body={"detail": [{"msg": "field required"}]}), "invalid_request"),
    (
        "400-context",
        status_reply(
            400,
            body=error(
                "This model's maximum context length is 8192 tokens",
                "invalid_request_error",
                "context_length_exceeded",
            ),
        ),
        "context_too_long",
    ),
    (
        "429-quota",
        status_reply(
            429,
            body=error(
                "You exceeded your current quota", "insufficient_quota", "insufficient_quota"
            ),
        ),
        "quota_exceeded",
    ),
    ("402", status_reply(402, body=error("Insufficient credits")), "quota_exceeded"),
    ("429", status_reply(429, retry_after=NEVER), "rate_limited"),
    ("500", status_reply(500), "provider_unavailable"),
    ("503", status_reply(503, retry_after=NEVER), "provider_unavailable"),
    (
        "529",
        status_reply(529, body=error("Overloaded", "overloaded_error"), retry_after=NEVER),
        "provider_unavailable",
    ),
    (
        "400-content-policy",
        status_reply(
            400, body=error("rejected", "invalid_request_error", "content_policy_violation")
        ),
        "content_filtered",
    ),
    (
        "withheld-answer",  # Azure's: a reply with no text, stopped by its content filter
        Reply(chunks=(openai_text_stream([], finish_reason="content_filter"),)),
        "content_filtered",
    ),
    ("409", status_reply(409, body=error("conflict")), "provider_error"),
]


async def run_collected(url: str) -> tuple[RunDone, list[RunDone], Any]:
    """One turn against `url`: its last run event, the `run.done` lines of its JSONL file, its
    result."""
    file = io.BytesIO()
    seen: list[Any] = []
    result = await run_turn(
        TurnRequest(messages=[user("Hi")]),
        provider(url),
        sinks=[JSONLSink(file), CallbackSink(seen.append)],
        policy=Policy(rescue=False),
    )
    lines = [decode_run_event(line) for line in file.getvalue().splitlines()]
    done = [e for e in lines if isinstance(e, RunDone)]
    assert lines == seen
    last = seen[-1]
    assert isinstance(last, RunDone)
    return last, done, result


@pytest.mark.parametrize(("name", "reply", "code"), CASES, ids=[c[0] for c in CASES])
async def test_each_cause_ends_the_run_with_its_own_code(
    loop_clock: trio.testing.MockClock, name: str, reply: Reply, code: str
) -> None:
    async with open_loopback_provider([reply]) as loopback:
        last, done, result = await run_collected(loopback.url)
    assert (last.status, last.code) == ("error", code)
    assert done == [last]  # the JSON Lines file says the same, once
    assert last.retryable is RUN_CODES[code].retryable
    assert result.code == code
    assert last.requests == result.requests >= 1


async def test_a_refused_connection_is_connection_failed(
    loop_clock: trio.testing.MockClock,
) -> None:
    last, done, result = await run_collected(refused_url())
    assert (last.status, last.code, last.retryable) == ("error", "connection_failed", True)
    assert done == [last]
    assert last.attempts == result.attempts > 1  # retried before giving up


async def test_no_provider_words_reach_the_run_events(loop_clock: trio.testing.MockClock) -> None:
    said = f"Incorrect API key provided: {API_KEY}"
    file = io.BytesIO()
    async with open_loopback_provider([status_reply(401, body=error(said))]) as loopback:
        await run_turn(
            TurnRequest(messages=[user("Hi")]), provider(loopback.url), sinks=[JSONLSink(file)]
        )
    assert b"authentication_failed" in file.getvalue()
    assert b"Incorrect" not in file.getvalue()
    assert API_KEY.encode() not in file.getvalue()


async def test_a_chain_ends_with_the_code_of_the_provider_that_ended_it(
    loop_clock: trio.testing.MockClock,
) -> None:
    seen: list[Any] = []
    async with (
        open_loopback_provider([status_reply(429, retry_after=NEVER)]) as first,
        open_loopback_provider([status_reply(403)]) as second,
    ):
        result = await run_turn(
            TurnRequest(messages=[user("Hi")]),
            [provider(first.url), provider(second.url)],
            sinks=[CallbackSink(seen.append)],
        )
    assert (seen[-1].code, seen[-1].retryable) == ("permission_denied", False)
    assert result.code == "permission_denied"
    assert len(second.requests) == 1  # the chain went on past the rate-limited first


async def test_an_agent_ends_with_its_failing_steps_code(
    loop_clock: trio.testing.MockClock,
) -> None:
    seen: list[Any] = []
    async with open_loopback_provider([status_reply(404)]) as loopback:
        result = await run_agent(
            TurnRequest(messages=[user("Hi")]),
            provider(loopback.url),
            sinks=[CallbackSink(seen.append)],
        )
    assert (result.status, result.code) == ("error", "model_not_found")
    assert (seen[-1].code, seen[-1].attempts, seen[-1].requests) == ("model_not_found", 1, 1)


@pytest.mark.parametrize("kind", ["turn", "chain", "agent"])
async def test_a_run_stopped_mid_answer_says_what_it_cost(kind: str) -> None:
    """Stopped while its provider streams, a run's `run.done` still carries its attempts and
    requests: the step (or the provider) that was answering counts."""
    stalled = Reply(chunks=(openai_text_stream(["Hello"]),), stall_after=1)
    seen: list[Any] = []
    async with open_loopback_provider([stalled]) as loopback:
        answering = provider(loopback.url)
        request = TurnRequest(messages=[user("Hi")])
        opened = (
            open_agent(request, answering)
            if kind == "agent"
            else open_turn(request, [answering, answering] if kind == "chain" else answering)
        )
        async with opened as run:
            async for event in run.run_events():
                seen.append(event)
                if isinstance(event, AnswerDelta):
                    run.cancel()
    last = seen[-1]
    assert isinstance(last, RunDone)
    assert (last.status, last.code, last.retryable) == ("cancelled", "cancelled", True)
    assert (last.attempts, last.requests) == (1, 1)
    wire = encode_json(last)
    assert b'"attempts":1' in wire
    assert b'"requests":1' in wire
