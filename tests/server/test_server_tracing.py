"""`rillet serve` continues the caller's W3C trace: a request's `traceparent` (over HTTP, and on
a WebSocket's handshake) is the parent of the spans of the turn it runs, and the server's log
lines carry the trace id. The process's global tracer provider is an in-memory one here."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio
import trio_websocket
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ..server_support import serving

if TYPE_CHECKING:
    from collections.abc import Iterator

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The global tracer provider, for this test only (the API sets it once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


async def test_a_served_chat_completion_is_one_trace_with_its_caller(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        async with serving() as served:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            answer = await served.client.post(
                "/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
            )
            assert answer.status_code == 200, answer.text
    (turn,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert format(turn.context.trace_id, "032x") == TRACE
    assert turn.parent is not None
    assert format(turn.parent.span_id, "016x") == PARENT
    attempts = [s for s in spans.get_finished_spans() if s.name.startswith("attempt ")]
    assert [a.parent.span_id for a in attempts if a.parent] == [turn.context.span_id]
    lines = [r for r in caplog.records if r.name.startswith("rillet.transports.server")]
    traced = [r for r in lines if getattr(r, "fields", {}).get("trace_id") == TRACE]
    assert {r.name for r in traced} == {
        "rillet.transports.server",
        "rillet.transports.server.access",
    }
    assert any("started" in r.getMessage() for r in traced)


async def test_a_run_started_with_a_traceparent_runs_in_the_callers_trace(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"traceparent": TRACEPARENT}
            )
            assert run.status_code == 201, run.text
            await served.wait_for(run.json()["run_id"])
            untraced = await served.start()
            await served.wait_for(untraced["run_id"])
    traced, other = sorted(
        (s for s in spans.get_finished_spans() if s.name.startswith("chat ")),
        key=lambda s: format(s.context.trace_id, "032x") != TRACE,
    )
    assert format(traced.context.trace_id, "032x") == TRACE
    assert other.parent is None  # no header: a trace of its own
    ended = [r for r in caplog.records if " ended: " in r.getMessage()]
    assert len(ended) == 2
    assert [getattr(r, "fields", {}).get("trace_id") for r in ended].count(TRACE) == 1


async def test_a_websocket_handshake_carries_the_trace_into_the_log(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            url = f"{served.ws_base}/v1/runs/{run['run_id']}/ws?token={run['token']}"
            async with trio_websocket.open_websocket_url(
                url, extra_headers=[(b"traceparent", TRACEPARENT.encode())]
            ) as ws:
                await ws.get_message()
    access = [r for r in caplog.records if r.name == "rillet.transports.server.access"]
    (upgrade,) = [r for r in access if "/ws" in r.getMessage()]
    assert getattr(upgrade, "fields", {})["trace_id"] == TRACE
    assert TRACE in upgrade.getMessage()


async def test_an_agent_run_through_the_server_is_one_tree_under_its_caller(
    spans: InMemorySpanExporter,
) -> None:
    """The caller's span, the agent's `invoke_agent`, each step's turn with its attempts (the
    first failed: its cause on it) and the tool's `execute_tool`, in one trace."""
    from rillet.transports.testing import RecordedRequest, Reply, status_reply

    from ..cli.test_cli_agents import tool_then_answer

    steps = tool_then_answer("get_weather", {"city": "Paris"})

    def script(request: RecordedRequest, n: int) -> Reply:
        return status_reply(503) if n == 0 else steps(request, n)

    with trio.fail_after(20):
        async with serving(script, tools="demo") as served:
            run = await served.client.post(
                "/v1/runs", json={"prompt": "Weather?"}, headers={"traceparent": TRACEPARENT}
            )
            assert run.status_code == 201, run.text
            await served.wait_for(run.json()["run_id"])
    finished = spans.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in finished} == {TRACE}
    (agent,) = [s for s in finished if s.name == "invoke_agent"]
    assert agent.parent is not None
    assert format(agent.parent.span_id, "016x") == PARENT
    turns = [s for s in finished if s.name.startswith("chat ")]
    assert len(turns) == 2  # the call, then the answer
    assert all(t.parent is not None and t.parent.span_id == agent.context.span_id for t in turns)
    (tool,) = [s for s in finished if s.name == "execute_tool get_weather"]
    assert tool.parent is not None
    assert tool.parent.span_id == agent.context.span_id
    first = min(turns, key=lambda s: s.start_time or 0)
    attempts = sorted(
        (s for s in finished if s.parent and s.parent.span_id == first.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    assert [a.name for a in attempts] == ["attempt 1", "attempt 2"]
    assert dict(attempts[0].attributes or {})["error.type"] == "overloaded"  # the 503
    assert dict(attempts[1].attributes or {})["rillet.attempt.cause"] == "overloaded"
