"""Whole turns over real sockets: the fault-injecting loopback provider
(`rillet.transports.testing`) on 127.0.0.1, httpx's own transport, the catalogue's scenarios
F01, F28 and F29, and what a client of its own makes of it. The scenarios that are scripts and
expectations alone are data in `test_reliability_faults.py`, played in memory and here alike.

The clock is a `MockClock` that jumps only after 20 ms of real time with every task blocked, so
bytes in flight on loopback are not mistaken for idleness, and the scripted waits (180 s stalls)
take no real time. A false jump would land on the earliest timer, so the scripts keep their
delays off the client's deadlines; each test runs under `trio.fail_after` (virtual). Every test
also checks that each response the client opened was closed, that the provider saw every
connection closed, and that nothing outlives the nursery.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Outcome, Policy
from rillet._core._runevents import AnswerDelta, RunEvent
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._turn import Turn, TurnResult
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_stream,
    split,
)

from ..handler_support import (
    END_CANCELLED,
    END_OK,
    FRAGMENTS,
    KEY,
    OK,
    OK_SEEN,
    REQUEST,
    TEXT,
    check_envelope,
    check_uni,
    expect,
    policy,
    rebuild,
    seen,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

LIMIT = 3600.0  # virtual seconds: beyond every scripted wait, never reached by a passing test
OK_REPLY = Reply(chunks=tuple(OK))


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """pytest-trio runs a test under the `trio.abc.Clock` among its fixtures."""
    return trio.testing.MockClock(autojump_threshold=0.02)


# --- a client transport that counts responses -----------------------------------------------------


@attrs.define(eq=False)
class _Counted(httpx.AsyncByteStream):
    inner: httpx.AsyncByteStream
    owner: CountingTransport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        self.owner.closed += 1
        await self.inner.aclose()


@attrs.define(eq=False)
class CountingTransport(httpx.AsyncBaseTransport):
    """httpx's own HTTP transport, counting the responses it opened and those closed."""

    inner: httpx.AsyncHTTPTransport = attrs.field(factory=httpx.AsyncHTTPTransport)
    opened: int = 0
    closed: int = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.opened += 1
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Counted(response.stream, self),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


async def wait_closed(server: LoopbackProvider) -> None:
    """Return once the provider has seen every connection close (it offers a count, no event)."""
    while server.open_connections:  # noqa: ASYNC110
        await trio.sleep(0.01)


# --- running a turn against the loopback provider -------------------------------------------------


@attrs.frozen
class LoopRun:
    """A finished turn over loopback."""

    server: LoopbackProvider
    transport: CountingTransport
    turn: Turn
    result: TurnResult
    events: list[RunEvent]
    ended: float

    @property
    def requests(self) -> list[RecordedRequest]:
        """What the provider received."""
        return self.server.requests


Stage = Callable[[LoopbackProvider, Turn], Awaitable[None]]


def provider_at(server: LoopbackProvider) -> Provider:
    """OpenAI Chat at the loopback provider."""
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{server.url}/v1",
        model="test-model",
        api_key=Secret(KEY),
    )


async def play_loop(
    script: Script, *, pol: Policy | None = None, cancel_at: Stage | None = None
) -> LoopRun:
    """Run one turn against a loopback provider playing `script`; cancel its caller's scope at
    `cancel_at` if given. Returns once the client and the server are both closed."""
    with trio.fail_after(LIMIT):
        async with open_loopback_provider(script) as server:
            transport = CountingTransport()
            async with httpx.AsyncClient(transport=transport) as client:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        turn: Turn = await nursery.start(
                            functools.partial(
                                run_turn,
                                REQUEST,
                                provider_at(server),
                                client=client,
                                policy=pol or policy(),
                                limiter=RateLimiter(),
                            )
                        )
                        if cancel_at is not None:
                            await cancel_at(server, turn)
                            scope.cancel()
                ended = trio.current_time()
                result = await turn.result()
            await wait_closed(server)
    events = [event async for event in turn.run_events()]
    return LoopRun(server, transport, turn, result, events, ended)


def check_loop(
    run: LoopRun,
    *,
    at: Sequence[float],
    outcome: Outcome,
    saw: Sequence[str],
    text: str,
) -> None:
    """Requests (virtual times), outcome, events, text, and every response closed."""
    assert [r.at for r in run.requests] == pytest.approx(at, abs=1e-3)
    assert run.result.outcome is outcome
    assert run.result.attempts == len(at)
    assert seen(run.events) == list(saw)
    check_envelope(run.events, run.turn.run_id)
    assert rebuild(run.events) == text
    assert run.result.text == text
    assert run.transport.opened == run.transport.closed
    assert run.server.open_connections == 0


async def uni_of(turn: Turn) -> list[Any]:
    """The turn's MMSP items."""
    return [item async for item in turn.uni_events()]


# --- the scenarios --------------------------------------------------------------------------------


async def test_f01_ok_over_loopback(loop_clock: trio.testing.MockClock) -> None:
    stream = openai_text_stream(list(FRAGMENTS))
    run = await play_loop([Reply(chunks=split(stream, 64))])
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    request = run.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    check_uni(await uni_of(run.turn))


async def test_f28_cancel_while_the_provider_holds_the_request_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def held(server: LoopbackProvider, turn: Turn) -> None:
        await server.wait_for_requests(1)

    run = await play_loop([Reply(stall_headers=True)], cancel_at=held)
    check_loop(
        run, at=[0.0], outcome=Outcome.CANCELLED, saw=expect("start", END_CANCELLED), text=""
    )
    assert run.ended == 0.0


async def test_f29_cancel_after_two_deltas_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def two_deltas(server: LoopbackProvider, turn: Turn) -> None:
        count = 0
        async for event in turn.run_events():
            count += isinstance(event, AnswerDelta)
            if count == 2:
                return

    run = await play_loop([Reply(chunks=tuple(OK), stall_after=3)], cancel_at=two_deltas)
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.CANCELLED,
        saw=expect("start", "D*2", END_CANCELLED),
        text="The quick ",
    )
    assert run.transport.closed == 1


async def test_a_turn_without_a_client_makes_one_and_closes_it(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with open_loopback_provider([OK_REPLY]) as server:
            result = await run_turn(
                REQUEST, provider_at(server), policy=policy(), limiter=RateLimiter()
            )
            await wait_closed(server)
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert server.connections == 1


async def test_a_provider_thinking_longer_than_httpx_default_timeout_is_waited_for(
    loop_clock: trio.testing.MockClock,
) -> None:
    # the client keeps httpx's default 5 s timeouts; the handler's deadlines alone apply
    run = await play_loop([Reply(chunks=tuple(OK), headers_delay=30.0, chunk_delay=20.0)])
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    assert run.ended == pytest.approx(30.0 + 20.0 * len(OK))
