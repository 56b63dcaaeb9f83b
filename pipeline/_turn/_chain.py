"""Provider chains: the next provider answers when one is rate-limited or hopeless.

A chain is an ordered list of providers. A turn that ends `RateLimited`, or that failed
before any event (streaming and the rescue both hopeless), hands the request to the next
provider; the public stream says so with a `status` `fallback` naming it (the wire's word, as
the command line's `--fallback` is), and the result says
who answered. A permanent request error (a 400, a bad key) is the request's fault, not the
provider's: it ends the chain unless `chain_on_permanent` asks otherwise.

Behind the chain, one circuit breaker per (base URL, model) (`_breakers`) skips a provider that
keeps failing.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import TYPE_CHECKING, Any

import attrs
import trio
from rillet.transports.upstream._http import default_client

from .._core._codes import error_code
from .._core._errors import ProviderError, RescueFailed, RilletError, UpstreamError
from .._core._events import UniMessage
from .._core._markers import AttemptReset
from .._core._policy import Outcome
from .._core._runevents import RunEventBuilder, StatusEvent
from ._breakers import shared_breakers
from ._history import PlainLog
from ._options import DEFAULT_OPTIONS, RunOptions
from ._runstream import RunStream, StepSink
from ._telemetry import observe
from ._turn import Turn, TurnResult, run_one_turn

if TYPE_CHECKING:
    from collections.abc import Sequence

    import httpx

    from .._core._dialect import Provider
    from .._core._request import TurnRequest
    from .._core._runevents import RunEvent
    from ._graph import UniItem

__all__ = ["ChainStep", "CircuitOpen", "chain_turn", "run_chain"]


def _permanent(error: BaseException | None) -> bool:
    if isinstance(error, RescueFailed):
        error = error.stream_error
    if not isinstance(error, ProviderError) or error.status is None:
        return False
    return 400 <= error.status < 500 and error.status not in (408, 429)


def _hopeless(result: TurnResult, chain_on_permanent: bool) -> bool:
    """Whether the next provider should answer instead."""
    if result.ok or result.outcome is Outcome.CANCELLED:
        return False
    if result.outcome is Outcome.RATE_LIMITED:
        return True
    if result.partial:
        return False
    return chain_on_permanent or not _permanent(result.error)


@attrs.frozen
class ChainStep:
    """What one chained turn gave: the result of the provider that ended it, and its sink."""

    result: TurnResult
    sink: StepSink
    requests: int  # sent by every provider the chain asked up to this one


async def chain_turn(
    run: RunStream,
    request: TurnRequest,
    providers: Sequence[Provider],
    *,
    run_id: str,
    hold_text: bool = False,
    step: int | None = None,
    options: RunOptions = DEFAULT_OPTIONS,
) -> ChainStep:
    """Run one turn into `run`, provider after provider as the chain says. With one
    provider there is no breaker and no next provider: the turn is simply run."""
    if not providers:
        raise ValueError("a chain needs at least one provider")
    chained = len(providers) > 1
    breakers = options.breakers or shared_breakers()
    chain_on_permanent = options.chain_on_permanent
    # each provider's turn keeps no history (the chain's stream does) and is no chain itself
    each = options.replace(history=False, breakers=None, chain_on_permanent=False)
    builder = run.builder
    last: ChainStep | None = None
    spent = 0
    for number, provider in enumerate(providers):
        breaker = breakers.get(provider) if chained else None
        if breaker is not None and not breaker.allow():
            continue
        if last is not None or number:
            await run.emit(
                [
                    builder.event(
                        StatusEvent,
                        phase="fallback",
                        attempt=1,
                        step=step,
                        provider=provider.label,
                        model=provider.model,
                    )
                ]
            )
        sink = run.step_sink(hold_text=hold_text)
        try:
            result = await run_one_turn(
                request,
                provider,
                sinks=[sink],
                run_id=f"{run_id}.{number + 1}",
                options=each,
            )
        except BaseException:
            if breaker is not None:
                breaker.abandoned()
            raise
        spent += result.requests
        last = ChainStep(result, sink, spent)
        hopeless = _hopeless(result, chain_on_permanent)
        if breaker is not None:
            if result.ok:
                breaker.succeeded()
            elif hopeless:
                breaker.failed()
            else:
                breaker.abandoned()
        if not hopeless:
            return last
        if number + 1 < len(providers) and (sink.delivered_text or result.events):
            # what this provider streamed is void: the next one starts afresh
            await run.emit(
                [builder.reset(result.attempts + 1)], [AttemptReset(result.attempts + 1)]
            )
    if last is None:  # every breaker was open
        raise CircuitOpen(providers)
    return last


class CircuitOpen(Exception):
    """Every provider of a chain had its circuit breaker open: nothing was asked."""

    def __init__(self, providers: Sequence[Provider]) -> None:
        super().__init__(f"every provider's circuit breaker is open ({len(providers)})")
        self.providers = list(providers)


async def run_chain(
    request: TurnRequest,
    providers: list[Provider],
    *,
    sinks: Sequence[Any] = (),
    run_id: str | None = None,
    options: RunOptions = DEFAULT_OPTIONS,
    task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
) -> TurnResult:
    """`run_turn` over a chain: one `Turn` handle and one public stream."""
    if not providers:
        raise ValueError("a chain needs at least one provider")
    history = options.history
    run_log: PlainLog[RunEvent] = PlainLog()
    uni_log: PlainLog[UniItem] = PlainLog()
    scope = trio.CancelScope()
    turn = Turn(
        run_id or secrets.token_hex(8),
        request,
        providers[0],
        history=history,
        uni=uni_log,
        run=run_log,
        cancel_scope=scope,
    )
    builder = RunEventBuilder(
        turn.run_id,
        trio.current_time,
        reasoning=options.reasoning,
        tool_arguments=options.tool_arguments,
    )
    # a span holding one per provider asked
    observer = observe(options.telemetry, providers[0], turn=False)
    if observer is not None:
        sinks = [*sinks, observer]
    stream = RunStream(builder, sinks, run_log, uni_log, history=history)
    own: httpx.AsyncClient | None = None  # one client for every provider the chain asks
    if options.client is None and options.upstream is None:
        own = default_client()
        options = options.replace(client=own)
    start = trio.current_time()
    step: ChainStep | None = None
    status, code = "cancelled", "cancelled"
    error: BaseException | None = None
    try:
        with scope:
            await stream.emit([builder.started(providers[0].label, providers[0].model)])
            task_status.started(turn)
            try:
                with observer.current() if observer is not None else contextlib.nullcontext():
                    step = await chain_turn(
                        stream,
                        request,
                        providers,
                        run_id=turn.run_id,
                        options=options,
                    )
            except CircuitOpen as exc:
                status, code = "error", "circuit_open"
                error = exc
            else:
                done = step.sink.done
                error = step.result.error
                status, code = (done.status, done.code) if done else ("error", error_code(error))
    except Exception as exc:  # a sink's own failure (or an actor's): an error, not a cancel
        status, code, error = "error", "internal_error", exc
        raise
    finally:
        result = _result(step, status, error, trio.current_time() - start)
        turn.finish(result)
        try:
            retry = result.retry_after
            # a chain stopped before a provider's result came back: what its turns said they cost
            attempts = result.attempts if step is not None else stream.attempts
            requests = result.requests if step is not None else stream.requests
            await stream.finish(
                builder.close(
                    status,
                    code,
                    attempts=attempts,
                    requests=requests,
                    retry_after=retry,
                ),
                # its own failure (a sink's) gives the sinks a cancel's grace, as a turn does
                cancelled=status == "cancelled" or code == "internal_error",
            )
        finally:
            if own is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
                    await own.aclose()
    return result


_CLOSE_GRACE = 2.0


def _result(
    step: ChainStep | None, status: str, error: BaseException | None, total: float
) -> TurnResult:
    if step is None:
        outcome = Outcome.CANCELLED if status == "cancelled" else Outcome.INIT_FAILED
        # the run's own failure (a sink's), not the providers': a bare UpstreamError too, which
        # the handler makes a TransportError whenever it comes from a provider's transport
        if error is not None and (
            not isinstance(error, RilletError) or isinstance(error, UpstreamError)
        ):
            outcome = Outcome.FAILED
        return TurnResult(
            message=UniMessage(role="assistant", content_items=[]),
            outcome=outcome,
            text="",
            attempts=0,
            requests=0,
            events=0,
            time_to_first_event=None,
            total_time=total,
            error=error,
        )
    return attrs.evolve(step.result, total_time=total, requests=step.requests)
