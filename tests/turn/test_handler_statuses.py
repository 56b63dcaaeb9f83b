"""The stream handler, F10-F20: connection errors and error statuses, the waits they direct
and the errors in the stream (the harness: `handler_support`)."""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING

import msgspec
import pytest
import trio
from rillet import (
    RescueFailed,
    TransportError,
)
from rillet._core._policy import Outcome
from rillet._core._runevents import StatusEvent
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect

from ..handler_support import (
    END_OK,
    FRAGMENTS,
    KEY,
    NDJSON_TYPE,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    TEXT,
    WALL,
    Answer,
    anthropic_error,
    anthropic_events,
    check,
    check_rate_limited_at_once,
    end_error,
    expect,
    gemini_error,
    gemini_events,
    ok,
    ollama_error,
    ollama_lines,
    openai_error,
    play,
    rescue_ok,
    run_done,
    status,
    statuses,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    import trio.testing
    from rillet._core._dialect import Dialect


# --- F10-F20: connection errors and statuses ------------------------------------------------------

REFUSED = Answer(connect_error=True)


async def test_f10_connect_errors_back_off_then_complete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([REFUSED, REFUSED, ok()])
    check(
        run,
        at=[0.0, 0.1, 0.3],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f10_always_refused_rescue_too_is_init_failed_with_both_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([REFUSED])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("connection_failed")),
        text="",
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
    assert isinstance(error.stream_error, TransportError)
    assert error.stream_error.kind == "ConnectError"
    assert isinstance(error.rescue_error, TransportError)
    assert not run.result.partial


async def test_f11_503_waits_the_default_5_s(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([status(503)] * 3 + [ok()])
    check(
        run,
        at=[0.0, 5.0, 10.0, 15.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    assert statuses(run)[0] == ("waiting_rate_limit", 0, 5000)


async def test_f12_always_503_is_rate_limited_after_5_retries_never_rescued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(503)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 5.0, 10.0, 15.0, 20.0, 25.0],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", end_error("provider_unavailable")),
        text="",
        ended=25.0,
    )
    assert run.result.retry_after == 5.0
    assert run_done(run).retry_after_ms == 5000
    assert all(s.stream for s in run.fake.sent)


async def test_f12_always_500_rescues_with_a_non_streaming_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert run.fake.sent[4].body.get("stream") is False


async def test_f12_always_500_rescue_fails_too_is_init_failed_with_both_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500)])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("provider_unavailable")),
        text="",
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
    assert error.stream_outcome is Outcome.INIT_FAILED
    assert getattr(error.stream_error, "status", None) == 500
    assert getattr(error.rescue_error, "status", None) == 500


def http_date(at: float) -> str:
    """`at` (Unix time) as an HTTP-date."""
    return email.utils.formatdate(at, usegmt=True)


HTTP_DATES = {  # WALL + 20 s in each form HTTP accepts, all of them GMT
    "imf-fixdate": "Fri, 29 Sep 2023 16:26:57 GMT",
    "rfc850": "Friday, 29-Sep-23 16:26:57 GMT",
    "asctime": "Fri Sep 29 16:26:57 2023",
    "numeric-zone": "Fri, 29 Sep 2023 16:26:57 -0000",
}


@pytest.mark.parametrize("date", HTTP_DATES.values(), ids=HTTP_DATES.keys())
async def test_f13_an_http_date_is_gmt_whatever_the_local_zone(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, date: str
) -> None:
    monkeypatch.setenv("TZ", "JST-9")  # nine hours east of GMT: a date read as local is past
    time.tzset()
    try:
        run = await play([status(429, retry_after=date), ok()])
    finally:
        monkeypatch.undo()
        time.tzset()
    check(
        run,
        at=[0.0, 20.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "3600"}, 3600.0),
        ({"retry-after": "61"}, 61.0),
        ({"retry-after": "12345678901234567890"}, 12345678901234567890.0),
        ({"retry-after": http_date(WALL + 61)}, 61.0),
        ({"retry-after-ms": "60001"}, 60.001),
    ],
    ids=["3600", "61", "20-digits", "date-61s", "ms-60001"],
)
async def test_f14_a_wait_over_60_s_is_rate_limited_at_once(
    autojump_clock: trio.testing.MockClock, headers: dict[str, str], wait: float
) -> None:
    run = await play([status(429, **headers), ok()], rescue=rescue_ok())
    check_rate_limited_at_once(run, wait)
    msgspec.json.encode(run.events)  # every run event still serialises


async def test_f14_a_wait_of_exactly_60_s_is_waited(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([status(429, retry_after="60"), ok()])
    check(
        run,
        at=[0.0, 60.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


def first_delta_then(dialect: str, error: bytes) -> tuple[Dialect, Answer, Answer]:
    """A stream of `dialect` that sends one delta then `error`, and its `ok` stream."""
    if dialect == "openai":
        return OpenAIChatDialect(), Answer(body=[*OK[:2], error]), ok()
    if dialect == "anthropic":
        events = anthropic_events()
        return AnthropicDialect(), Answer(body=[*events[:3], error]), Answer(body=events)
    if dialect == "gemini":
        events = gemini_events()
        return GeminiDialect(), Answer(body=[events[0], error]), Answer(body=events)
    lines = ollama_lines()
    return (
        OllamaDialect(),
        Answer(body=[lines[0], error], content_type=NDJSON_TYPE),
        Answer(body=lines, content_type=NDJSON_TYPE),
    )


SERVER_SIDE = [
    ("anthropic", anthropic_error("overloaded_error")),
    ("anthropic", anthropic_error("api_error")),
    ("openai", openai_error("server_error")),
    ("gemini", gemini_error(503, "UNAVAILABLE")),
    ("gemini", gemini_error(500, "INTERNAL")),
    ("ollama", ollama_error()),
]


@pytest.mark.parametrize(
    ("dialect", "error"), SERVER_SIDE, ids=[f"{d}-{i}" for i, (d, _) in enumerate(SERVER_SIDE)]
)
async def test_f17_in_stream_overloaded_or_server_error_resets_and_retries(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], dialect=wire)
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )
    # the retry names the provider's side: overloaded where it said so (Anthropic's type,
    # Gemini's UNAVAILABLE), a server error where it said that, and Ollama says no more
    said = [e.reason_code for e in run.events if isinstance(e, StatusEvent)]
    if b"overloaded" in error or b"UNAVAILABLE" in error:
        assert said == ["overloaded"]
    elif dialect == "ollama":
        assert said == ["provider_error"]
    else:
        assert said == ["server_error"]


RATE_IN_STREAM = [
    ("anthropic", anthropic_error("rate_limit_error")),
    ("openai", openai_error("rate_limit_exceeded")),
    ("gemini", gemini_error(429, "RESOURCE_EXHAUSTED")),
]


@pytest.mark.parametrize(("dialect", "error"), RATE_IN_STREAM, ids=[d for d, _ in RATE_IN_STREAM])
async def test_f17_in_stream_rate_limit_waits_5_s(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], dialect=wire)
    check(
        run,
        at=[0.0, 5.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


INVALID_IN_STREAM = [
    ("anthropic", anthropic_error("invalid_request_error")),
    ("openai", openai_error("invalid_request_error")),
    ("gemini", gemini_error(400, "INVALID_ARGUMENT")),
]


@pytest.mark.parametrize(
    ("dialect", "error"), INVALID_IN_STREAM, ids=[d for d, _ in INVALID_IN_STREAM]
)
async def test_f17_in_stream_invalid_request_fails_keeping_the_delta(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], rescue=rescue_ok(), dialect=wire)
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("invalid_request")),
        text=FRAGMENTS[0],
    )
    assert run.result.partial


@pytest.mark.parametrize(
    ("code", "safe"),
    [
        (401, "authentication_failed"),
        (400, "invalid_request"),
        (403, "permission_denied"),
        (404, "model_not_found"),
        (409, "provider_error"),
        (422, "invalid_request"),
    ],
)
async def test_f18_permanent_statuses_fail_at_once_and_leak_nothing(
    autojump_clock: trio.testing.MockClock, code: int, safe: str
) -> None:
    run = await play([status(code), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error(safe)),
        text="",
        ended=0.0,
    )
    wire = msgspec.json.encode(run.events)
    assert KEY.encode() not in wire
    assert b"upstream said" not in wire
    assert getattr(run.result.error, "status", None) == code


async def test_f19_should_retry_false_on_503_is_rate_limited_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(503, x_should_retry="false"), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", end_error("provider_unavailable")),
        text="",
    )


async def test_f19_should_retry_true_on_401_takes_the_transport_ladder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(401, x_should_retry="true")])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("authentication_failed")),
        text="",
    )
    assert not run.fake.sent[4].stream


async def test_f19_should_retry_true_on_401_then_ok_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(401, x_should_retry="true"), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
