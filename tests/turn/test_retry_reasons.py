"""A retry says why: the `status` event of a backoff or of the rescue carries the safe code of
the failure it follows (`reason_code`), and the terminal and the page put it in words.

The turns run against the scripted provider of `handler_support` on the mock clock; each failure
is one the transport ladder retries, and the code must name that failure, not another.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rillet import SinkBatch, StatusEvent
from rillet._core._errors import (
    FrameEncodingError,
    IncompleteStreamError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    ServerError,
    TransportError,
    TurnTimeout,
)
from rillet._core._explain import RETRY_SAID
from rillet._core._failures import RETRY_REASONS, retry_reason
from rillet._core._runevents import RunEventBuilder
from rillet.transports.sinks import TerminalSink

from ..handler_support import (
    HANG,
    Answer,
    Raise,
    Run,
    ok,
    partial,
    play,
    rescue_ok,
    status,
)

if TYPE_CHECKING:
    import trio.testing

PAGE = Path(__file__).parent.parent.parent / "transports" / "static" / "index.html"


def reasons(run: Run) -> list[tuple[str, str | None]]:
    """Each `status` event's phase and reason code."""
    return [(e.phase, e.reason_code) for e in run.events if isinstance(e, StatusEvent)]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TransportError("p", "ConnectError"), "connect_failed"),
        (TransportError("p", "ConnectTimeout"), "connect_failed"),
        (TransportError("p", "ReadError"), "connection_lost"),
        (TransportError("p", "RemoteProtocolError"), "connection_lost"),
        (IncompleteStreamError("p", ("finish_reason",)), "connection_lost"),
        (TurnTimeout("p", "per-event", 180), "stalled"),
        (TurnTimeout("p", "initial-event", 120), "stalled"),
        (OverloadedError("p", "busy", error_type="overloaded_error"), "overloaded"),
        (ServerError("p", "oops", error_type="api_error"), "server_error"),
        (ProviderError("p", "bad gateway", status=502), "server_error"),
        (ProviderError("p", "timeout", status=408), "provider_error"),
        (MalformedFrameError("not JSON", b"{", provider="p", not_json=True), "unreadable_stream"),
        (FrameEncodingError("bad UTF-8"), "unreadable_stream"),
        (None, "provider_error"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_each_failure_names_its_own_cause(error: BaseException | None, code: str) -> None:
    assert retry_reason(error) == code
    assert code in RETRY_REASONS


def test_every_reason_has_words_on_the_terminal_and_on_the_page() -> None:
    assert set(RETRY_SAID) == set(RETRY_REASONS)
    page = PAGE.read_text("utf-8")
    table = re.search(r"const REASONS = \{(.*?)\};", page, re.S)
    assert table is not None, "the page has no REASONS table"
    on_page = dict(re.findall(r'^\s*(\w+): "([^"]+)",$', table.group(1), re.M))
    assert on_page == RETRY_SAID  # the same words on the page as on the terminal


async def test_a_refused_connection_is_retried_as_connect_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([Answer(connect_error=True), ok()])
    assert run.result.ok
    assert reasons(run) == [("backing_off", "connect_failed")]


async def test_a_stream_cut_mid_answer_is_retried_as_connection_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    eof = await play([partial(2), ok()])  # EOF before the terminal event
    reset = await play([partial(2, Raise()), ok()])
    assert reasons(eof) == reasons(reset) == [("backing_off", "connection_lost")]


async def test_silence_then_the_rescue_says_stalled_each_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([Answer(body=[HANG])], rescue=rescue_ok())
    assert reasons(run) == [("backing_off", "stalled"), ("rescuing", "stalled")]


async def test_a_5xx_status_is_retried_as_server_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(502), ok()])
    assert reasons(run) == [("backing_off", "server_error")]


async def test_a_rate_limit_wait_carries_no_retry_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(429, retry_after="1"), ok()])
    assert reasons(run) == [("waiting_rate_limit", None)]


@pytest.mark.parametrize("code", [529, 503])
async def test_an_overloaded_wait_says_overloaded(
    autojump_clock: trio.testing.MockClock, code: int
) -> None:
    run = await play([status(code, retry_after="1"), ok()])
    assert reasons(run) == [("waiting_rate_limit", "overloaded")]


async def test_the_terminal_tells_an_overload_from_a_rate_limit() -> None:
    b = RunEventBuilder("run-1", lambda: 0.0)
    out, err = io.StringIO(), io.StringIO()
    sink = TerminalSink(out, err)
    await sink.deliver(SinkBatch([b.status("waiting_rate_limit", 2, 5.0, "overloaded")], []))
    await sink.deliver(SinkBatch([b.status("waiting_rate_limit", 3, 1.0)], []))
    await sink.close()
    assert err.getvalue() == "the provider is overloaded: waiting 5 s\nrate limited: waiting 1 s\n"


async def test_the_terminal_says_why_it_retries() -> None:
    b = RunEventBuilder("run-1", lambda: 0.0)
    out, err = io.StringIO(), io.StringIO()
    sink = TerminalSink(out, err)
    await sink.deliver(SinkBatch([b.status("backing_off", 2, 0.1, "connect_failed")], []))
    await sink.deliver(SinkBatch([b.status("rescuing", 3, reason="stalled")], []))
    await sink.deliver(SinkBatch([b.status("backing_off", 4, 0.2, "no_such_code")], []))
    await sink.close()
    assert err.getvalue() == (
        "retrying (attempt 2) in 0.1 s: could not connect\n"
        "retrying without streaming (attempt 3): no data came in time\n"
        "retrying (attempt 4) in 0.2 s\n"  # a code it does not know adds nothing
    )
