"""rillet as an MCP server (`rillet.mcp`), with the real MCP SDK client: over stdio (the server a
subprocess, `python -m rillet.mcp`, against the loopback provider on 127.0.0.1), and over
streamable HTTP (the server's Starlette app on uvicorn on 127.0.0.1, the turn in the loop's trio
guest run); the dispatcher's ordering rules on their own, in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import mcp_types
import msgspec
import pytest
import trio
import trio.testing
import uvicorn
from mcp import Client, StdioServerParameters
from rillet import AnswerDelta, CallbackSink, RunDone, RunEvent, RunStarted, encode_json
from rillet.mcp import (
    CORRELATION_ID_KEY,
    LAST_SEQ_KEY,
    RUN_EVENT_KEY,
    RunEventDispatcher,
    RunEventGap,
    RunEvents,
    turn_server,
)
from rillet.providers import OpenAIChatDialect, Provider
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    status_reply,
)

from ..loopback_thread import WAIT, LoopbackThread
from ..sinks_support import completed_done

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FRAGMENTS = ["The ", "quick ", "brown ", "fox."]
TEXT = "".join(FRAGMENTS)


def frames(data: bytes) -> tuple[bytes, ...]:
    """An SSE body cut at its frames: one chunk per frame, so a stall lands between frames."""
    return tuple(part + b"\n\n" for part in data.split(b"\n\n") if part)


OK = Reply(chunks=frames(openai_text_stream(FRAGMENTS)))
STALLED = Reply(chunks=frames(openai_text_stream(FRAGMENTS)), stall_after=3)
# the whole reply, slowly: a turn that is still running for a while after its first delta
SLOW = Reply(chunks=frames(openai_text_stream(FRAGMENTS)), chunk_delay=0.15)


def check_run(events: list[RunEvent], status: str = "completed") -> None:
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunDone)
    assert events[-1].status == status
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def answer(events: list[RunEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, AnswerDelta))


# --- the dispatcher on its own ---------------------------------------------------------------


def run_events(n: int) -> list[RunEvent]:
    """A run's events, `run.started`, deltas, `run.done`, seq 1..n."""
    events: list[RunEvent] = [RunStarted(run_id="r", seq=1, elapsed_ms=0, provider="p", model="m")]
    events += [AnswerDelta(run_id="r", seq=i, elapsed_ms=i, delta=f"{i} ") for i in range(2, n)]
    events.append(completed_done("r", n))
    return events


def notification(event: RunEvent, cid: str) -> mcp_types.ProgressNotification:
    meta = {RUN_EVENT_KEY: msgspec.json.decode(encode_json(event)), CORRELATION_ID_KEY: cid}
    params = mcp_types.ProgressNotificationParams(
        progress_token=1,
        progress=float(event.seq),
        _meta=meta,
    )
    return mcp_types.ProgressNotification(params=params)


def result(last: int) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[],
        _meta={LAST_SEQ_KEY: last},
    )


async def drain(run: RunEvents) -> list[RunEvent]:
    return [event async for event in run]


async def test_the_dispatcher_reorders_within_its_buffer_and_ignores_duplicates() -> None:
    dispatcher = RunEventDispatcher(buffer=8)
    run = dispatcher.open("call-1")
    other = dispatcher.open("call-2")
    events = run_events(10)
    shuffled = [events[i] for i in (2, 0, 1, 5, 4, 3, 3, 9, 8, 7, 6, 0)]
    for event in shuffled:
        await dispatcher.handle(notification(event, "call-1"))
    await dispatcher.handle(notification(events[0], "call-2"))
    await dispatcher.handle(notification(events[0], "call-9"))  # nobody's call
    await dispatcher.handle(mcp_types.ToolListChangedNotification())  # not a run event
    assert await drain(run) == events
    assert run.duplicates == 2
    assert dispatcher.unrouted == 1
    assert [e async for e in _first(other)] == [events[0]]


async def _first(run: RunEvents) -> AsyncIterator[RunEvent]:
    yield await anext(run)


async def test_a_gap_wider_than_the_buffer_raises(autojump_clock: trio.testing.MockClock) -> None:
    dispatcher = RunEventDispatcher(buffer=3)
    run = dispatcher.open("c")
    events = run_events(10)
    for event in [events[0], *events[2:6]]:  # seq 2 never comes; 4 wait for it
        await dispatcher.handle(notification(event, "c"))
    assert await anext(run) == events[0]
    with trio.fail_after(60), pytest.raises(RunEventGap) as caught:  # the result has not come
        await anext(run)
    assert caught.value.missing == 2
    assert caught.value.waiting == 4


async def test_events_still_missing_after_the_result_raise_once_settled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher = RunEventDispatcher(buffer=64, settle=2.0)
    run = dispatcher.open("c")
    events = run_events(6)
    for event in (events[0], events[1], events[3]):
        await dispatcher.handle(notification(event, "c"))
    run.finish(result(6))
    start = trio.current_time()
    assert [await anext(run), await anext(run)] == events[:2]
    with pytest.raises(RunEventGap) as caught:
        await anext(run)
    assert caught.value.missing == 3
    assert trio.current_time() - start == pytest.approx(2.0)


async def test_events_that_arrive_after_the_result_are_still_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher = RunEventDispatcher(settle=2.0)
    run = dispatcher.open("c")
    events = run_events(5)
    await dispatcher.handle(notification(events[0], "c"))
    run.finish(result(5))

    async def late() -> None:
        await trio.sleep(1.0)
        for event in reversed(events[1:]):
            await dispatcher.handle(notification(event, "c"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late)
        assert await drain(run) == events


async def test_a_result_without_run_events_ends_the_iteration() -> None:
    run = RunEventDispatcher().open("c")
    run.finish(mcp_types.CallToolResult(content=[]))
    assert await drain(run) == []


async def test_a_correlation_id_is_open_once() -> None:
    dispatcher = RunEventDispatcher()
    run = dispatcher.open("c")
    with pytest.raises(ValueError, match="already open"):
        dispatcher.open("c")
    dispatcher.close(run)
    dispatcher.open("c")


# --- over stdio: the server a subprocess ------------------------------------------------------


def stdio_server(url: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "rillet.mcp", "--provider", f"{url}/v1", "--model", "gpt-test"],
    )


@pytest.mark.slow
async def test_stdio_a_turn_streams_its_run_events_in_order() -> None:
    dispatcher = RunEventDispatcher()
    async with open_loopback_provider([OK]) as provider:
        async with Client(stdio_server(provider.url), message_handler=dispatcher.handle) as client:
            tools = await client.list_tools()
            assert [t.name for t in tools.tools] == ["run_turn"]
            async with dispatcher.call(client, {"prompt": "hello"}) as events:
                got = [event async for event in events]
        assert len(provider.requests) == 1
    check_run(got)
    assert answer(got) == TEXT
    assert events.result is not None
    assert not events.result.is_error
    assert isinstance(events.result.content[0], mcp_types.TextContent)
    assert events.result.content[0].text == TEXT
    assert events.result.structured_content["outcome"] == "completed"
    assert json.loads(provider.requests[0].body)["messages"][-1]["content"] == "hello"


@pytest.mark.slow
async def test_stdio_standard_progress_without_run_events() -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async with (
        open_loopback_provider([OK]) as provider,
        Client(stdio_server(provider.url)) as client,
    ):
        result = await client.call_tool("run_turn", {"prompt": "hi"}, progress_callback=on_progress)
    assert not result.is_error
    assert RUN_EVENT_KEY not in (result.meta or {})
    # every run event, as a progress notification; the SDK may run their callbacks out of order
    values = sorted(seen)
    assert [v for v, _ in values] == [float(i) for i in range(1, len(values) + 1)]
    assert "".join(m or "" for _, m in values[1 : 1 + len(FRAGMENTS)]) == TEXT
    assert values[-1][1] == "run.done"


@pytest.mark.slow
@pytest.mark.parametrize(("finish", "filtered"), [("content_filter", True), ("stop", False)])
async def test_stdio_an_answer_the_content_rules_cut_says_so(finish: str, filtered: bool) -> None:
    cut = Reply(chunks=frames(openai_text_stream(FRAGMENTS[:2], finish_reason=finish)))
    async with (
        open_loopback_provider([cut]) as provider,
        Client(stdio_server(provider.url)) as client,
    ):
        result = await client.call_tool("run_turn", {"prompt": "hi"})
    assert not result.is_error  # the text stands, cut short
    assert isinstance(result.content[0], mcp_types.TextContent)
    assert result.content[0].text == "".join(FRAGMENTS[:2])
    assert result.structured_content is not None
    assert result.structured_content.get("filtered", False) is filtered


@pytest.mark.slow
async def test_stdio_cancelling_the_call_cancels_the_turn_at_the_provider() -> None:
    dispatcher = RunEventDispatcher()
    async with (
        open_loopback_provider([STALLED]) as provider,
        Client(stdio_server(provider.url), message_handler=dispatcher.handle) as client,
    ):
        with trio.fail_after(WAIT):
            async with dispatcher.call(client, {"prompt": "hi"}) as events:
                async for event in events:
                    if isinstance(event, AnswerDelta):
                        break  # leaving the block cancels the call
            # notifications/cancelled reached the server: its turn closed the response
            await provider.wait_connections_closed()
        assert provider.open_connections == 0
        # the server is still there for the next call
        provider.set_script([OK])
        async with dispatcher.call(client, {"prompt": "again"}) as events:
            assert answer([e async for e in events]) == TEXT
    assert len(provider.requests) == 2


# --- over streamable HTTP: the server's app on uvicorn ----------------------------------------


@contextlib.asynccontextmanager
async def http_server(url: str, seen: list[RunEvent]) -> AsyncIterator[str]:
    """The turn server's streamable HTTP app on 127.0.0.1; `seen` gets every run event of every
    turn it runs (a sink of the server's own)."""
    provider = Provider(OpenAIChatDialect(), f"{url}/v1", "gpt-test")
    server = turn_server(provider, sinks=[CallbackSink(on_run_event=seen.append)])
    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning"
    )
    web = uvicorn.Server(config)
    task = asyncio.create_task(web.serve())
    while not web.started:  # noqa: ASYNC110 - uvicorn has no event to wait on
        await asyncio.sleep(0.01)
    port = web.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        web.should_exit = True
        await task


async def until(condition: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - polls state another thread changes
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_a_turn_streams_its_run_events_in_order(mode: str) -> None:
    async def main(url: str) -> tuple[list[RunEvent], RunEvents]:
        dispatcher = RunEventDispatcher()
        async with (
            http_server(url, []) as endpoint,
            Client(endpoint, mode=mode, message_handler=dispatcher.handle) as client,
            dispatcher.call(client, {"prompt": "hello", "max_tokens": 50}) as events,
        ):
            return [event async for event in events], events

    with LoopbackThread([OK]) as provider:
        got, events = asyncio.run(main(provider.url))
    check_run(got)
    assert answer(got) == TEXT
    assert events.result is not None
    assert events.result.content[0].text == TEXT  # type: ignore[union-attr]
    assert json.loads(provider.requests[0].body)["max_completion_tokens"] == 50


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_cancelling_the_call_cancels_the_turn_at_the_provider(mode: str) -> None:
    """`notifications/cancelled` on a handshake-era session; on a 2026-07-28 exchange, the
    client closing the response stream, which is that protocol's cancellation."""

    async def main(provider: LoopbackThread) -> list[RunEvent]:
        seen: list[RunEvent] = []
        dispatcher = RunEventDispatcher()
        async with (
            http_server(provider.url, seen) as endpoint,
            Client(endpoint, mode=mode, message_handler=dispatcher.handle) as client,
        ):
            async with dispatcher.call(client, {"prompt": "hi"}) as events:
                async for event in events:
                    if isinstance(event, AnswerDelta):
                        break
            await asyncio.to_thread(provider.wait_connections_closed)
            await until(lambda: seen and isinstance(seen[-1], RunDone))
        return seen

    with LoopbackThread([STALLED]) as provider:
        seen = asyncio.run(main(provider))
    check_run(seen, status="cancelled")


def test_http_a_dropped_connection_does_not_cancel_the_turn() -> None:
    """A handshake-era session: the client's POST stream goes away mid-turn without a
    `notifications/cancelled`; the turn runs to its end."""

    async def main(provider: LoopbackThread) -> tuple[list[str], list[RunEvent]]:
        seen: list[RunEvent] = []
        async with http_server(provider.url, seen) as endpoint, httpx.AsyncClient() as http:
            session = await _initialize(http, endpoint)
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "run_turn",
                    "arguments": {"prompt": "hi"},
                    "_meta": {"progressToken": "p"},
                },
            }
            got: list[str] = []
            async with http.stream("POST", endpoint, json=call, headers=session) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        got.append(json.loads(line[5:])["method"])
                        break  # one progress notification, then the client goes away
            assert not any(isinstance(e, RunDone) for e in seen)  # the turn was still running
            await until(lambda: seen and isinstance(seen[-1], RunDone))
        return got, seen

    with LoopbackThread([SLOW]) as provider:
        got, seen = asyncio.run(main(provider))
    assert got == ["notifications/progress"]
    check_run(seen, status="completed")
    assert answer(seen) == TEXT


async def _initialize(http: httpx.AsyncClient, endpoint: str) -> dict[str, str]:
    """A handshake-era session by hand; the headers its requests carry."""
    headers = {"accept": "application/json, text/event-stream"}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    response = await http.post(endpoint, json=hello, headers=headers)
    assert response.status_code == 200
    headers["mcp-session-id"] = response.headers["mcp-session-id"]
    headers["mcp-protocol-version"] = "2025-11-25"
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(endpoint, json=done, headers=headers)).status_code == 202
    return headers


# --- the optional module ----------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=WAIT
    )


def test_rillet_alone_imports_neither_adapter_nor_the_sdk() -> None:
    done = _python(
        "import sys, rillet, rillet.providers, rillet.transports\n"
        "print(sorted(m for m in ('rillet.mcp', 'rillet.asyncio', 'mcp', 'starlette')"
        " if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_the_sdk_rillet_mcp_names_the_extra() -> None:
    done = _python("import sys; sys.modules['mcp'] = None; import rillet.mcp")
    assert done.returncode != 0
    assert "pip install 'rillet[mcp]'" in done.stderr


@pytest.mark.slow
async def test_stdio_a_refused_key_is_an_error_result_with_its_code() -> None:
    leak = {"error": {"message": "Incorrect API key provided: sk-abc", "type": None}}
    async with (
        open_loopback_provider([status_reply(401, body=leak)]) as provider,
        Client(stdio_server(provider.url)) as client,
    ):
        result = await client.call_tool("run_turn", {"prompt": "hi"})
    assert result.is_error
    assert result.structured_content is not None
    assert result.structured_content["code"] == "authentication_failed"
    assert isinstance(result.content[0], mcp_types.TextContent)
    assert result.content[0].text == "The turn ended without a reply (authentication_failed)."
    assert "Incorrect" not in json.dumps(result.structured_content)
