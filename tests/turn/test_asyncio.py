"""rillet from asyncio (`rillet.asyncio`): turns in trio's guest mode inside `asyncio.run`,
against the loopback provider on 127.0.0.1 in a thread with its own trio run; a Starlette app
on a real uvicorn server streaming a turn as SSE to an httpx client.

These tests are plain functions that call `asyncio.run` (pytest-trio's `trio_mode` leaves sync
tests alone). A cancelled or abandoned turn is checked at the provider: its connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import rillet.asyncio
import uvicorn
from rillet import (
    AnswerDelta,
    Outcome,
    RunDone,
    RunStarted,
    TextDelta,
    TurnRequest,
    UniEvent,
    encode_json,
    user,
)
from rillet._turn._guest import GuestRun, guest_run
from rillet.asyncio import TurnStream, run_in_trio, stream_turn
from rillet.frames import SSEDecoder, encode_sse
from rillet.lowlevel import AttemptReset
from rillet.providers import OpenAIChatDialect, Provider
from rillet.transports.testing import Reply, openai_text_stream, status_reply
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from ..loopback_thread import WAIT, LoopbackThread

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:uvicorn|websockets")

FRAGMENTS = ["The ", "quick ", "brown ", "fox."]
TEXT = "".join(FRAGMENTS)
REQUEST = TurnRequest(messages=[user("Say something")])


def frames(data: bytes) -> tuple[bytes, ...]:
    """An SSE body cut at its frames: one chunk per frame, so a stall lands between frames."""
    return tuple(part + b"\n\n" for part in data.split(b"\n\n") if part)


OK = Reply(chunks=frames(openai_text_stream(FRAGMENTS)))
# the role chunk and two fragments, then silence with the connection open
STALLED = Reply(chunks=frames(openai_text_stream(FRAGMENTS)), stall_after=3)


def provider(url: str) -> Provider:
    return Provider(OpenAIChatDialect(), url, "gpt-test")


def text_of(items: list[Any]) -> str:
    """The answer text from MMSP items, honouring resets."""
    text = ""
    for item in items:
        if isinstance(item, AttemptReset):
            text = ""
        elif isinstance(item, UniEvent):
            text += "".join(c.text for c in item.content_items if isinstance(c, TextDelta))
    return text


def test_a_turn_streams_its_uni_events_and_result_to_asyncio() -> None:
    async def main(url: str) -> tuple[list[Any], Any]:
        async with stream_turn(REQUEST, provider(url)) as stream:
            items = [item async for item in stream]
            return items, await stream.result()

    with LoopbackThread([OK]) as loop_provider:
        items, result = asyncio.run(main(loop_provider.url))
        loop_provider.wait_connections_closed()
    assert text_of(items) == TEXT
    assert [i.event_type for i in items][-1] == "stop"
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert len(loop_provider.requests) == 1


def test_run_events_are_selectable_and_gapless() -> None:
    async def main(url: str) -> list[Any]:
        stream = stream_turn(REQUEST, provider(url), events="run")
        return [event async for event in stream]

    with LoopbackThread([OK]) as loop_provider:
        events = asyncio.run(main(loop_provider.url))
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunDone)
    assert events[-1].status == "completed"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert "".join(e.delta for e in events if isinstance(e, AnswerDelta)) == TEXT


def test_a_retry_shows_up_as_a_reset() -> None:
    async def main(url: str) -> tuple[list[Any], Any]:
        async with stream_turn(REQUEST, provider(url)) as stream:
            return [item async for item in stream], await stream.result()

    chunks = frames(openai_text_stream(FRAGMENTS))
    dropped = Reply(chunks=chunks, drop_after_bytes=sum(map(len, chunks[:3])))  # two fragments
    with LoopbackThread([dropped, OK]) as loop_provider:
        items, result = asyncio.run(main(loop_provider.url))
    assert any(isinstance(i, AttemptReset) for i in items)
    assert text_of(items) == TEXT
    assert result.attempts == 2


def test_several_turns_share_one_guest_run_per_loop() -> None:
    runs: list[GuestRun] = []

    async def one(url: str) -> str:
        async with stream_turn(REQUEST, provider(url)) as stream:
            runs.append(guest_run())
            return text_of([item async for item in stream])

    async def main(url: str) -> list[str]:
        return list(await asyncio.gather(*(one(url) for _ in range(4))))

    with LoopbackThread([OK]) as loop_provider:
        assert asyncio.run(main(loop_provider.url)) == [TEXT] * 4
        assert asyncio.run(main(loop_provider.url)) == [TEXT] * 4
    assert len(loop_provider.requests) == 8
    first, second = set(runs[:4]), set(runs[4:])
    assert len(first) == 1
    assert len(second) == 1
    assert first != second
    assert all(run.finished for run in runs)  # each stopped with its loop


def test_closing_the_stream_early_cancels_the_turn_and_closes_the_provider_request() -> None:
    async def main(loop_provider: LoopbackThread) -> Any:
        async with stream_turn(REQUEST, provider(loop_provider.url), events="run") as stream:
            async for event in stream:
                if isinstance(event, AnswerDelta):
                    break
            await asyncio.to_thread(loop_provider.wait_for_requests, 1)
            assert await asyncio.to_thread(loop_provider.open_connections) == 1
        await asyncio.to_thread(loop_provider.wait_connections_closed)
        return await stream.result()

    with LoopbackThread([STALLED]) as loop_provider:
        result = asyncio.run(main(loop_provider))
    assert result.outcome is Outcome.CANCELLED


def test_cancelling_the_asyncio_task_cancels_the_turn() -> None:
    got_first = threading.Event()

    async def consume(stream: TurnStream[Any]) -> None:
        async for item in stream:
            if text_of([item]):
                got_first.set()

    async def main(loop_provider: LoopbackThread) -> Any:
        stream = stream_turn(REQUEST, provider(loop_provider.url))
        task = asyncio.create_task(consume(stream))
        await asyncio.to_thread(got_first.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the turn has closed its response; the provider, in its thread, sees the close soon
        await asyncio.to_thread(loop_provider.wait_connections_closed)
        return await stream.result()

    with LoopbackThread([STALLED]) as loop_provider:
        result = asyncio.run(main(loop_provider))
    assert result.outcome is Outcome.CANCELLED
    assert result.text == "The quick "


def test_an_asyncio_timeout_cancels_the_turn() -> None:
    async def main(loop_provider: LoopbackThread) -> list[Any]:
        seen: list[Any] = []
        stream = stream_turn(REQUEST, provider(loop_provider.url))

        async def read() -> None:
            async with asyncio.timeout(0.5):
                async for item in stream:
                    seen.append(item)

        with pytest.raises(TimeoutError):
            await read()
        await asyncio.to_thread(loop_provider.wait_connections_closed)
        return seen

    with LoopbackThread([STALLED]) as loop_provider:
        seen = asyncio.run(main(loop_provider))
    assert text_of(seen) == "The quick "


def test_a_turn_left_running_is_cancelled_when_the_loop_stops() -> None:
    async def main(loop_provider: LoopbackThread) -> GuestRun:
        stream = stream_turn(REQUEST, provider(loop_provider.url))
        await anext(stream)
        await asyncio.to_thread(loop_provider.wait_for_requests, 1)
        assert not guest_run().finished
        return guest_run()  # the stream is never closed: asyncio.run's shutdown stops it

    with LoopbackThread([STALLED]) as loop_provider:
        run = asyncio.run(main(loop_provider))
        assert run.finished
        loop_provider.wait_connections_closed()


def test_a_host_that_set_a_wakeup_fd_keeps_it() -> None:
    import signal
    import socket

    async def main() -> int:
        assert await run_in_trio(_trio_time) > 0  # the trio run is up
        return signal.set_wakeup_fd(-1)

    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        signal.set_wakeup_fd(left.fileno())
        assert asyncio.run(main()) == left.fileno()  # trio did not take it over
    finally:
        signal.set_wakeup_fd(-1)
        left.close()
        right.close()


async def _trio_time() -> float:
    import trio

    await trio.lowlevel.checkpoint()
    return trio.current_time()


def test_a_failed_turn_ends_the_stream_and_reports_its_error() -> None:
    async def main(url: str) -> tuple[list[Any], Any]:
        async with stream_turn(REQUEST, provider(url), events="run") as stream:
            return [event async for event in stream], await stream.result()

    with LoopbackThread([status_reply(401)]) as loop_provider:
        events, result = asyncio.run(main(loop_provider.url))
    assert isinstance(events[-1], RunDone)
    assert events[-1].status == "error"
    assert result.outcome is not Outcome.COMPLETED
    assert result.error is not None
    assert len(loop_provider.requests) == 1  # a deterministic failure is never retried


def test_a_slow_consumer_holds_the_turn_back() -> None:
    many = [f"w{i} " for i in range(200)]

    async def main(url: str) -> tuple[bool, int, str]:
        stream = stream_turn(REQUEST, provider(url), buffer=2)
        first = await anext(stream)
        waiting = asyncio.create_task(stream.result())
        # the provider has sent everything long before this; the turn waits for the consumer
        done, _ = await asyncio.wait([waiting], timeout=0.3)
        held = not done
        rest = [item async for item in stream]
        await waiting
        return held, len(rest), text_of([first, *rest])

    with LoopbackThread([Reply(chunks=frames(openai_text_stream(many)))]) as loop_provider:
        held, rest, text = asyncio.run(main(loop_provider.url))
    assert held
    assert text == "".join(many)
    assert rest > 200


def test_run_in_trio_runs_a_trio_function_and_passes_its_errors() -> None:
    import trio

    async def trio_side(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return x * 2

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("trio side")

    async def main() -> int:
        with pytest.raises(KeyError):
            await run_in_trio(fails)
        return await run_in_trio(trio_side, 21)

    assert asyncio.run(main()) == 42


def test_a_stream_closed_before_it_started_runs_no_turn() -> None:
    async def main(url: str) -> list[Any]:
        stream = stream_turn(REQUEST, provider(url))
        await stream.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await stream.result()
        return [item async for item in stream]

    with LoopbackThread([OK]) as loop_provider:
        assert asyncio.run(main(loop_provider.url)) == []
    assert loop_provider.requests == []


def test_stream_turn_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="events"):
        stream_turn(REQUEST, provider("http://127.0.0.1:1"), events="lanes")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="buffer"):
        stream_turn(REQUEST, provider("http://127.0.0.1:1"), buffer=0)


def test_the_module_is_rillet_asyncio_and_asyncio_is_the_standard_library() -> None:
    assert rillet.asyncio.stream_turn.__module__ == "rillet.asyncio"
    assert rillet.asyncio.TurnStream.__module__ == "rillet.asyncio"
    assert rillet.asyncio.asyncio is asyncio  # type: ignore[attr-defined]


# --- a Starlette app on uvicorn --------------------------------------------------------------


def sse_app(url: str) -> Starlette:
    """An asyncio web app streaming a turn's run events as SSE."""

    async def chat(request: Request) -> StreamingResponse:
        prompt = request.query_params.get("q", "hi")
        turn = TurnRequest(messages=[user(prompt)])

        async def body() -> AsyncIterator[bytes]:
            async with stream_turn(turn, provider(url), events="run") as stream:
                async for event in stream:
                    yield encode_sse(encode_json(event).decode(), id=str(event.seq))

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/chat", chat)])


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event to wait on
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    import json

    decoder = SSEDecoder()
    async for chunk in response.aiter_bytes():
        for frame in decoder.feed(chunk):
            yield json.loads(frame.data)


def test_a_starlette_handler_streams_a_turn_as_sse_over_uvicorn() -> None:
    async def main(url: str) -> list[dict[str, Any]]:
        async with (
            serving(sse_app(url)) as base,
            httpx.AsyncClient(base_url=base) as client,
            client.stream("GET", "/chat", params={"q": "hello"}) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return [event async for event in sse_events(response)]

    with LoopbackThread([OK]) as loop_provider:
        events = asyncio.run(main(loop_provider.url))
    assert events[0]["type"] == "run.started"
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "completed"
    assert "".join(e["delta"] for e in events if e["type"] == "answer.delta") == TEXT
    assert b"hello" in loop_provider.requests[0].body


def test_a_client_disconnect_closes_the_provider_request() -> None:
    async def main(loop_provider: LoopbackThread) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        async with serving(sse_app(loop_provider.url)) as base:
            async with (
                httpx.AsyncClient(base_url=base) as client,
                client.stream("GET", "/chat") as response,
            ):
                async for event in sse_events(response):
                    seen.append(event)
                    if event["type"] == "answer.delta":
                        break
            # the client has gone: the app's turn is cancelled and its provider request closed
            await asyncio.to_thread(loop_provider.wait_connections_closed)
        return seen

    with LoopbackThread([STALLED]) as loop_provider:
        seen = asyncio.run(main(loop_provider))
    assert [e["type"] for e in seen] == ["run.started", "answer.delta"]
    assert len(loop_provider.requests) == 1
    gc.collect()


def test_an_agent_started_from_asyncio_runs_its_async_tools_on_the_loop() -> None:
    from rillet import run_agent, tool

    from ..cli.test_cli_agents import ANSWER, tool_then_answer

    seen: list[tuple[str, bool]] = []
    loop: asyncio.AbstractEventLoop | None = None

    async def get_weather(city: str) -> str:
        """Today's weather in a city.

        Args:
            city: the city's name.
        """
        await asyncio.sleep(0.01)  # asyncio's own: the tool is written for the application's loop
        seen.append((city, asyncio.get_running_loop() is loop))
        return f"sunny in {city}"

    async def main(url: str) -> Any:
        nonlocal loop
        loop = asyncio.get_running_loop()
        agent = functools.partial(run_agent, tools=[tool(get_weather)])
        return await run_in_trio(agent, user_request, provider(url))

    user_request = TurnRequest(messages=[user("Weather in Paris?")])
    with LoopbackThread(tool_then_answer("get_weather", {"city": "Paris"})) as loop_provider:
        result = asyncio.run(main(loop_provider.url))
    assert seen == [("Paris", True)]  # it ran, on the loop that started the agent
    assert result.status == "completed", result.error
    assert result.text == "".join(ANSWER)
    assert [o.text for o in result.tool_outputs] == ["sunny in Paris"]
