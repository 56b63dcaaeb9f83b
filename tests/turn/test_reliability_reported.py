"""What a provider reports goes to a person as its cause, asked for no more often than it can
help (RELIABILITY.md S50-S54): an SSE stream's `error:` line (S50), a rate limit the request
alone exceeds (S51), a wait past the turn's deadline (S52). Each asserts what the turn cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from rillet import InvalidRequestError, ProviderError
from rillet._core._explain import explain
from rillet._core._policy import Outcome
from rillet._core._runevents import StatusEvent
from rillet.transports.testing import Reply

from ..fault_support import check_loop, loop_turn, rescue_after
from ..handler_support import (
    FRAGMENTS,
    OK,
    ROLE,
    Answer,
    check,
    end_error,
    expect,
    ok,
    play,
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
