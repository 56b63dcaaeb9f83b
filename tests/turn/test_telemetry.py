"""OpenTelemetry GenAI spans and metrics of whole runs over real sockets: the loopback provider
on 127.0.0.1 faulting then answering, a chain switching provider, a cancelled turn, an agent
running a tool; read back with the SDK's in-memory span exporter and metric reader, and once
exported over OTLP/HTTP to a collector on loopback (S60-S62)."""

from __future__ import annotations

import http.server
import threading
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import pytest
import trio
import trio.testing
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rillet import run_agent
from rillet._core._dialect import Provider, Secret
from rillet._turn._api import run_turn
from rillet._turn._options import RunOptions
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._telemetry import Telemetry, observe
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    refused_url,
    status_reply,
)

from ..agent_support import CASES, QUESTION
from ..agent_support import provider_at as agent_provider_at
from ..handler_support import KEY, REQUEST, policy

if TYPE_CHECKING:
    from rillet._turn._turn import Turn, TurnResult

LIMIT = 3600.0
ANSWER = Reply(chunks=(openai_text_stream(["Hel", "lo"]),))


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.02)


class Otel:
    """A tracer and a meter provider that keep everything in memory."""

    def __init__(self, *, content: bool = False) -> None:
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(
            tracer_provider=self.tracers, meter_provider=self.meters, content=content
        )

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for m in scope.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


def at(url: str) -> Provider:
    return Provider(
        dialect=OpenAIChatDialect(), base_url=url, model="test-model", api_key=Secret(KEY)
    )


def served(server: LoopbackProvider) -> Provider:
    return at(f"{server.url}/v1")


async def turn_over(provider: Provider | list[Provider], otel: Otel) -> TurnResult:
    with trio.fail_after(LIMIT):
        async with httpx.AsyncClient() as client:
            return await run_turn(
                REQUEST,
                provider,
                options=RunOptions(
                    client=client, policy=policy(), limiter=RateLimiter(), telemetry=otel.telemetry
                ),
            )


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_retried_turn_has_a_span_per_attempt_with_its_cause(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    async with open_loopback_provider([status_reply(503), ANSWER]) as server:
        result = await turn_over(served(server), otel)
    assert result.ok
    assert result.attempts == 2
    (turn,) = otel.named("chat test-model")
    attrs = dict(turn.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "test-model"
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 2
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    # what the provider said of the answering attempt's reply, not the model asked for
    assert attrs["gen_ai.response.id"] == result.response_id == "chatcmpl-loopback"
    assert attrs["gen_ai.response.model"] == result.response_model == "gpt-4o-mini-2024-07-18"
    assert "error.type" not in attrs
    assert "gen_ai.output.messages" not in attrs  # content only when the host opts in
    first, second = otel.named("attempt 1") + otel.named("attempt 2")
    assert parent_of(first) == parent_of(second) == turn.context.span_id
    assert first.context.trace_id == turn.context.trace_id
    cause = dict(first.attributes or {})["error.type"]
    assert cause == dict(second.attributes or {})["rillet.attempt.cause"]
    assert cause != "first"
    assert "error.type" not in dict(second.attributes or {})
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert duration.count == 1
    assert duration.sum > 0  # the backoff counts: virtual seconds passed
    tokens = {
        p.attributes["gen_ai.token.type"]: p.sum for p in otel.points("gen_ai.client.token.usage")
    }
    assert tokens == {"input": 12, "output": 2}
    (first_chunk,) = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert first_chunk.count == 1
    (per_chunk,) = otel.points("gen_ai.client.operation.time_per_output_chunk")
    assert per_chunk.count == 1  # two fragments: one gap


async def test_content_is_recorded_only_when_the_host_opts_in(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel(content=True)
    async with open_loopback_provider([ANSWER]) as server:
        await turn_over(served(server), otel)
    (turn,) = otel.named("chat test-model")
    recorded = str(dict(turn.attributes or {})["gen_ai.output.messages"])
    assert "Hello" in recorded
    assert KEY not in str([s.to_json() for s in otel.finished()])


async def test_a_chain_switch_holds_a_turn_span_per_provider(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    async with open_loopback_provider([ANSWER]) as server:
        result = await turn_over([at(refused_url()), served(server)], otel)
    assert result.ok
    spans = otel.named("chat test-model")
    chain = next(s for s in spans if s.parent is None)
    steps = [s for s in spans if s.parent is not None]
    assert len(steps) == 2
    assert all(parent_of(s) == chain.context.span_id for s in steps)
    failed, answered = sorted(steps, key=lambda s: s.start_time or 0)
    assert dict(failed.attributes or {})["error.type"] != ""
    assert "error.type" not in dict(answered.attributes or {})
    assert [e.name for e in chain.events] == ["fallback"]
    # the metrics count the provider turns, not the chain that held them
    assert sum(p.count for p in otel.points("gen_ai.client.operation.duration")) == 2


async def test_a_cancelled_turn_ends_its_spans_cancelled(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    stalled = Reply(chunks=(openai_text_stream(["Hel", "lo"]),), stall_after=0)
    async with open_loopback_provider([stalled]) as server, httpx.AsyncClient() as client:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                turn: Turn = await nursery.start(
                    lambda task_status: run_turn(
                        REQUEST,
                        served(server),
                        options=RunOptions(
                            client=client,
                            policy=policy(),
                            limiter=RateLimiter(),
                            telemetry=otel.telemetry,
                        ),
                        task_status=task_status,
                    )
                )
                await server.wait_for_requests(1)
                scope.cancel()
        result = await turn.result()
    assert not result.ok
    (span,) = otel.named("chat test-model")
    assert dict(span.attributes or {})["error.type"] == "cancelled"
    (attempt,) = otel.named("attempt 1")
    assert dict(attempt.attributes or {})["error.type"] == "cancelled"
    (duration,) = otel.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "cancelled"


def test_without_a_configured_provider_a_turn_makes_no_observer() -> None:
    from opentelemetry import metrics, trace

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not isinstance(metrics.get_meter_provider(), MeterProvider)
    assert observe(None, at("http://127.0.0.1:1/v1")) is None


async def get_weather(city: str = "", unit: str = "celsius") -> str:
    """Today's weather.

    Args:
        city: the city.
        unit: celsius or fahrenheit.
    """
    return f"22 degrees {unit} in {city}"


async def test_an_agent_holds_its_steps_turns_and_a_span_per_tool_run(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    case = CASES["openai-chat"]
    async with open_loopback_provider([case.tool_call, case.text]) as server:
        with trio.fail_after(LIMIT):
            result = await run_agent(
                QUESTION, agent_provider_at(server), tools=[get_weather], telemetry=otel.telemetry
            )
    assert result.status == "completed", result.code
    (agent,) = otel.named("invoke_agent")
    assert dict(agent.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
    steps = otel.named("chat test-model")
    assert len(steps) == 2
    assert all(parent_of(s) == agent.context.span_id for s in steps)
    (ran,) = otel.named("execute_tool get_weather")
    attributes = dict(ran.attributes or {})
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "get_weather"
    assert attributes["gen_ai.tool.call.id"]
    assert "gen_ai.tool.call.arguments" not in attributes
    assert parent_of(ran) == agent.context.span_id
    assert ran.context.trace_id == agent.context.trace_id


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's one route: keep each body, answer 200."""

    bodies: ClassVar[list[tuple[str, bytes]]]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.bodies.append((self.path, self.rfile.read(length)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_spans_export_over_otlp_http_to_a_collector(
    loop_clock: trio.testing.MockClock,
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    bodies: list[tuple[str, bytes]] = []
    handler = type("Receiver", (_Receiver,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    tracers = TracerProvider()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    tracers.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    try:
        async with open_loopback_provider([ANSWER]) as loopback, httpx.AsyncClient() as client:
            result = await run_turn(
                REQUEST,
                served(loopback),
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
                telemetry=Telemetry(tracer_provider=tracers),
            )
        assert result.ok
        assert await trio.to_thread.run_sync(tracers.force_flush)
    finally:
        await trio.to_thread.run_sync(tracers.shutdown)
        server.shutdown()
        server.server_close()
        thread.join()
    names = []
    for path, body in bodies:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        names += [
            span.name
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
    assert sorted(names) == ["attempt 1", "chat test-model"]


async def test_a_stream_that_breaks_after_text_resets_with_an_event(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    body = openai_text_stream(["Hel", "lo"])
    broken = Reply(chunks=(body,), drop_after_bytes=len(body) // 2)
    async with open_loopback_provider([broken, ANSWER]) as server:
        result = await turn_over(served(server), otel)
    assert result.ok
    (turn,) = otel.named("chat test-model")
    resets = [e for e in turn.events if e.name == "attempt.reset"]
    assert [dict(e.attributes or {})["rillet.attempt.number"] for e in resets] == [2]
    (second,) = otel.named("attempt 2")
    assert dict(second.attributes or {})["rillet.attempt.cause"] != "first"
    # each attempt's first chunk is timed from its own request
    assert sum(p.count for p in otel.points("gen_ai.client.operation.time_to_first_chunk")) == 2


async def test_a_rate_limit_wait_is_an_event_of_the_attempt_it_delays(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    async with open_loopback_provider([status_reply(429, retry_after=2), ANSWER]) as server:
        result = await turn_over(served(server), otel)
    assert result.ok
    (second,) = otel.named("attempt 2")
    (wait,) = [e for e in second.events if e.name == "waiting_rate_limit"]
    assert dict(wait.attributes or {})["rillet.wait_s"] == 2.0
    (first,) = otel.named("attempt 1")
    assert dict(first.attributes or {})["error.type"] == "rate_limited"


async def test_a_rescued_turn_has_a_rescue_attempt_span(
    loop_clock: trio.testing.MockClock,
) -> None:
    otel = Otel()
    rescue = Reply(chunks=(openai_text_body("Hello"),), content_type="application/json")
    stalled = Reply(chunks=(openai_text_stream(["Hel", "lo"]),), stall_headers=True)

    def script(request: RecordedRequest, number: int) -> Reply:
        return stalled if b'"stream":true' in request.body else rescue

    async with open_loopback_provider(script) as server:
        result = await turn_over(served(server), otel)
    assert result.ok, result.code
    spans = sorted(
        (s for s in otel.finished() if s.name.startswith("attempt ")), key=lambda s: s.name
    )
    last = dict(spans[-1].attributes or {})
    assert last["rillet.attempt.cause"] == "rescuing"
    assert "error.type" not in last
    assert all("error.type" in dict(s.attributes or {}) for s in spans[:-1])


async def test_a_hedged_attempt_says_so_and_which_request_answered(
    loop_clock: trio.testing.MockClock,
) -> None:
    from rillet.transports.upstream import MemoryReply, MemoryUpstream

    from .test_hedge import EVENTS, SSE

    otel = Otel()
    slow, fast = MemoryReply(EVENTS, headers=SSE, delay=10.0), MemoryReply(EVENTS, headers=SSE)
    with trio.fail_after(LIMIT):
        result = await run_turn(
            REQUEST,
            at("http://hedge.invalid/v1"),
            upstream=MemoryUpstream([slow, fast]),
            policy=policy(hedge_after=2.0),
            limiter=RateLimiter(),
            telemetry=otel.telemetry,
        )
    assert result.ok
    assert result.requests == 2
    (attempt,) = otel.named("attempt 1")
    assert dict(attempt.attributes or {})["rillet.attempt.hedged"] is True
    (hedge,) = [e for e in attempt.events if e.name == "hedge"]
    assert dict(hedge.attributes or {}) == {"rillet.hedge.won": True}


async def test_input_tokens_count_the_cached_ones_and_the_cache_is_apart(
    loop_clock: trio.testing.MockClock,
) -> None:
    """Anthropic's recorded reply: 377 uncached input tokens, 2,048 read from the cache, none
    written. The conventions' `input_tokens` counts all of them; the cache's are apart too."""
    from rillet.providers._registry import dialect_from_name
    from rillet.transports.testing import fixture_reply

    from ..wire_cases import wire_path

    otel = Otel()
    path = wire_path("anthropic-messages", "tool_use")
    async with open_loopback_provider(lambda *_: fixture_reply(path)) as server:
        anthropic = Provider(
            dialect_from_name("anthropic"), f"{server.url}/v1", "claude", api_key=Secret(KEY)
        )
        result = await turn_over(anthropic, otel)
    assert result.ok
    (turn,) = otel.named("chat claude")
    attrs = dict(turn.attributes or {})
    assert attrs["gen_ai.usage.input_tokens"] == 377 + 2048
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 2048
    assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 0
    tokens = {
        p.attributes["gen_ai.token.type"]: p.sum for p in otel.points("gen_ai.client.token.usage")
    }
    assert tokens["input"] == 377 + 2048
