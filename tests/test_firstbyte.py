"""What stands between calling `run_turn` and the request's first byte on the wire: a second
turn on the same client finds its connection in the pool (a reply that says it is complete
before its body has ended gives its connection back rather than closing it), without a turn
ever waiting long on a body that does not end. Real sockets: the loopback provider on
127.0.0.1 and httpx's own transport."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing
from rillet._policy import Policy
from rillet._turn import run_turn
from rillet.providers._base import Provider, Secret
from rillet.providers._openai_chat import OpenAIChatDialect
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream, split

from .test_handler import REQUEST

TEXT_STREAM = split(openai_text_stream(["Hel", "lo"]), 48)


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only once every task has been blocked for 20 ms of real time, so
    bytes in flight on loopback are not mistaken for idleness."""
    return trio.testing.MockClock(autojump_threshold=0.02)


def _provider(url: str) -> Provider:
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{url}/v1",
        model="gpt-4o-mini",
        api_key=Secret("sk-loopback-0000000000000000"),
    )


@pytest.mark.parametrize("graph", ["chained", "hops"])
async def test_a_second_turn_on_one_client_reuses_the_first_turns_connection(
    loop_clock: trio.testing.MockClock, graph: str
) -> None:
    async with (
        open_loopback_provider([Reply(chunks=TEXT_STREAM)]) as server,
        httpx.AsyncClient() as client,
    ):
        provider = _provider(server.url)
        for _ in range(3):
            result = await run_turn(REQUEST, provider, client=client, policy=Policy(graph=graph))
            assert result.ok
            assert result.text == "Hello"
        assert [r.connection for r in server.requests] == [0, 0, 0]
        assert server.connections == 1


async def test_a_body_that_never_ends_after_the_reply_costs_a_short_wait_and_its_connection(
    loop_clock: trio.testing.MockClock,
) -> None:
    # the whole stream, `[DONE]` included, then silence with the connection open: the turn
    # ends at once (within the finishing grace), and the next turn needs a new connection
    stalled = Reply(chunks=TEXT_STREAM, stall_after=len(TEXT_STREAM))
    async with (
        open_loopback_provider([stalled]) as server,
        httpx.AsyncClient() as client,
    ):
        provider = _provider(server.url)
        for _ in range(2):
            start = trio.current_time()
            with trio.fail_after(60):
                result = await run_turn(REQUEST, provider, client=client)
            assert result.ok
            assert result.text == "Hello"
            assert trio.current_time() - start < 0.1
        assert [r.connection for r in server.requests] == [0, 1]
