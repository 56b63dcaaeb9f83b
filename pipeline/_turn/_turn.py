"""The turn: its actor graph assembled in one nursery, and the handle an application holds.

```
handler (source actor) --lanes--> grammar --UniEvents--> accumulator --SinkBatch--> sink actors
  attempts, deadlines,            (_graph)               message, run events,       (one per
  retries, rescue                                        the two logs               sink)
```

With the default `Policy(graph="chained")` every actor that never blocks is chained onto the
task before it: the grammar runs in the handler's decoder, and the accumulator and every sink
that takes a batch without waiting are called on the handler's task as each batch is decoded;
only sinks that may wait keep a task behind a bounded channel. `graph="hops"` runs each actor on
its own task (`_graph.run_hops`). Either way a slow sink blocks the handler, all the way to the
provider's socket (backpressure): nothing is dropped. The two logs are append-only and read by
any number of consumers, each at its own pace, from the start.

Without an upstream the turn makes its own (`SchemeUpstream`): HTTP over the caller's
`client` (or one it makes and closes), WebSocket for `ws://` and `wss://` requests.

Cancelling the caller's scope cancels the turn: the exchange is closed, no task outlives
the nursery, and the public stream still ends with its one `run.done{status: "cancelled"}`
(the final events are delivered to the sinks under a short shielded grace period).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, TypeVar

import attrs
import msgspec
import trio
from rillet.transports.upstream._http import HttpUpstream
from rillet.transports.upstream._ws import SchemeUpstream

from .._core._accumulator import Accumulator
from .._core._codes import done_code
from .._core._cost import Price, TokenUsage, price_of, spend_cap
from .._core._dialect import Provider
from .._core._errors import CostLimitExceeded, RescueFailed, failure
from .._core._events import UniMessage
from .._core._finish import filtered_stop
from .._core._markers import Status
from .._core._policy import Outcome, Policy
from .._core._request import TurnRequest
from .._core._runevents import RunEvent, RunEventBuilder
from ._admission import shared_admission
from ._graph import (
    SINK_GRACE,
    AccumulatorActor,
    Given,
    Sink,
    SinkBatch,
    UniItem,
    finish_sinks,
    route_for,
    run_hops,
)
from ._handle import RunHandle
from ._handler import Handler
from ._history import PlainLog, RunHistory, UniHistory
from ._options import DEFAULT_OPTIONS, RunOptions
from ._ratelimit import shared_limiter
from ._telemetry import observe

if TYPE_CHECKING:
    from .._core._cost import Prices

__all__ = [
    "CallbackSink",
    "Sink",
    "SinkBatch",
    "Turn",
    "TurnResult",
    "UniItem",
    "run_one_turn",
]

T = TypeVar("T")
_DEFAULT_POLICY = Policy()  # frozen: one for every turn given none (making one costs µs)


@attrs.define(eq=False)
class CallbackSink:
    """A sink that calls the application's function with each run event (and, if given, each
    MMSP item). The callbacks are synchronous: they run on the turn's task, so keep them quick."""

    on_run_event: Callable[[RunEvent], object] | None = None
    on_uni_event: Callable[[UniItem], object] | None = None

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Call the callbacks, in order, on the turn's task."""
        self._call(batch)
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Call the callbacks, in order."""
        self._call(batch)

    def _call(self, batch: SinkBatch) -> None:
        if self.on_uni_event is not None:
            for item in batch.uni:
                self.on_uni_event(item)
        if self.on_run_event is not None:
            for event in batch.run:
                self.on_run_event(event)

    async def close(self) -> None:
        """Nothing to release."""


@attrs.frozen
class TurnResult:
    """How a turn ended.

    Attributes:
        message: the assistant message (the `.done` items, usage, finish reason); for a turn
            that failed, what the last attempt completed.
        outcome: the one outcome.
        text: the answer text as delivered (since the last reset).
        attempts: attempts made, the rescue included (one whose request could not even be
            built counts too).
        requests: HTTP requests sent to the provider, streamed attempts and the rescue: what
            the turn cost (a deterministic failure costs one).
        events: UniEvents delivered.
        time_to_first_event: seconds from the start to the first lane event, if one came.
        total_time: seconds from the start to the end.
        error: the error that ended the turn (a `RescueFailed` when the rescue failed too).
        partial: whether the answer is incomplete: events were delivered, but the turn did
            not bring a reply home (what `text` holds is a fragment).
        retry_after: the server-directed wait that ended a RateLimited turn.
        provider: the provider that answered (in a chain, the one that ended it).
        provider_finish_reason: the provider's own finish reason as it spelt it
            (`content_filter`, `SAFETY`, `end_turn`), if it gave one: what the message's
            `unknown` stands for, such as an answer its content rules cut short.
        cache_write_tokens: of the message's `prompt_tokens`, those the provider wrote to its
            prompt cache (Anthropic's `cache_creation_input_tokens`), if it said; MMSP's usage
            has no field for them. Input tokens in all are `prompt_tokens + cached_tokens`.
        response_id: the reply's id as the provider gave it (`chatcmpl-...`, `msg_...`,
            `resp_...`), what its support asks for; "" when it gave none.
        response_model: the model that answered as the provider named it (often a dated
            version of the one asked for); "" when it did not say.
        charge: what the reply cost at the run's `prices` (`RunOptions.prices`); None
            without prices, without usage, or with no price for the model.
    """

    message: UniMessage
    outcome: Outcome
    text: str
    attempts: int
    requests: int
    events: int
    time_to_first_event: float | None
    total_time: float
    error: BaseException | None = None
    partial: bool = False
    retry_after: float | None = None
    provider: Provider | None = None
    provider_finish_reason: str | None = None
    cache_write_tokens: int | None = None
    response_id: str = ""
    response_model: str = ""
    charge: Decimal | None = None

    @property
    def usage(self) -> TokenUsage | None:
        """The reply's tokens by the kinds a provider bills apart (cache reads and writes,
        reasoning); None when it reported none."""
        usage = self.message.usage_metadata
        return None if usage is None else TokenUsage.of(usage, self.cache_write_tokens)

    def cost(self, price: Prices | None = None) -> Decimal | None:
        """What the reply cost, cache reads and writes priced apart: at `price`, or at the
        run's prices when None (`charge`); None when no usage was reported (or no price
        for the model).

        Args:
            price: the model's prices (a `Price`), or a table of them (`Prices`).
        """
        if price is None:
            return self.charge
        usage = self.usage
        if usage is None:
            return None
        if isinstance(price, Price):  # one price, whatever model answered
            return price.charge(usage)
        models = (self.provider.model if self.provider is not None else "", self.response_model)
        url = self.provider.base_url if self.provider is not None else ""
        return price_of(price, usage, models, url)

    @property
    def ok(self) -> bool:
        """Whether the reply came home (streamed or rescued)."""
        return self.outcome.succeeded

    @property
    def filtered(self) -> bool:
        """Whether the reply came home cut short by the provider's content rules (its finish
        reason `unknown`, standing for `content_filter`, `SAFETY`...): the text is incomplete."""
        return self.ok and filtered_stop(self.message.finish_reason, self.provider_finish_reason)

    @property
    def code(self) -> str:
        """The safe code the turn's `run.done` carried: `completed`, or why not (one per
        cause: `authentication_failed`, `provider_unavailable`...; docs/codes.md)."""
        return done_code(self.outcome, self.error, self.message.finish_reason)

    def raise_for_outcome(self) -> TurnResult:
        """Raise the error that ended the turn if its reply did not come home; else return
        the result, so `(await run_turn(...)).raise_for_outcome()` reads as one step.

        The error is the turn's own (`error`: an `AuthenticationError`, a `TransportError`...),
        or a `RunFailed` carrying the code where none says why (a cancelled turn); either way
        its `result` is this result, partial text and cost included, and `rillet.explain(exc)`
        says in a line what happened and what to do.

        Raises:
            RilletError: the turn did not complete.
        """
        if self.ok:
            return self
        raise failure(self.error, self.code, self)


@attrs.define(eq=False)
class Turn(RunHandle["TurnResult"]):
    """A running turn: iterate its events (as many consumers as you like), await its result.

    Attributes:
        request: what the turn asked for.
        provider: who answers (a chain's first provider).
    """

    request: TurnRequest
    provider: Provider


async def run_one_turn(
    request: TurnRequest,
    provider: Provider,
    *,
    sinks: Sequence[Sink] = (),
    run_id: str | None = None,
    options: RunOptions = DEFAULT_OPTIONS,
    task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
    replay: str | None = None,
    on_kept: Callable[[str], object] | None = None,
) -> TurnResult:
    """Run one turn against one provider to its end (`run_turn` without its chain and
    callbacks, which it has already attached as a sink).

    `replay`: the id of a reply the provider keeps (a background response of
    `OpenAIResponsesDialect(resume=True)`) to read again from its start before asking anew:
    what a server taking over another's run uses, so the answer is not generated (and paid)
    twice; asked anew when it cannot be read. `on_kept`: called once, on the turn's task, with
    the id of the reply the provider keeps for this turn, as soon as it says it."""
    if options.breakers is not None or options.chain_on_permanent:
        named = [n for n in ("breakers", "chain_on_permanent") if getattr(options, n)]
        raise TypeError(f"unexpected options for one provider: {named}")
    policy = options.policy or _DEFAULT_POLICY
    slots = options.admission or shared_admission()
    reasoning, tool_arguments = options.reasoning, options.tool_arguments
    refused: CostLimitExceeded | None = None  # the run's money would not pay for the prompt
    capped = False  # the reply's tokens capped at what the run's money buys
    if options.max_cost is not None and policy.hedge_after is not None:
        policy = attrs.evolve(policy, hedge_after=None)  # a hedge may be billed too: none
    if options.max_cost is not None and options.prices is not None:
        try:
            cap = spend_cap(
                request, options.prices, provider.model, options.max_cost, url=provider.base_url
            )
        except CostLimitExceeded as exc:
            refused = exc
        else:
            if cap is not None and (request.max_tokens is None or cap < request.max_tokens):
                request = msgspec.structs.replace(request, max_tokens=cap)
                capped = True
    # without an upstream, the turn routes by scheme: HTTP over the caller's client (or its
    # own), WebSocket sessions in the turn's nursery
    upstream = options.upstream
    http: HttpUpstream | None = None
    if upstream is None:
        client = options.client
        http = HttpUpstream() if client is None else HttpUpstream.wrapping(client)
        upstream = http
    observer = observe(options.telemetry, provider)  # None unless a provider is configured
    if observer is not None:
        sinks = [*sinks, observer]
    accumulator = Accumulator()
    run_id = run_id or secrets.token_hex(8)
    # no one can read the history of a turn whose handle goes to no one (it is only handed
    # out through `task_status`): such a turn keeps none, as with `history=False`
    history = options.history and task_status is not trio.TASK_STATUS_IGNORED
    uni_log: PlainLog[UniItem]
    run_log: PlainLog[RunEvent]
    if history:  # kept whole, text fragments as spans of the answer's one copy of the text
        uni_log = uni = UniHistory(accumulator.answer)
        run_log = RunHistory(uni, run_id)
    else:
        uni_log, run_log = PlainLog(), PlainLog()
    scope = trio.CancelScope()
    turn = Turn(
        run_id, request, provider, history=history, uni=uni_log, run=run_log, cancel_scope=scope
    )
    builder = RunEventBuilder(  # reads the accumulator's text: it is kept once
        turn.run_id,
        trio.lowlevel.current_clock().current_time,  # trio's clock, one call fewer per batch
        reasoning=reasoning,
        tool_arguments=tool_arguments,
        text=accumulator.answer,
    )
    handler = Handler(
        request,
        provider,
        upstream,
        policy,
        options.limiter or shared_limiter(),
        stream=options.stream,
        replay=replay,
        on_kept=on_kept,
    )
    start = trio.current_time()
    outcome = Outcome.CANCELLED
    # per sink, how many run events and MMSP items it has been given: what a cancel leaves
    # undelivered is still owed to it, so its run events stay gapless up to `run.done`
    given = [Given() for _ in sinks]
    chained = policy.graph == "chained"
    opened = [builder.started(provider.label, provider.model)]
    run_log.extend(opened)
    failed: Exception | None = None
    try:
        with scope:
            async with trio.open_nursery() as nursery:
                if http is not None:
                    handler.upstream = SchemeUpstream(http, nursery)
                routes = [
                    route_for(sink, sink_given, nursery, policy.channel_size, chained=chained)
                    for sink, sink_given in zip(sinks, given, strict=True)
                ]
                first = SinkBatch(opened, ())
                for route in routes:
                    if not route.offer(first):
                        await route.wait(first)
                task_status.started(turn)
                accumulate = AccumulatorActor(
                    accumulator, builder, uni_log, run_log, turn.history, routes, given
                )
                if not slots.try_acquire():
                    if not accumulate.offer([Status("queued", 1)]):
                        await accumulate.drain()
                    await slots.acquire()
                try:
                    if refused is not None:  # nothing is sent: the run cannot pay for it
                        handler.error, streamed = refused, Outcome.FAILED
                    elif chained:  # the grammar and the accumulator on the handler's task
                        streamed = await handler.run(accumulate)
                    else:
                        streamed = await run_hops(handler, accumulate, policy.channel_size)
                finally:
                    slots.release()
                for route in routes:
                    if route.send is not None:
                        await route.send.aclose()
            # Only now has every batch reached the logs and the sinks: a cancel that comes
            # while they still hold some leaves the turn Cancelled, never "completed" with an
            # `answer.done` for a text its consumers did not get.
            outcome = streamed
    except Exception as exc:  # a sink's own failure (or an actor's): an error, not a cancel
        failed = exc
        raise
    finally:
        error = handler.error
        if handler.rescue_error is not None:
            error = RescueFailed(outcome, handler.error, handler.rescue_error)
        if outcome.succeeded:
            error = None
        if failed is not None:  # whatever the provider did, the run did not end well
            outcome, error = Outcome.FAILED, failed
        message = accumulator.message()
        if capped and outcome.succeeded and message.finish_reason == "length":
            assert options.max_cost is not None
            error = CostLimitExceeded(options.max_cost)  # the cap was the run's money's
        charge = None
        if message.usage_metadata is not None and options.prices is not None:
            usage = TokenUsage.of(message.usage_metadata, handler.cache_write)
            models = (provider.model, handler.response_model)
            charge = price_of(options.prices, usage, models, provider.base_url)
        final = builder.finish(
            outcome,
            error,
            attempts=handler.attempts,
            requests=handler.requests,
            retry_after=handler.retry_after,
            provider_finish=handler.provider_finish,
            usage=message.usage_metadata,
            cache_write=handler.cache_write,
            cost=charge,
        )
        if observer is not None:
            observer.responded(handler.response_id, handler.response_model, handler.cache_write)
        run_log.extend(final)
        run_log.close()
        uni_log.close()
        result = TurnResult(
            message=message,
            outcome=outcome,
            text=accumulator.text,
            attempts=handler.attempts,
            requests=handler.requests,
            events=handler.events,
            time_to_first_event=handler.first_event_at,
            total_time=trio.current_time() - start,
            error=error,
            partial=handler.emitted_attempt and not outcome.succeeded,
            retry_after=handler.retry_after if outcome is Outcome.RATE_LIMITED else None,
            provider=provider,
            provider_finish_reason=handler.provider_finish,
            cache_write_tokens=handler.cache_write,
            response_id=handler.response_id,
            response_model=handler.response_model,
            charge=charge,
        )
        turn.finish(result)
        try:
            # a turn its own failure ended gives its sinks the cancelled turn's grace, not a
            # wait however long: the sink that raised may never take another batch
            cut = outcome is Outcome.CANCELLED or failed is not None
            await finish_sinks(sinks, run_log, uni_log, given, cancelled=cut)
        finally:
            if not history:  # every sink has had its all (or its grace): nothing more is owed
                for log in (uni_log, run_log):
                    log.forget(log.end)
            if http is not None:  # closes the client only if it made it
                with trio.CancelScope(shield=True), trio.move_on_after(SINK_GRACE):
                    await http.aclose()
    return result
