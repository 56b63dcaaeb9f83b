"""The agent loop over real sockets: each dialect's recorded tool call runs a tool and its result
goes back in that dialect's own form; tools run concurrently, each under its own deadline; a
tool's failure is the model's to read and the public stream's to see only as a safe code;
cancelling mid-tool still ends the run with its one `run.done`; `max_steps` ends a loop that
never answers. The steps share one run id and one gapless `seq`."""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    AgentResult,
    RunEvent,
    StatusEvent,
    ToolCompleted,
    ToolStarted,
    open_agent,
    run_agent,
    tool,
)
from rillet.transports.testing import Reply, open_loopback_provider

from ..agent_support import (
    CASES,
    LIMIT,
    QUESTION,
    body_of,
    check_stream,
    kinds,
    loop_clock,
    provider_at,
    text_reply,
    tool_result_in,
)
from ..turn.test_turn_loopback import wait_closed

clock = pytest.fixture(name="loop_clock")(loop_clock)


async def get_weather(city: str = "", location: str = "", unit: str = "celsius") -> str:
    """Today's weather.

    Args:
        city: the city.
        location: or a place.
        unit: celsius or fahrenheit.
    """
    return f"22 degrees {unit} in {city or location}"


async def run_collect(
    script: list[Reply], **options: Any
) -> tuple[AgentResult, list[RunEvent], Any]:
    """Run an agent against a loopback server playing `script`; its result, its public
    events, and the server."""
    async with open_loopback_provider(script) as server:
        with trio.fail_after(LIMIT):
            dialect = options.pop("dialect", None)
            async with open_agent(QUESTION, provider_at(server, dialect), **options) as agent:
                events = [e async for e in agent.run_events()]
                result = await agent.result()
            check_stream(events, agent.run_id)
        await wait_closed(server)
    return result, events, server


@pytest.mark.parametrize("name", sorted(CASES))
async def test_every_dialect_runs_the_tool_and_sends_its_result_back_its_own_way(
    loop_clock: trio.testing.MockClock, name: str
) -> None:
    case = CASES[name]
    result, events, server = await run_collect(
        [case.tool_call, case.text], dialect=case.dialect(), tools=[get_weather]
    )
    assert result.status == "completed", (result.code, result.error)
    assert result.steps == 2
    assert len(server.requests) == 2
    expected = f"22 degrees celsius in {case.place}"
    assert tool_result_in(body_of(server, 1), name) == [(case.call_key, expected)]
    assert [o.text for o in result.tool_outputs] == [expected]
    # the second request replays the assistant's tool call before its result
    assert [m.role for m in result.conversation.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    started = [e for e in events if isinstance(e, ToolStarted)]
    completed = [e for e in events if isinstance(e, ToolCompleted)]
    assert [(e.name, e.step) for e in started] == [("get_weather", 1)]
    assert [(e.span_id, e.status, e.reason_code) for e in completed] == [
        (started[0].span_id, "ok", None)
    ]
    steps = [e.step for e in events if isinstance(e, StatusEvent) and e.phase == "step"]
    assert steps == [1, 2]
    # the model streamed the call before it ran: its own events come first
    order = kinds(events)
    assert order.index("tool_call.done") < order.index("tool.started")
    assert order.index("tool.completed") < len(order) - order[::-1].index("answer.delta") - 1
    assert result.text
    assert result.text == result.turns[-1].text


async def test_two_slow_tools_of_one_step_take_the_slower_ones_time(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def slow(seconds: float) -> str:
        await trio.sleep(seconds)
        return f"slept {seconds}"

    case = CASES["openai-chat"]
    parallel = Reply(chunks=(_two_calls("slow", {"seconds": 5}, {"seconds": 8}),))
    start = trio.current_time()
    result, events, _ = await run_collect([parallel, case.text], tools=[slow])
    assert result.status == "completed"
    durations = sorted(e.duration_ms for e in events if isinstance(e, ToolCompleted))
    assert durations == [5000, 8000]
    tools_from = next(e for e in events if isinstance(e, ToolStarted)).elapsed_ms
    step2 = next(e for e in events if isinstance(e, StatusEvent) and e.step == 2).elapsed_ms
    assert 8000 <= step2 - tools_from < 9000  # not 13 s: they ran side by side
    assert trio.current_time() - start < 9.0


async def test_a_sync_tool_runs_in_a_worker_thread(loop_clock: trio.testing.MockClock) -> None:
    threads: list[str] = []

    def lookup(city: str = "", location: str = "", unit: str = "celsius") -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return {"city": city, "degrees": 22}

    case = CASES["openai-chat"]
    sync_tool = tool(lookup, name="get_weather", timeout=None)
    result, _, server = await run_collect([case.tool_call, case.text], tools=[sync_tool])
    assert result.status == "completed"
    assert threads
    assert threads[0] != threading.main_thread().name
    results = tool_result_in(body_of(server, 1), "openai-chat")
    assert results == [(case.call_key, '{"city":"São Paulo","degrees":22}')]


async def test_a_tools_failure_goes_to_the_model_and_the_stream_sees_a_safe_code(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def get_weather(city: str) -> str:
        raise RuntimeError("secret database password is hunter2")

    case = CASES["openai-chat"]
    result, events, server = await run_collect([case.tool_call, case.text], tools=[get_weather])
    assert result.status == "completed"
    [(_, text)] = tool_result_in(body_of(server, 1), "openai-chat")
    assert text == "error: RuntimeError: secret database password is hunter2"
    [completed] = [e for e in events if isinstance(e, ToolCompleted)]
    assert (completed.status, completed.reason_code, completed.result) == (
        "error",
        "tool_error",
        None,
    )
    assert all(b"hunter2" not in _json(e) for e in events)


async def test_arguments_that_do_not_fit_the_signature_are_never_passed(
    loop_clock: trio.testing.MockClock,
) -> None:
    calls: list[Any] = []

    async def get_weather(city: int) -> str:  # the recorded call sends a city name
        calls.append(city)
        return "never"

    case = CASES["openai-chat"]
    result, events, server = await run_collect([case.tool_call, case.text], tools=[get_weather])
    assert calls == []
    [(_, text)] = tool_result_in(body_of(server, 1), "openai-chat")
    assert text.startswith("error: invalid arguments: Expected `int`")
    codes = [e.reason_code for e in events if isinstance(e, ToolCompleted)]
    assert codes == ["tool_arguments_invalid"]
    assert result.status == "completed"


async def test_an_unknown_tool_and_a_tool_past_its_deadline_are_told_to_the_model(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def stuck() -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    calls = Reply(chunks=(_calls(("stuck", {}), ("missing", {})),))
    result, events, server = await run_collect(
        [calls, CASES["openai-chat"].text], tools=[tool(stuck, timeout=30.0)]
    )
    assert result.status == "completed"
    texts = dict(tool_result_in(body_of(server, 1), "openai-chat"))
    assert texts == {
        "call_1": "error: the tool took longer than 30.0 s",
        "call_2": "error: there is no tool named 'missing'",
    }
    completed = {e.name: e for e in events if isinstance(e, ToolCompleted)}
    assert completed["stuck"].reason_code == "tool_timeout"
    assert completed["stuck"].duration_ms == 30000
    assert completed["missing"].reason_code == "unknown_tool"


async def test_opted_in_arguments_and_results_reach_the_stream(
    loop_clock: trio.testing.MockClock,
) -> None:
    case = CASES["openai-chat"]
    _, events, _ = await run_collect(
        [case.tool_call, case.text], tools=[get_weather], tool_arguments=True, tool_results=True
    )
    [started] = [e for e in events if isinstance(e, ToolStarted)]
    [completed] = [e for e in events if isinstance(e, ToolCompleted)]
    assert started.arguments == {"city": "São Paulo", "unit": "celsius"}
    assert completed.result == "22 degrees celsius in São Paulo"


async def test_cancelling_mid_tool_ends_the_run_cancelled(
    loop_clock: trio.testing.MockClock,
) -> None:
    entered = trio.Event()
    left: list[str] = []

    async def get_weather(city: str = "", unit: str = "") -> str:
        entered.set()
        try:
            await trio.sleep_forever()
        finally:
            left.append("cancelled")
        raise AssertionError("unreachable")

    case = CASES["openai-chat"]
    async with open_loopback_provider([case.tool_call, case.text]) as server:
        with trio.fail_after(LIMIT):
            async with open_agent(QUESTION, provider_at(server), tools=[get_weather]) as agent:
                await entered.wait()
                agent.cancel()
                events = [e async for e in agent.run_events()]
                result = await agent.result()
    check_stream(events, agent.run_id)
    assert left == ["cancelled"]
    assert (result.status, result.code) == ("cancelled", "cancelled")
    assert kinds(events)[-2:] == ["tool.completed", "run.done"]
    assert events[-2].status == "cancelled"  # type: ignore[union-attr]
    assert events[-1].status == "cancelled"  # type: ignore[union-attr]
    assert len(server.requests) == 1


async def test_a_sync_tool_cancelled_is_abandoned_after_its_grace_but_holds_its_capacity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from rillet._agent._tools import run_tool
    from rillet._core._events import ToolCallDone

    release = threading.Event()
    limiter = trio.CapacityLimiter(1)
    running = trio.Event()

    def blocking() -> str:
        trio.from_thread.run_sync(running.set)
        release.wait(30)
        return "done"

    call = ToolCallDone(name="blocking", arguments={}, tool_call_id="c1")
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await run_tool(tool(blocking, timeout=None), call, thread_limiter=limiter)

        nursery.start_soon(run)
        await running.wait()
        start = trio.current_time()
        scope.cancel()
    assert trio.current_time() - start == pytest.approx(2.0)  # the grace, in virtual time
    assert limiter.borrowed_tokens == 1  # abandoned, still running: its capacity is held
    release.set()
    with trio.fail_after(30):
        while limiter.borrowed_tokens:
            await trio.sleep(0.01)
            autojump_clock.jump(0)


async def test_max_steps_ends_a_loop_that_never_answers(
    loop_clock: trio.testing.MockClock,
) -> None:
    case = CASES["openai-chat"]
    result, events, server = await run_collect([case.tool_call], tools=[get_weather], max_steps=3)
    assert (result.status, result.code, result.steps) == ("error", "max_steps", 3)
    assert len(server.requests) == 3
    assert len([e for e in events if isinstance(e, ToolCompleted)]) == 2
    assert events[-1].code == "max_steps"  # type: ignore[union-attr]


async def test_a_step_that_fails_ends_the_run_with_its_code(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import Policy
    from rillet.transports.testing import status_reply

    case = CASES["openai-chat"]
    result, events, _ = await run_collect(
        [case.tool_call, status_reply(400)], tools=[get_weather], policy=Policy(rescue=False)
    )
    assert (result.status, result.code, result.steps) == ("error", "invalid_request", 2)
    assert kinds(events).count("run.started") == 1


async def test_answer_done_covers_the_whole_runs_text(loop_clock: trio.testing.MockClock) -> None:
    import hashlib

    from rillet import AnswerDelta, AnswerDone

    preamble = Reply(chunks=(_calls(("get_weather", {"city": "Oslo"}), text="Checking. "),))
    result, events, _ = await run_collect([preamble, text_reply("Cold.")], tools=[get_weather])
    text = "".join(e.delta for e in events if isinstance(e, AnswerDelta))
    assert text == "Checking. Cold."
    [done] = [e for e in events if isinstance(e, AnswerDone)]
    assert done.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert done.chars == len(text)
    assert result.text == "Cold."


def _json(event: RunEvent) -> bytes:
    from rillet import encode_json

    return encode_json(event)


def _calls(*calls: tuple[str, dict[str, Any]], text: str = "") -> bytes:
    """An OpenAI Chat stream that calls the given tools (ids `call_1`, `call_2`...)."""
    import json

    from rillet.transports.testing import sse

    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    frames: list[dict[str, Any]] = [chunk({"role": "assistant", "content": text})]
    for n, (name, arguments) in enumerate(calls):
        call = {
            "index": n,
            "id": f"call_{n + 1}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        frames.append(chunk({"tool_calls": [call]}))
    frames.append(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    frames.append({**head, "choices": [], "usage": usage})
    return sse(*frames) + sse("[DONE]")


def _two_calls(name: str, first: dict[str, Any], second: dict[str, Any]) -> bytes:
    return _calls((name, first), (name, second))


async def test_sinks_get_the_whole_runs_events_once_and_in_order(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import CallbackSink, SinkBatch

    class Slow:
        """A sink that waits on every batch (backpressure) and records what it got."""

        def __init__(self) -> None:
            self.events: list[RunEvent] = []
            self.closed = 0

        async def deliver(self, batch: SinkBatch) -> None:
            await trio.sleep(0.5)
            self.events.extend(batch.run)

        async def close(self) -> None:
            self.closed += 1

    quick: list[RunEvent] = []
    slow = Slow()
    case = CASES["openai-chat"]
    _, events, _ = await run_collect(
        [case.tool_call, case.text],
        tools=[get_weather],
        sinks=[CallbackSink(on_run_event=quick.append), slow],
    )
    assert quick == events
    assert slow.events == events
    assert slow.closed == 1


async def test_a_failing_sink_ends_the_run_as_an_error_not_a_cancel(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet import SinkBatch

    class Broken:
        async def deliver(self, batch: SinkBatch) -> None:
            if any(isinstance(e, ToolStarted) for e in batch.run):
                raise OSError("disk full")

        async def close(self) -> None:
            pass

    case = CASES["openai-chat"]
    agents: list[Any] = []

    async def run() -> None:
        async with (
            open_loopback_provider([case.tool_call, case.text]) as server,
            trio.open_nursery() as nursery,
        ):
            agent = await nursery.start(
                lambda task_status: run_agent(
                    QUESTION,
                    provider_at(server),
                    tools=[get_weather],
                    sinks=[Broken()],
                    task_status=task_status,
                )
            )
            agents.append(agent)

    with pytest.raises((OSError, ExceptionGroup)):  # the host hears of it
        await run()
    result = await agents[0].result()
    assert (result.status, result.code) == ("error", "internal_error")
    assert isinstance(result.error, OSError | ExceptionGroup)


async def add(a: int, b: int) -> str:
    """Add two numbers."""
    await trio.sleep(1.0)
    return str(a + b)


async def multiply(a: int, b: int) -> str:
    """Multiply two numbers."""
    await trio.sleep(1.0)
    return str(a * b)


async def get_stock_price(symbol: str) -> str:
    """A stock's price."""
    await trio.sleep(1.0)
    return f"{symbol} 100"


async def get_forecast(city: str, days: int) -> str:
    """A forecast."""
    await trio.sleep(1.0)
    return f"{city} {days}d"


async def get_time(timezone: str) -> str:
    """The time somewhere."""
    await trio.sleep(1.0)
    return f"noon in {timezone}"


PARALLEL = {
    "openai-chat": (
        "openai-chat/parallel_tool_calls.sse",
        [
            ("call_A1b2C3d4E5f6G7h8I9j0K1l2", "AAPL 100"),
            ("call_M3n4O5p6Q7r8S9t0U1v2W3x4", "MSFT 100"),
        ],
    ),
    "anthropic": (
        "anthropic-messages/parallel_tool_use.sse",
        [("toolu_01GrN36ErVgy85ECZ6pbzBL4", "5"), ("toolu_0113xQa4VtccyoXcHaukkzom", "6")],
    ),
    "gemini": ("gemini/parallel_function_calls.sse", [("add", "5"), ("multiply", "6")]),
    "gemini-same-function": (
        "gemini/same_function_twice.sse",
        [
            ("get_weather", "22 degrees celsius in Paris"),
            ("get_weather", "22 degrees celsius in Lyon"),
            ("get_time", "noon in Europe/Paris"),
            ("get_weather", "22 degrees celsius in Nice"),
        ],
    ),
    "openai-responses": (
        "openai-responses/parallel_tool_calls.sse",
        [
            ("call_0sl0aaaaaaaaaaaaaaaaaaaa", "22 degrees celsius in Oslo"),
            ("call_B3rg3nbbbbbbbbbbbbbbbbbb", "22 degrees celsius in Bergen"),
        ],
    ),
    "ollama": (
        "ollama-chat/parallel_tool_calls.ndjson",
        [("call_p0rt0a11", "Lisbon 2d"), ("call_p0rt0b22", "Porto 2d")],
    ),
}


@pytest.mark.parametrize("name", sorted(PARALLEL))
async def test_every_dialect_sends_a_steps_results_back_together_in_call_order(
    loop_clock: trio.testing.MockClock, name: str
) -> None:
    from rillet.transports.testing import fixture_reply

    from ..agent_support import FIXTURES

    recorded, expected = PARALLEL[name]
    dialect = name.removesuffix("-same-function")
    case = CASES[dialect]
    tools = [add, multiply, get_stock_price, get_forecast, get_time, get_weather]
    start = trio.current_time()
    result, events, server = await run_collect(
        [fixture_reply(FIXTURES / recorded), case.text], dialect=case.dialect(), tools=tools
    )
    assert result.status == "completed", result.code
    assert tool_result_in(body_of(server, 1), dialect) == expected
    results = result.conversation.messages[2]
    assert results.role == "user"
    assert len(results.content_items) == len(expected)  # one message holds them all
    assert trio.current_time() - start < 1.5  # the calls of one step ran side by side
    spans = [e.span_id for e in events if isinstance(e, ToolCompleted)]
    assert len(set(spans)) == len(expected)


async def test_two_tools_of_one_name_are_refused_before_any_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def lookup(city: str) -> str:
        return city

    async with open_loopback_provider([text_reply("x")]) as server:
        provider = provider_at(server)
        with pytest.raises(ValueError, match="'get_weather'"):
            await run_agent(
                QUESTION, provider, tools=[get_weather, tool(lookup, name="get_weather")]
            )
    assert server.requests == []


@pytest.mark.parametrize("choice", ["required", ["get_weather"]])
async def test_a_forced_tool_choice_holds_until_a_tool_is_called_then_is_auto(
    loop_clock: trio.testing.MockClock, choice: Any
) -> None:
    case = CASES["openai-chat"]
    forced = msgspec.structs.replace(QUESTION, tool_choice=choice)
    script = [case.tool_call, case.tool_call, text_reply("Warm.")]
    async with open_loopback_provider(script) as server:
        with trio.fail_after(LIMIT):
            result = await run_agent(forced, provider_at(server), tools=[get_weather])
        await wait_closed(server)
    assert (result.status, result.steps) == ("completed", 3)
    sent = [body_of(server, n).get("tool_choice") for n in range(3)]
    assert sent[0] not in (None, "auto")
    assert sent[1:] == ["auto", "auto"]


async def test_reset_tool_choice_off_sends_the_forced_choice_on_every_step(
    loop_clock: trio.testing.MockClock,
) -> None:
    case = CASES["openai-chat"]
    forced = msgspec.structs.replace(QUESTION, tool_choice="required")
    async with open_loopback_provider([case.tool_call] * 3) as server:
        with trio.fail_after(LIMIT):
            result = await run_agent(
                forced,
                provider_at(server),
                tools=[get_weather],
                max_steps=3,
                reset_tool_choice=False,
            )
        await wait_closed(server)
    assert (result.status, result.code) == ("error", "max_steps")
    assert [body_of(server, n)["tool_choice"] for n in range(3)] == ["required"] * 3
