"""OpenTelemetry GenAI spans and streaming metrics, read off a run's own events.

With `opentelemetry-api` installed (the `otel` extra) and a tracer or meter provider configured,
the process's global one or the one `RunOptions(telemetry=Telemetry(...))` names, a run gets one
observer: a sink like any other, fed the run events the turn makes anyway. It opens a
`chat {model}` span per turn (a chain's turn holds one per provider it asked), a child span per
attempt naming why it began (`rillet.attempt.cause`: the retry reason, `rescuing`, `resuming`),
span events for resets and rate-limit waits, an `invoke_agent` span per agent run with an
`execute_tool {name}` span per tool, and records the GenAI client metrics (operation duration,
token usage, time to the first chunk and per output chunk). Without a provider a turn pays one
check when it starts and nothing per event: no observer is made.

Message content stays out unless the host opts in (`content=True`, and then only what the run's
public stream shows); keys never come near it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import weakref
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._core._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    ReasoningDelta,
    RunDone,
    StatusEvent,
    ToolCompleted,
    ToolStarted,
    UsageEvent,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.context import Context
    from opentelemetry.metrics import Histogram
    from opentelemetry.trace import Span, Tracer

    from .._core._dialect import Provider
    from ._graph import SinkBatch

__all__ = ["RunObserver", "Telemetry", "observe"]

_SCOPE = "rillet"
# what the API hands out before a host sets a provider: a run reports nowhere then
_UNSET = frozenset(
    {"ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider"}
)
# the phases after which a new attempt begins, and what began it when the status names no reason
_NEXT_ATTEMPT = {"backing_off": "retry", "rescuing": "rescue", "resuming": "resume"}
_WAITS = ("waiting_rate_limit", "queued")
# OpenTelemetry's well-known `gen_ai.provider.name` values, by the dialect's name
_PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "openai": "openai",
    "ollama": "ollama",
}


@attrs.frozen(kw_only=True)
class Telemetry:
    """Where a run's OpenTelemetry spans and metrics go, when not the process's global providers.

    Args:
        tracer_provider: an `opentelemetry.trace.TracerProvider`; the global one when None.
        meter_provider: an `opentelemetry.metrics.MeterProvider`; the global one when None.
        content: record the answer text (`gen_ai.output.messages`) and, where the run shows
            them, tool arguments and results. Off by default: content is the host's to share.
    """

    tracer_provider: Any = None
    meter_provider: Any = None
    content: bool = False


@attrs.define(eq=False)
class _Instruments:
    duration: "Histogram"
    tokens: "Histogram"
    first_chunk: "Histogram"
    per_chunk: "Histogram"


_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_tracers: weakref.WeakKeyDictionary[Any, Tracer] = weakref.WeakKeyDictionary()


def _configured(telemetry: Telemetry | None) -> tuple[Any, Any]:
    """The tracer and meter providers a run reports to; None for one not configured."""
    tracers = meters = None
    if telemetry is not None:
        tracers, meters = telemetry.tracer_provider, telemetry.meter_provider
    if tracers is None and (trace := sys.modules.get("opentelemetry.trace")) is not None:
        tracers = trace.get_tracer_provider()
        if type(tracers).__name__ in _UNSET:
            tracers = None
    if meters is None and (metrics := sys.modules.get("opentelemetry.metrics")) is not None:
        meters = metrics.get_meter_provider()
        if type(meters).__name__ in _UNSET:
            meters = None
    return tracers, meters


def _instruments_of(meters: Any) -> _Instruments:
    found = _instruments.get(meters)
    if found is None:
        meter = meters.get_meter(_SCOPE)
        found = _instruments[meters] = _Instruments(
            meter.create_histogram(
                "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
            ),
            meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used",
            ),
            meter.create_histogram(
                "gen_ai.client.operation.time_to_first_chunk",
                unit="s",
                description="Time from the request to the first chunk of the stream",
            ),
            meter.create_histogram(
                "gen_ai.client.operation.time_per_output_chunk",
                unit="s",
                description="Time from one output chunk to the next",
            ),
        )
    return found


def _tracer_of(tracers: Any) -> Tracer:
    found = _tracers.get(tracers)
    if found is None:
        found = _tracers[tracers] = tracers.get_tracer(_SCOPE)
    return found


def provider_name(provider: Provider) -> str:
    """`gen_ai.provider.name` for a provider: OpenTelemetry's word for it where it has one."""
    name = provider.dialect.name.lower()
    for key, value in _PROVIDER_NAMES.items():
        if key in name:
            return value
    return name


def observe(
    telemetry: Telemetry | None, provider: Provider, operation: str = "chat", *, turn: bool = True
) -> RunObserver | None:
    """The run's observer when a tracer or meter provider is configured, else None (and the run
    does no telemetry work at all). `operation` is `chat` or `invoke_agent`; `turn` False for a
    run whose turns observe themselves (a chain, an agent): its span only holds theirs."""
    tracers, meters = _configured(telemetry)
    if tracers is None and meters is None:
        return None
    return RunObserver(
        tracer=_tracer_of(tracers) if tracers is not None else None,
        instruments=_instruments_of(meters) if meters is not None else None,
        content=telemetry.content if telemetry is not None else False,
        operation=operation,
        provider=provider_name(provider),
        model=provider.model,
        turn=turn and operation == "chat",
    )


@attrs.define(eq=False)
class RunObserver:
    """A sink that turns a run's events into spans and metrics. `chat` observers open an attempt
    span per attempt and record the metrics; `invoke_agent` ones a span per tool run."""

    tracer: "Tracer | None"
    instruments: _Instruments | None
    content: bool
    operation: str
    provider: str
    model: str
    turn: bool = True
    span: "Span | None" = None
    _attempt: "Span | None" = None
    _attempt_at: float = 0.0
    _number: int = 0
    _last_chunk: float | None = None
    _started: float = 0.0
    _tools: "dict[str, Span]" = attrs.Factory(dict)
    _usage: UsageEvent | None = None
    _text: list[str] = attrs.Factory(list)
    _finish: str | None = None
    _ended: bool = False

    def __attrs_post_init__(self) -> None:
        self._started = self._attempt_at = trio.current_time()
        if self.tracer is None:
            return
        from opentelemetry.trace import SpanKind

        name = self.operation if self.operation == "invoke_agent" else f"chat {self.model}"
        self.span = self.tracer.start_span(
            name,
            kind=SpanKind.CLIENT if self.operation == "chat" else SpanKind.INTERNAL,
            attributes=self._common(),
        )
        if self.turn:
            self._open_attempt(1, "first")

    def _common(self) -> dict[str, Any]:
        return {
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.model,
        }

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Make the run's span the current one while the block runs, so the turns a chain or an
        agent runs inside it are its children."""
        if self.span is None:
            yield
            return
        from opentelemetry import context, trace

        token = context.attach(trace.set_span_in_context(self.span))
        try:
            yield
        finally:
            context.detach(token)

    def _child(self, name: str, attributes: dict[str, Any]) -> Span:
        from opentelemetry import trace

        assert self.tracer is not None
        assert self.span is not None
        parent: Context = trace.set_span_in_context(self.span)
        return self.tracer.start_span(name, context=parent, attributes=attributes)

    def _open_attempt(self, number: int, cause: str) -> None:
        self._attempt_at, self._last_chunk, self._number = trio.current_time(), None, number
        if self.span is None:
            return
        self._attempt = self._child(
            f"attempt {number}",
            {
                **self._common(),
                "rillet.attempt.number": number,
                "rillet.attempt.cause": cause,
            },
        )

    def _close_attempt(self, error: str | None) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        if error is not None:
            from opentelemetry.trace import StatusCode

            attempt.set_attribute("error.type", error)
            attempt.set_status(StatusCode.ERROR)
        attempt.end()

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Read the batch's run events (on the turn's task: no task, no wait)."""
        for event in batch.run:
            kind = type(event)
            if kind is AnswerDelta or kind is ReasoningDelta:
                self._chunk(event)  # type: ignore[arg-type]
            elif kind is StatusEvent:
                self._status(event)  # type: ignore[arg-type]
            elif kind is AttemptResetEvent:
                if self.span is not None:
                    self.span.add_event("attempt.reset", {"rillet.attempt.number": event.attempt})  # type: ignore[union-attr]
                self._text.clear()
            elif kind is UsageEvent:
                self._usage = event  # type: ignore[assignment]
            elif kind is AnswerDone:
                self._finish = event.finish_reason  # type: ignore[union-attr]
            elif kind is ToolStarted:
                self._tool_started(event)  # type: ignore[arg-type]
            elif kind is ToolCompleted:
                self._tool_completed(event)  # type: ignore[arg-type]
            elif kind is RunDone:
                self._done(event)  # type: ignore[arg-type]
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Read the batch's run events."""
        self.deliver_nowait(batch)

    async def close(self) -> None:
        """End whatever a run stopped short of `run.done` left open."""
        self._end("cancelled")

    def _chunk(self, event: AnswerDelta | ReasoningDelta) -> None:
        now = trio.current_time()
        if self.instruments is not None and self.turn:
            last, attributes = self._last_chunk, self._metric_attributes(None)
            if last is None:
                self.instruments.first_chunk.record(now - self._attempt_at, attributes)
            else:
                self.instruments.per_chunk.record(now - last, attributes)
        self._last_chunk = now
        if self.content and type(event) is AnswerDelta:
            self._text.append(event.delta)

    def _status(self, event: StatusEvent) -> None:
        phase = event.phase
        # a rate-limit wait before a retry names the attempt it waits for; one before any
        # request (the client-side limiter) the attempt that is already open
        retry = phase in _NEXT_ATTEMPT or (
            phase == "waiting_rate_limit" and event.attempt > self._number
        )
        if retry and self.turn:
            cause = event.reason_code or _NEXT_ATTEMPT.get(phase, "rate_limited")
            self._close_attempt(cause)
            self._open_attempt(event.attempt, phase if phase in ("rescuing", "resuming") else cause)
            if self._attempt is not None and event.delay_ms:
                self._attempt.set_attribute("rillet.attempt.delay_s", event.delay_ms / 1000)
        if phase in _WAITS and self.span is not None:
            attributes: dict[str, Any] = {"rillet.wait_s": (event.delay_ms or 0) / 1000}
            if event.reason_code:
                attributes["rillet.reason"] = event.reason_code
            (self._attempt or self.span).add_event(phase, attributes)
        elif phase == "hedged" and self._attempt is not None:
            won = event.reason_code == "hedge_won"
            self._attempt.add_event("hedge", {"rillet.hedge.won": won})
            self._attempt.set_attribute("rillet.attempt.hedged", True)
        elif phase == "fallback" and self.span is not None:
            self.span.add_event(
                "fallback",
                {"gen_ai.request.model": event.model or "", "rillet.step": event.step or 0},
            )

    def responded(self, response_id: str, model: str, cache_write: int | None = None) -> None:
        """The reply's id and the model that answered, as the provider said them
        (`gen_ai.response.id`, `gen_ai.response.model`), and the prompt tokens it wrote to its
        cache (`gen_ai.usage.cache_creation.input_tokens`), before the run's end."""
        if self.span is None or self._ended:
            return
        if cache_write is not None:
            self.span.set_attribute("gen_ai.usage.cache_creation.input_tokens", cache_write)
        if response_id:
            self.span.set_attribute("gen_ai.response.id", response_id)
        if model:
            self.span.set_attribute("gen_ai.response.model", model)

    def _tool_started(self, event: ToolStarted) -> None:
        if self.span is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": event.name,
            "gen_ai.tool.call.id": event.tool_call_id,
            "gen_ai.tool.type": "function",
        }
        if self.content and event.arguments is not None:
            attributes["gen_ai.tool.call.arguments"] = json.dumps(event.arguments)
        self._tools[event.span_id] = self._child(f"execute_tool {event.name}", attributes)

    def _tool_completed(self, event: ToolCompleted) -> None:
        span = self._tools.pop(event.span_id, None)
        if span is None:
            return
        if event.status != "ok":
            from opentelemetry.trace import StatusCode

            span.set_attribute("error.type", event.reason_code or event.status)
            span.set_status(StatusCode.ERROR)
        if self.content and event.result is not None:
            span.set_attribute("gen_ai.tool.call.result", event.result)
        span.end()

    def _metric_attributes(self, error: str | None) -> dict[str, Any]:
        attributes = self._common()
        if error is not None:
            attributes["error.type"] = error
        return attributes

    def _done(self, event: RunDone) -> None:
        error = None if event.status == "completed" else event.code
        if self.instruments is not None and self.turn:
            attributes = self._metric_attributes(error)
            self.instruments.duration.record(trio.current_time() - self._started, attributes)
            usage = self._usage
            if usage is not None:
                for kind, count in (
                    ("input", _input_tokens(usage)),
                    ("output", usage.response_tokens),
                ):
                    if count is not None:
                        self.instruments.tokens.record(
                            count, {**attributes, "gen_ai.token.type": kind}
                        )
        span = self.span
        if span is not None and not self._ended:
            span.set_attribute("rillet.attempts", event.attempts)
            span.set_attribute("rillet.requests", event.requests)
            if self._finish is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [self._finish])
            usage = self._usage
            if usage is not None and (counted := _input_tokens(usage)) is not None:
                span.set_attribute("gen_ai.usage.input_tokens", counted)
            if usage is not None and usage.cached_tokens is not None:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
            if usage is not None and usage.response_tokens is not None:
                span.set_attribute("gen_ai.usage.output_tokens", usage.response_tokens)
            if self.content and self.turn:
                message = {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": "".join(self._text)}],
                }
                if self._finish is not None:
                    message["finish_reason"] = self._finish
                span.set_attribute("gen_ai.output.messages", json.dumps([message]))
        self._end(error)

    def _end(self, error: str | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._close_attempt(error)
        for span in self._tools.values():
            span.set_attribute("error.type", error or "cancelled")
            span.end()
        self._tools.clear()
        if self.span is not None:
            if error is not None:
                from opentelemetry.trace import StatusCode

                self.span.set_attribute("error.type", error)
                self.span.set_status(StatusCode.ERROR)
            self.span.end()


def _input_tokens(usage: UsageEvent) -> int | None:
    """`gen_ai.usage.input_tokens` as the conventions count it: every input token, those read
    from the provider's cache included (MMSP's `prompt_tokens` leaves them out)."""
    if usage.prompt_tokens is None:
        return None
    return usage.prompt_tokens + (usage.cached_tokens or 0)
