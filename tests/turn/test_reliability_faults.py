"""Faults of the catalogue (RELIABILITY.md F02-F45) written once, as data: each `Scenario` of
the table is played by both runners, in memory in virtual time (`httpx.MockTransport`) and
over real sockets to the loopback provider (`scenario_support`); then the loopback-only ones
that need a client or a cancel of their own (F10, F30, F31, F46; the harness: `fault_support`).
"""

from __future__ import annotations

import email.utils
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from rillet import FrameTooLarge, TurnTimeout
from rillet._core._policy import Outcome
from rillet._core._runevents import StatusEvent
from rillet.transports.testing import (
    LoopbackProvider,
    Reply,
    openai_text_body,
    openai_text_stream,
    refused_url,
    split,
    status_reply,
)

from ..fault_support import (
    check_loop,
    loop_turn,
    rescue_after,
)
from ..handler_support import (
    END_CANCELLED,
    END_OK,
    END_RATE,
    END_TIMEOUT,
    FRAGMENTS,
    MULTIBYTE,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    ROLE,
    TEXT,
    WALL,
    check_envelope,
    end_error,
    expect,
    ollama_lines,
    openai_error,
    policy,
    seen,
)
from ..scenario_support import RUNNERS, Scenario, runner_clock

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rillet._turn._turn import Turn

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

OK_REPLY = Reply(chunks=tuple(OK))
NDJSON = "application/x-ndjson"


def ollama_reply(lines: Sequence[bytes], **fields: Any) -> Reply:
    return Reply(chunks=tuple(lines), content_type=NDJSON, **fields)


BAD_FRAME = b'data: {"delta": "x"\n\n'
SILENT_REPLY = Reply(chunks=tuple(OK), stall_after=0)  # headers, then nothing
WITHHELD = Reply(stall_headers=True)  # not even the headers
RESCUE_SEEN = ("D", "usage", "done")
HTML_REPLY = Reply(chunks=(b"<html><body>Bad gateway</body></html>",), content_type="text/html")
OVERSIZED = b"data: " + b"x" * 70_000 + b"\n\n"
UNUSABLE_RETRY_AFTER = {
    "soon": "soon",
    "inf": "inf",
    "nan": "nan",
    "negative": "-10",
    "zero": "0",
    "empty": "",
    "bad-date": "Fri, 32 Sep 2023 99:99:99 GMT",
}


def http_date(at: float) -> str:
    """`at` (Unix time) as an HTTP-date."""
    return email.utils.formatdate(at, usegmt=True)


SERVER_SAYS_WAIT: list[tuple[str, dict[str, Any], float]] = [
    # F13: a 429's retry headers, and the wait they give
    ("seconds", {"retry_after": "2"}, 2.0),
    ("ms-wins", {"retry_after_ms": "1500", "retry_after": "9"}, 1.5),
    ("http-date", {"retry_after": http_date(WALL + 20)}, 20.0),
    ("past-date", {"retry_after": http_date(WALL - 20)}, 5.0),  # past: as if absent, 5 s
]


def _scenarios() -> list[Scenario]:
    lines = ollama_lines()
    bad_line = lines[1].replace(b"quick", b"qu\xffck")
    multibyte = openai_text_stream(list(MULTIBYTE))
    emoji = multibyte.index("👋".encode())  # cut 1/1/1/1; everything else in 5-byte chunks
    one_byte = (
        *split(multibyte[:emoji], 5),
        *split(multibyte[emoji : emoji + 4], 1),
        *split(multibyte[emoji + 4 :], 5),
    )
    cr_split = (
        ROLE,
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"The "}}],\r',
        b'\ndata: "model":"m"}\r\n\r\n',
        *OK[2:],
    )
    limited = status_reply(429, retry_after="1")
    return [
        Scenario(
            "F02-ndjson-last-line-without-lf",
            [ollama_reply([*lines[:-1], lines[-1].rstrip(b"\n")])],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        Scenario(
            "F02-ndjson-last-line-cut",
            [ollama_reply([*lines[:-1], lines[-1][:25]]), ollama_reply(lines)],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D*5", "reset", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        Scenario(
            "F03-silence-then-rescue",
            rescue_after(SILENT_REPLY),
            (0.0, 120.1, 240.1),
            Outcome.RESCUED,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=240.1,
        ),
        Scenario(
            "F03-headers-withheld-then-rescue",
            rescue_after(WITHHELD),
            (0.0, 120.1, 240.1),
            Outcome.RESCUED,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=240.1,
        ),
        Scenario(
            "F03-rescue-hangs",
            rescue_after(SILENT_REPLY, WITHHELD),
            (0.0, 120.1, 240.1),
            Outcome.EVENT_TIMEOUT,
            expect("start", END_TIMEOUT),
            "",
            ended=300.0,
        ),
        Scenario(
            "F03-without-rescue",
            [SILENT_REPLY],
            (0.0, 120.1),
            Outcome.EVENT_TIMEOUT,
            expect("start", END_TIMEOUT),
            "",
            ended=240.1,
            pol={"rescue": False},
            error=TurnTimeout,
        ),
        Scenario(
            "F04-stall-mid-stream",
            [Reply(chunks=tuple(OK), stall_after=4), OK_REPLY],
            (0.0, 180.1),
            Outcome.COMPLETED,
            expect("start", "D*3", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F05-pings-are-no-events",
            rescue_after(Reply(chunks=tuple(OK), stall_after=0, ping_every=10.0)),
            (0.0, 120.1, 240.1),
            Outcome.RESCUED,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
        ),
        Scenario(
            "F05-pings-after-an-event",
            [Reply(chunks=tuple(OK), stall_after=2, ping_every=10.0), OK_REPLY],
            (0.0, 180.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F06-total-deadline-then-rescue",
            rescue_after(
                Reply(chunks=(ROLE + OK[1], *OK[2:6]), chunk_delay=59.0, stall_after=5),
                Reply(
                    chunks=(openai_text_body(RESCUE_TEXT),),
                    content_type="application/json",
                    headers_delay=10.0,
                ),
            ),
            (0.0, 300.0),
            Outcome.RESCUED,
            expect("start", "D*5", "reset", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=310.0,
        ),
        Scenario(
            "F07-eof-without-terminal-event",
            [Reply(chunks=tuple(OK[:4])), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D*3", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F08-eof-before-any-event",
            [Reply(), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        *[
            Scenario(
                f"F09-connection-{how}-mid-stream",
                [
                    Reply(
                        chunks=(*OK[:3], OK[3]),  # role, 2 deltas, then the cut
                        drop_after_bytes=len(b"".join(OK[:3])),
                        drop_with_reset=how == "reset",
                    ),
                    OK_REPLY,
                ],
                (0.0, 0.1),
                Outcome.COMPLETED,
                expect("start", "D*2", "reset", *OK_SEEN, END_OK),
                TEXT,
            )
            for how in ("closed", "reset")
        ],
        Scenario(
            "F11-503-three-times",
            [status_reply(503)] * 3 + [OK_REPLY],
            (0.0, 5.0, 10.0, 15.0),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F12-always-503",
            rescue_after(status_reply(503)),
            (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            Outcome.RATE_LIMITED,
            expect("start", end_error("provider_unavailable")),
            "",
            ended=25.0,
        ),
        Scenario(
            "F12-always-500-then-rescue",
            rescue_after(status_reply(500)),
            (0.0, 0.1, 0.3, 0.7, 0.7),
            Outcome.RESCUED,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
        ),
        *[
            Scenario(
                f"F13-429-{name}",
                [status_reply(429, **headers), OK_REPLY],
                (0.0, second),
                Outcome.COMPLETED,
                expect("start", *OK_SEEN, END_OK),
                TEXT,
            )
            for name, headers, second in SERVER_SAYS_WAIT
        ],
        Scenario(
            "F14-retry-after-3600",
            rescue_after(status_reply(429, retry_after="3600")),
            (0.0,),
            Outcome.RATE_LIMITED,
            expect("start", END_RATE),
            "",
            ended=0.0,
        ),
        *[
            Scenario(
                f"F15-unusable-retry-after-{name}",
                [status_reply(429, retry_after=value), OK_REPLY],
                (0.0, 5.0),
                Outcome.COMPLETED,
                expect("start", *OK_SEEN, END_OK),
                TEXT,
            )
            for name, value in UNUSABLE_RETRY_AFTER.items()
        ],
        Scenario(
            "F16-529-retry-after-1",
            [status_reply(529, retry_after="1")] * 2 + [OK_REPLY],
            (0.0, 1.0, 2.0),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F17-in-stream-server-error",
            [Reply(chunks=(*OK[:2], openai_error("server_error"))), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F17-in-stream-rate-limit",
            [Reply(chunks=(*OK[:2], openai_error("rate_limit_exceeded"))), OK_REPLY],
            (0.0, 5.0),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F17-in-stream-invalid-request",
            rescue_after(Reply(chunks=(*OK[:2], openai_error("invalid_request_error")))),
            (0.0,),
            Outcome.FAILED,
            expect("start", "D", end_error("invalid_request")),
            FRAGMENTS[0],
        ),
        Scenario(
            "F18-401-fails-at-once",
            rescue_after([status_reply(401), OK_REPLY]),
            (0.0,),
            Outcome.INIT_FAILED,
            expect("start", end_error("authentication_failed")),
            "",
            ended=0.0,
        ),
        Scenario(
            "F19-should-retry-false-on-500",
            rescue_after(status_reply(500, should_retry=False)),
            (0.0,),
            Outcome.INIT_FAILED,
            expect("start", end_error("provider_unavailable")),
            "",
        ),
        *[
            Scenario(
                f"F20-{code}-then-ok",
                [status_reply(code), OK_REPLY],
                (0.0, 0.1),
                Outcome.COMPLETED,
                expect("start", *OK_SEEN, END_OK),
                TEXT,
            )
            for code in (408, 500, 502, 504)
        ],
        Scenario(
            "F21-html-then-ok",
            [HTML_REPLY, OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F22-malformed-frame",
            [Reply(chunks=(ROLE, OK[1], BAD_FRAME + OK[2], *OK[3:])), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F23-characters-cut-across-chunks",
            [Reply(chunks=one_byte)],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", "D*5", "usage", "done", END_OK),
            "".join(MULTIBYTE),
        ),
        Scenario(
            "F24-invalid-utf8-in-ndjson",
            [ollama_reply([lines[0], bad_line, *lines[2:]]), ollama_reply(lines)],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        Scenario(
            "F25-crlf-split-across-chunks",
            [Reply(chunks=cr_split)],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F26-oversized-line",  # over a 64 KiB cap: permanent, the same frame would come back
            [Reply(chunks=(OK[0], OK[1], *split(OVERSIZED, 4096), *OK[2:])), OK_REPLY],
            (0.0,),
            Outcome.FAILED,
            expect("start", "D", end_error("protocol_error")),
            FRAGMENTS[0],
            pol={"max_frame": 64 * 1024},
            error=FrameTooLarge,
        ),
        Scenario(
            "F39-budgets-are-separate",
            [status_reply(500), limited, status_reply(500), limited, status_reply(500), OK_REPLY],
            (0.0, 0.1, 1.1, 1.3, 2.3, 2.7),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        Scenario(
            "F40-rate-limit-wait-past-the-total-deadline",
            rescue_after(
                [
                    Reply(chunks=tuple(OK), stall_after=4),
                    status_reply(429, retry_after="60"),
                    status_reply(429, retry_after="60"),
                ]
            ),
            (0.0, 180.1, 240.1),
            Outcome.RATE_LIMITED,
            expect("start", "D*3", END_RATE),
            "The quick brown ",
            ended=240.1,
        ),
        Scenario(
            "F42-total-deadline-cuts-the-backoff",
            rescue_after(
                [
                    Reply(chunks=tuple(OK), stall_after=2),
                    Reply(chunks=(ROLE, OK[1], b": bye\n\n"), chunk_delay=(299.95 - 180.1) / 3),
                ]
            ),
            (0.0, 180.1, 300.0),
            Outcome.RESCUED,
            expect("start", "D", "reset", "D", "reset", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=300.0,
        ),
        Scenario(
            "F45-finish-length",
            [Reply(chunks=tuple(f.replace(b'"stop"', b'"length"') for f in OK)), OK_REPLY],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", "D*5", "usage", "end(error, provider_length)"),
            TEXT,
        ),
    ]


SCENARIOS = _scenarios()


@pytest.fixture(params=list(RUNNERS))
def runner(request: pytest.FixtureRequest) -> str:
    """Each runner in turn: in memory, then over loopback."""
    name: str = request.param
    return name


@pytest.fixture
def clock(runner: str) -> trio.testing.MockClock:
    """The runner's own virtual clock (pytest-trio runs the test under it)."""
    return runner_clock(runner)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
async def test_catalogue_scenario(
    runner: str, clock: trio.testing.MockClock, scenario: Scenario
) -> None:
    # a fresh table: some scripts count the requests they answered (each graph and runner
    # plays the scenario)
    scenario = next(s for s in _scenarios() if str(s) == str(scenario))
    await RUNNERS[runner](scenario)


async def test_f10_connection_refused_every_time_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    # nobody listens: every request, the rescue too, fails to connect; the times are the
    # backoff the status events report
    run = await loop_turn([OK_REPLY], base_url=refused_url() + "/v1")
    assert run.result.outcome is Outcome.INIT_FAILED
    assert run.result.attempts == 5
    assert seen(run.events) == expect("start", end_error("connection_failed"))
    backoffs = [(e.elapsed_ms, e.delay_ms) for e in run.events if isinstance(e, StatusEvent)]
    assert backoffs[:3] == [(0, 100), (100, 200), (300, 400)]
    assert run.ended == pytest.approx(0.7, abs=1e-3)
    assert run.server.requests == []
    check_envelope(run.events, run.turn.run_id)


@pytest.mark.parametrize(
    ("script", "when"),
    [([status_reply(500)], 0.05), ([status_reply(429, retry_after=10)], 3.0)],
    ids=["backoff", "rate-limit-wait"],
)
async def test_f30_cancel_in_a_wait_over_loopback(
    loop_clock: trio.testing.MockClock, script: list[Reply], when: float
) -> None:
    async def at(server: LoopbackProvider, turn: Turn) -> None:
        await trio.sleep_until(when)

    run = await loop_turn(script, cancel_at=at)
    check_loop(
        run, at=[0.0], outcome=Outcome.CANCELLED, saw=expect("start", END_CANCELLED), text=""
    )
    assert run.ended == pytest.approx(when, abs=1e-3)


async def test_f31_cancel_during_a_hung_rescue_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def rescue_held(server: LoopbackProvider, turn: Turn) -> None:
        await server.wait_for_requests(5)

    run = await loop_turn(rescue_after(status_reply(500), WITHHELD), cancel_at=rescue_held)
    check_loop(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.CANCELLED,
        saw=expect("start", END_CANCELLED),
        text="",
        ended=0.7,
    )
    assert b'"stream":true' not in run.server.requests[4].body
    await trio.sleep(3600)
    assert len(run.server.requests) == 5  # no 6th, ever


@pytest.mark.parametrize(("rpm", "first"), [(6, 10.0), (1, 30.0)], ids=["6rpm", "1rpm-capped"])
async def test_f46_a_drained_bucket_delays_the_request_over_loopback(
    loop_clock: trio.testing.MockClock, rpm: int, first: float
) -> None:
    run = await loop_turn([OK_REPLY], pol=policy(requests_per_minute=rpm), drained=rpm)
    check_loop(
        run,
        at=[first],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=first,
    )
