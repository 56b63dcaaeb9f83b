"""The stream handler: the turn's source actor and its safety net.

Theory of operation
-------------------
One turn is a series of attempts. Before each, the handler takes a token from the rate limiter.
An attempt sends the request over the turn's upstream transport (`_upstream`: HTTP on httpx by
default, or a WebSocket, a replay, the application's own) and reads the reply piece by piece;
each piece goes through the attempt's `WireDecoder` (framing, dialect, grammar: all pure), and
the UniEvents it releases go downstream in one batch per piece. Deadlines guard only the waits
on the provider: until the first lane event, `initial_event_timeout` from sending; then
`per_event_timeout` from the last lane event (SSE comments do not count); never past the total
deadline. A send blocked by a slow consumer is backpressure, not silence: the time it spends
blocked moves the per-event and total deadlines by as much.

An attempt that fails is classified (`FailureClass`) by the failure taxonomy (`_failures`, the one
table of what is retried) and handled by its ladder:

- permanent (4xx, grammar breaches, invalid tool arguments, quota errors, a frame over the cap):
  the turn fails at once, no rescue: the same request would get the same answer;
- wrong shape (valid JSON of the wrong shape for a known event): no second streamed attempt,
  which would get the same frame again; the non-streaming rescue may still bring the reply home;
- rate-limit-shaped (429/503/529, `RateLimitError` in the stream): wait as the server says (a
  header, else the error body's hint, else 5 s); a wait over 60 s, or past the total deadline,
  or a spent budget ends the turn RateLimited at once, the error saying which bound it met
  (`wait_cap`, `time_left`); never rescued. A rate limit whose stated token limit is below
  what the request alone needs (`past_limit`) is permanent instead: no wait helps;
- transport-shaped (connect/read errors, 408, other 5xx, truncation, a frame that is not JSON,
  in-stream overloaded/server errors, stalls): back off and retry. A stall also counts a
  timeout; streaming is hopeless at the first budget spent (transport retries, consecutive
  timeouts) or when the total deadline blows, and then one non-streaming rescue request may
  bring the reply home.

`x-should-retry: false` keeps the class but stops retry and rescue; `true` sends a permanent
status down the transport ladder.

A retry voids the failed attempt. The attempt's fragments already went downstream, so the
handler owes consumers an `AttemptReset`; it sends it right before the next attempt's first
event (or the rescue's message), and only if a voided attempt had emitted anything. A run that
finally fails therefore still shows its last partial text.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

from .._core._dialect import KeptToken, Provider
from .._core._errors import OverloadedError, ProviderError, RilletError, TurnTimeout, UpstreamError
from .._core._failures import error_shape, past_limit, retry_reason
from .._core._markers import (
    AttemptOpen,
    AttemptReset,
    Batch,
    DeltaRun,
    Item,
    Outlet,
    Status,
    Verdict,
)
from .._core._policy import FailureClass, Outcome, Policy, backoff_delay
from .._core._reads import Replay, read_reply
from .._core._request import TurnRequest
from .._core._upstream import Exchange, Upstream, upstream_error
from .._core._wire import HEAD_BYTES, WireDecoder
from ._hedge import open_hedged
from ._ratelimit import RateLimiter
from ._reply_errors import (
    Failure,
    check_content_type,
    reported,
    scrubbed,
    status_failure,
    transport_error,
    usable_wait,
)

if TYPE_CHECKING:
    from .._core._dialect import HttpRequest
    from .._core._events import UniEvent

__all__ = ["Handler"]


_YIELD_EVERY = 32
"""Reads handed on without waiting between two checkpoints: a body that is all in memory (a
replay, a test transport) never yields on its own, and the turn must still let other tasks run
and notice a cancel."""
logger = logging.getLogger(__name__)

_HELD_RUNS = 64
"""With runs of deltas (`DeltaRun`), a read whose batch is one run is not handed on by itself:
only the accumulator reads runs, and no one reads it before the attempt ends (no sink, no
handle). Up to this many such runs are held and handed on with the next batch, or when the
attempt ends however it ends: one hand-over where there were many, the order unchanged."""
_RESUMES = 3
"""The most times one attempt's stream is continued by its provider before the attempt fails
as a stream that broke does (and the next one starts over)."""
_ABANDON_WITHIN = 2.0  # seconds a reply's cancel may take before it is left to expire
_DEADLINE_SLACK = 0.001
"""The per-event deadline moves only once it would move by this much (seconds): a burst of
reads does not pay for moving it on each, and it fires at most this early."""


@attrs.define(eq=False)
class Handler:
    """Runs one turn's attempts and sends its batches downstream; `run` returns the outcome.

    The attributes are the turn's facts, readable after (or during) `run`.
    """

    request: TurnRequest
    provider: Provider
    upstream: Upstream
    policy: Policy
    limiter: RateLimiter
    stream: bool = True  # False: non-streaming requests (the rescue's) instead of a stream
    started: trio.Event = attrs.field(factory=trio.Event)  # set once the first request is sent
    attempts: int = 0
    requests: int = 0
    events: int = 0  # UniEvents sent downstream
    lane_events: int = 0
    first_event_at: float | None = None
    error: BaseException | None = None  # the last error
    rescue_error: BaseException | None = None
    _rescue_failure: Failure | None = None  # an error status's verdict, read as a stream's is
    retry_after: float | None = None  # the server-directed wait that ended a RateLimited turn
    provider_finish: str | None = None  # the last attempt's own finish reason, as spelt
    cache_write: int | None = None  # the last attempt's cache-write tokens, if it said
    response_id: str = ""  # the last attempt's reply id, as the provider gave it
    response_model: str = ""  # the model that gave it, as the provider named it
    emitted_attempt: bool = False  # some attempt emitted events (partial data was seen)
    _pending_reset: bool = False
    _ever_event: bool = False  # a lane event ever arrived in this turn
    _transport_used: int = 0
    _rate_used: int = 0
    _timeouts: int = 0  # consecutive
    _start: float = 0.0
    _total_deadline: float = math.inf
    _ended: bool = False  # the last streamed attempt's body ended (rather than being cut)
    _hops: bool = False  # the grammar is downstream: batches are lanes, verdicts come back
    resumes: int = 0  # broken streams the provider continued (`_resume`)
    replay: str | None = None  # a kept reply to read again first (`run_one_turn`)
    on_kept: Callable[[str], object] | None = None  # told the id of the reply kept
    _replaying: bool = False  # this attempt reads a kept reply again

    async def run(self, out: Outlet) -> Outcome:
        """Attempt, retry, rescue; send every batch to `out`; return the one outcome. Cancelling
        the caller cancels it (the outcome is then the caller's to record)."""
        policy = self.policy
        self._hops = out.grammar_downstream
        self._start = trio.current_time()
        self._total_deadline = self._start + policy.total_timeout
        if not self.stream:
            return await self._whole(out)
        while True:
            waited = await self._take_token()
            self.attempts += 1
            if waited:
                await self._put(out, [Status("waiting_rate_limit", self.attempts, waited)])
            failure = await self._attempt(out)
            if failure is None:
                return Outcome.COMPLETED
            self.error = failure.error
            if self._replaying:  # the kept reply could not be read: ask anew, at once
                self._replaying = False
                continue
            if self._adapted(failure):
                continue  # asked again at once, without what the server refused
            hopeless = await self._next(failure, out)
            if hopeless is None:
                continue
            if hopeless is Outcome.RATE_LIMITED or not self._may_rescue(failure, hopeless):
                return hopeless
            return await self._rescue(out, hopeless)

    def _adapted(self, failure: Failure) -> bool:
        """Whether a refusal names an optional field of ours the request can do without (the
        dialect's `adapt`, once a field a base URL): the next request leaves it out. Not the
        same request again, so not the same answer paid twice: the refusal had none."""
        adapt = getattr(self.provider.dialect, "adapt", None)
        error = failure.error
        return (
            adapt is not None
            and failure.shape is FailureClass.PERMANENT
            and isinstance(error, ProviderError)
            and bool(adapt(self.provider, error))
        )

    # --- one attempt ------------------------------------------------------------------------------

    async def _take_token(self) -> float:
        return await self.limiter.acquire(
            self.provider.base_url, self.policy.requests_per_minute, self.policy.limiter_max_wait
        )

    async def _ready(self) -> None:
        """Fetch the token the dialect signs with in a worker thread when it is due (a
        `KeptToken`: a cloud's identity call blocks, seconds when the service is slow), so
        building the request finds it kept and no other stream waits on it. A cancelled wait
        leaves the fetch to finish and keep its token; its errors are the request's."""
        token = getattr(self.provider.dialect, "token_provider", None)
        if isinstance(token, KeptToken) and token.due():
            await trio.to_thread.run_sync(token, abandon_on_cancel=True)

    async def _attempt(self, out: Outlet) -> Failure | None:
        dialect = self.provider.dialect
        replay, self.replay = self.replay, None
        self._replaying = replay is not None and hasattr(dialect, "resume_request")
        try:
            await self._ready()
            if self._replaying:  # the reply the provider kept, from its start: not asked again
                http = dialect.resume_request(self.provider, (replay, -1))  # type: ignore[attr-defined]
            else:
                http = dialect.build_request(self.request, self.provider, stream=True)
        except RilletError as exc:  # the request cannot be sent as it is: no attempt helps
            return Failure(error_shape(exc), exc)
        if not self._hops:
            return await self._stream(out, http)
        await self._put(out, [cast("Item", AttemptOpen(self.attempts))])
        failure = await self._stream(out, http)
        verdict = await out.settle(close=self._ended)
        return self._judged(failure, verdict)

    def _judged(self, failure: Failure | None, verdict: Verdict) -> Failure | None:
        """An attempt's failure once the grammar downstream has judged it: its error came
        first in stream order (it only saw what the source had decoded), so it wins. (The
        grammar counts the events it releases into `events` itself, live.)"""
        if verdict.finish is not None:  # (the rescue's was read here: its grammar is ours)
            self.provider_finish = verdict.finish
            self.cache_write = verdict.cache_write
            self.response_id, self.response_model = verdict.response_id, verdict.response_model
        if verdict.error is not None:
            return self._failure_of(verdict.error, verdict.emitted)
        if failure is not None:
            return self._note(failure, verdict.emitted)
        return None

    async def _stream(self, out: Outlet, http: HttpRequest) -> Failure | None:
        """One streamed attempt: send, then read and decode until the reply ends."""
        policy = self.policy
        hops = self._hops
        self._ended = False
        decoder = WireDecoder(
            self.provider.dialect,
            max_frame=policy.max_frame,
            provider=self.provider.label,
            grammar=not hops,
        )
        grammar = decoder.grammar
        grammar.runs = runs = not hops and not out.wants_deltas  # (`DeltaRun`)
        # the reply is kept by its provider, which can continue it (OpenAI's background mode)
        keeps = not hops and getattr(self.provider.dialect, "resume", False) is True
        unsaid = keeps and self.on_kept is not None  # the kept reply's id is still to be told
        folded = 0  # `grammar.folded` as last counted
        held: list[Item] = []  # runs not handed on yet, after this attempt's reset if owed
        clock = trio.lowlevel.current_clock().current_time  # `trio.current_time`, one call fewer
        sent_at = clock()
        deadline = min(sent_at + policy.initial_event_timeout, self._total_deadline)
        emitted = 0
        response: Exchange | None = None
        pending: list[bytes] = []  # what a hedged race's winner read before it won
        failures: tuple[type[BaseException], ...] = ()  # the exchange's own (`Exchange`)
        try:
            with trio.move_on_at(deadline):
                if policy.hedge_after is None:
                    self._sent()
                    response = await self.upstream.open(http)
                else:
                    before = self.requests
                    opened = await open_hedged(
                        self.upstream,
                        http,
                        hedge_after=policy.hedge_after,
                        probe=decoder.probe,
                        on_send=self._sent,
                    )
                    response, pending = opened.exchange, opened.pieces
                    if self.requests - before > 1:  # the hedge went out: the run says which won
                        won = "hedge_won" if opened.index == 1 else "hedge_lost"
                        await self._put(out, [Status("hedged", self.attempts, reason=won)])
                    if opened.error is not None:
                        raise opened.error
            if response is None:
                return self._timed_out(emitted)
            failures = getattr(response, "failures", ())
            if response.status >= 300:
                return await status_failure(self.provider, self.policy, response, deadline)
            if check_content_type(self.provider, response):
                decoder.sniff()  # it may be the whole reply: read as one, in this request
            receive = response.receive if not pending else Replay(pending, response).receive
            # a provider that can continue a broken stream (`resume_request`) is asked to
            resumes = _RESUMES if keeps else 0
            breaks: tuple[type[BaseException], ...] = (UpstreamError, *failures) if resumes else ()
            # One scope guards every read; its deadline moves with each lane event and is lifted
            # while a batch waits for room downstream (a slow consumer is backpressure, not a
            # silent provider): the time spent blocked there is added back afterwards.
            with trio.CancelScope(deadline=deadline) as reading:
                armed = deadline  # reading.deadline, kept here (moving it is not free)
                quiet = 0  # reads since the last checkpoint of ours
                # the body's first bytes go in pieces (`WireDecoder.head_piece`), each piece's
                # events handed on before the next is decoded; `rest` is what is left of a read
                head = HEAD_BYTES
                rest = b""
                per_event = policy.per_event_timeout
                moved = False  # `armed` has moved, and the scope's deadline is still to follow
                while True:
                    if rest:
                        chunk, rest = rest, b""
                    else:
                        broken: BaseException | None = None
                        try:
                            chunk = await receive()  # b"": the end of the reply
                        except breaks as exc:
                            chunk, broken = b"", exc
                        if resumes and (broken is not None or not chunk) and not decoder.stopped:
                            resumed = await self._resume(out, decoder, response)
                            resumes -= 1
                            if resumed is not None:  # the same reply goes on: read on
                                response = resumed
                                receive = resumed.receive
                                head = 0
                                continue
                        if broken is not None:
                            raise broken
                    if head > 0:
                        cut = decoder.head_piece(chunk)
                        head -= cut or len(chunk)  # the rest counts when its turn comes
                        if cut:
                            chunk, rest = chunk[:cut], chunk[cut:]
                    batch: list[Item] = []  # UniEvents, or runs of deltas (`DeltaRun`)
                    before = decoder.lane_events
                    error: RilletError | None = None
                    try:
                        if chunk:
                            decoder.feed(chunk, batch)
                        else:
                            decoder.close(batch)
                    except RilletError as exc:
                        error = exc
                    if unsaid and decoder.lane_events != before:
                        point = decoder.resume_point()
                        if point is not None and self.on_kept is not None:
                            unsaid = False
                            self.on_kept(point[0])
                    if decoder.lane_events != before:
                        now = clock()
                        if self.first_event_at is None:
                            self.first_event_at = now - self._start
                        self._ever_event = True
                        self._timeouts = 0
                        self.lane_events += decoder.lane_events - before
                        due = now + per_event
                        if due > self._total_deadline:
                            due = self._total_deadline
                        if due - armed >= _DEADLINE_SLACK or due < armed:
                            armed = due  # set on the scope once the batch is handed on
                            moved = True
                    if batch:
                        count = len(batch)
                        if runs:  # the UniEvents its `DeltaRun`s stand for
                            count += grammar.folded - folded
                            folded = grammar.folded
                        emitted += count
                        items = self._items(batch, count)
                        if (
                            runs
                            and len(batch) == 1
                            and type(batch[0]) is DeltaRun
                            and len(held) < _HELD_RUNS
                        ):
                            held += items  # a run alone: only the accumulator reads it
                            offered = True
                        else:
                            if held:  # (a reset they hold came first: it is in them)
                                held += items
                                items, held = held, []
                            offered = out.offer(items)
                        if moved:  # (after the hand-over: the first delta does not wait for it)
                            reading.deadline = armed
                            moved = False
                        if not offered:  # room downstream: no scheduler round
                            reading.deadline = math.inf
                            blocked = trio.current_time()
                            await out.drain()
                            blocked = trio.current_time() - blocked
                            self._total_deadline += blocked
                            reading.deadline = armed = min(armed + blocked, self._total_deadline)
                            quiet = 0
                        elif rest:
                            quiet = 0  # let this piece's events reach a sink first
                            await trio.lowlevel.checkpoint()
                        else:
                            quiet += 1
                            if quiet >= _YIELD_EVERY:
                                quiet = 0
                                await trio.lowlevel.checkpoint()
                    if moved:
                        reading.deadline = armed
                        moved = False
                    if error is not None:
                        return self._failure_of(error, emitted)
                    if not chunk or (batch and decoder.stopped):  # a stop releases an event
                        self._ended = not chunk
                        self.provider_finish = grammar.provider_finish
                        self.cache_write = grammar.cache_write_tokens
                        self.response_id, self.response_model = grammar.message_id, grammar.model
                        if chunk:  # the reply is complete before its body: keep the connection
                            reading.deadline = math.inf  # complete: no deadline can undo it now
                            await _finish(response)
                        return None  # the end of the body, or of the reply: nothing more to read
                    if hops and out.failed:
                        return None  # the grammar refused the attempt: its verdict says why
            return self._timed_out(emitted)  # the deadline cut a read short
        except UpstreamError as exc:
            error = transport_error(exc, self.provider.label)
            return self._note(Failure(error_shape(error), error), emitted)
        except failures as exc:  # the exchange's own exceptions, as it names them
            failed = upstream_error(response, exc)
            assert failed is not None
            error = transport_error(failed, self.provider.label)
            return self._note(Failure(error_shape(error), error), emitted)
        except RilletError as exc:
            return self._failure_of(exc, emitted)
        finally:
            if held:  # the attempt's last runs, before anything can read the accumulator
                out.offer(held)  # (no sink, no handle: it always takes them)
            if response is not None:
                await response.aclose()
            if keeps and not decoder.stopped:
                await self._abandon(decoder)  # nobody will read it: the provider stops it

    async def _resume(
        self, out: Outlet, decoder: WireDecoder, broken: Exchange | None
    ) -> Exchange | None:
        """Ask the provider to continue a reply whose stream broke after its last event read
        (`WireDecoder.resume_point`); the new exchange, or None when it cannot (then the
        attempt fails as a broken stream does, and the next starts over)."""
        point = decoder.resume_point()
        if point is None:
            return None
        if broken is not None:
            await broken.aclose()
        await self._put(out, [Status("resuming", self.attempts, reason="connection_lost")])
        dialect: Any = self.provider.dialect
        self._sent()
        try:
            exchange = await self.upstream.open(dialect.resume_request(self.provider, point))
        except UpstreamError:
            return None
        if exchange.status != 200:  # expired, unknown, not allowed: start over
            await exchange.aclose()
            return None
        decoder.restart_framing()
        self.resumes += 1
        logger.info(
            "%s: the stream broke; the provider continues it after event %d",
            self.provider.label,
            point[1],
        )
        return exchange

    async def _abandon(self, decoder: WireDecoder) -> None:
        """Cancel, at the provider, a reply kept for resuming that nobody will read (the
        turn was cancelled, or the attempt failed): it would run on, and be paid for."""
        point = decoder.resume_point()
        if point is None:
            return
        dialect: Any = self.provider.dialect
        cancel = dialect.cancel_request(self.provider, point[0])
        quiet = contextlib.suppress(UpstreamError)
        with trio.CancelScope(shield=True), trio.move_on_after(_ABANDON_WITHIN), quiet:
            exchange = await self.upstream.open(cancel)
            await exchange.aclose()

    def _sent(self, _: int = 0) -> None:
        """A request went out (the hedge's too): it counts, and the turn has started."""
        self.requests += 1
        self.started.set()

    def _items(self, batch: Batch, count: int) -> Batch:
        """What goes downstream for `batch`, which stands for `count` UniEvents: the reset it
        owes first, if any. (With the grammar downstream, it counts the events and owes the
        resets.)"""
        if self._hops:
            return batch
        self.events += count
        self.emitted_attempt = True
        if self._pending_reset:
            self._pending_reset = False
            return [AttemptReset(self.attempts), *batch]
        return batch

    async def _send(self, out: Outlet, batch: list[UniEvent]) -> None:
        await self._put(out, self._items(cast("Batch", batch), len(batch)))

    async def _put(self, out: Outlet, items: Batch) -> None:
        """Send downstream. Time spent blocked on a slow consumer is backpressure, not the
        provider's slowness: the total deadline moves by as much."""
        if not out.offer(items):
            start = trio.current_time()
            await out.drain()
            self._total_deadline += trio.current_time() - start

    def _timed_out(self, emitted: int) -> Failure:
        now = trio.current_time()
        if now >= self._total_deadline:
            error = TurnTimeout(self.provider.label, "total", self.policy.total_timeout)
        else:
            policy = self.policy
            limit = policy.per_event_timeout if self._ever_event else policy.initial_event_timeout
            kind = "per-event" if self._ever_event else "initial-event"
            error = TurnTimeout(self.provider.label, kind, limit)
        return self._note(Failure(error_shape(error), error), emitted)  # total, or a stall

    def _failure_of(self, error: RilletError, emitted: int) -> Failure:
        error = scrubbed(self.provider, reported(self.provider, error))
        if isinstance(error, ProviderError):
            error.retry_after = usable_wait(error.retry_after)
        return self._note(Failure(error_shape(error), error), emitted)

    def _note(self, failure: Failure, emitted: int) -> Failure:
        if emitted:
            self._pending_reset = True  # owed before the next attempt's first event
        return failure

    # --- the ladders ------------------------------------------------------------------------------

    async def _next(self, failure: Failure, out: Outlet) -> Outcome | None:
        """None to retry (after any wait), or the outcome that ends streaming."""
        policy = self.policy
        if failure.shape is FailureClass.PERMANENT or failure.shape is FailureClass.WRONG_SHAPE:
            return self._failed()  # the same request would get the same answer
        if failure.shape is FailureClass.RATE_LIMIT:
            refused = past_limit(failure.error, self.request)
            if refused is not None:  # the request alone exceeds the limit: no wait helps
                failure.shape, failure.error = FailureClass.PERMANENT, refused  # nor a rescue
                self.error = refused
                return self._failed()
            error = failure.error if isinstance(failure.error, ProviderError) else None
            wait = error.retry_after if error is not None else None
            wait = wait if wait is not None else policy.retry_after_default
            now = trio.current_time()
            self.retry_after = wait
            if error is not None and wait > policy.retry_after_max:
                error.wait_cap = policy.retry_after_max  # the cause a person is told
            elif error is not None and now + wait >= self._total_deadline:
                error.time_left = self._total_deadline - now
            if (
                failure.no_retry
                or self._rate_used >= policy.rate_limit_retries
                or wait > policy.retry_after_max
                or now + wait >= self._total_deadline  # it must end before it
            ):
                return Outcome.RATE_LIMITED
            self._rate_used += 1
            # an overloaded provider (529, 503) is waited on like a rate limit, and says so
            said = "overloaded" if isinstance(failure.error, OverloadedError) else None
            await self._put(out, [Status("waiting_rate_limit", self.attempts + 1, wait, said)])
            await trio.sleep(wait)
            return None
        if failure.no_retry:
            return self._failed()
        if failure.shape is FailureClass.TOTAL:
            return Outcome.TOTAL_TIMEOUT
        if failure.shape is FailureClass.STALL:
            self._timeouts += 1
            limit = (
                policy.max_consecutive_timeouts if self._ever_event else policy.max_empty_timeouts
            )
            if self._timeouts >= limit:
                return Outcome.EVENT_TIMEOUT
        if self._transport_used >= policy.transport_retries:
            return Outcome.EVENT_TIMEOUT if failure.shape is FailureClass.STALL else self._failed()
        delay = backoff_delay(policy, self._transport_used)
        self._transport_used += 1
        reason = retry_reason(failure.error)
        await self._put(out, [Status("backing_off", self.attempts + 1, delay, reason)])
        with trio.move_on_at(self._total_deadline):
            await trio.sleep(delay)
            return None
        # the total deadline cut the backoff short
        self.error = TurnTimeout(self.provider.label, "total", policy.total_timeout)
        return Outcome.TOTAL_TIMEOUT

    def _failed(self) -> Outcome:
        return Outcome.FAILED if self._ever_event else Outcome.INIT_FAILED

    def _may_rescue(self, failure: Failure, outcome: Outcome) -> bool:
        if not self.policy.rescue or failure.no_retry:
            return False
        if failure.shape is FailureClass.PERMANENT:
            return False
        return outcome is not Outcome.RATE_LIMITED

    # --- the rescue -------------------------------------------------------------------------------

    async def _whole(self, out: Outlet) -> Outcome:
        """A turn asked not to stream: the rescue's non-streaming request, on the same ladders
        as a stream (transport retries with backoff, rate-limit waits, permanent errors once);
        a request that times out counts as a stall."""
        while True:
            await self._rescue(out, Outcome.INIT_FAILED, announce=False)
            error, self.rescue_error = self.rescue_error, None
            judged, self._rescue_failure = self._rescue_failure, None
            if error is None:
                return Outcome.COMPLETED
            self.error = error
            if judged is not None:
                failure = judged  # an error status: its header, body hint and x-should-retry
            elif isinstance(error, TurnTimeout):
                failure = Failure(FailureClass.STALL, error)
            elif isinstance(error, RilletError):
                failure = self._failure_of(error, 0)
            else:  # pragma: no cover - the rescue records only rillet's errors
                raise error
            if self._adapted(failure):
                continue  # asked again at once, without what the server refused
            hopeless = await self._next(failure, out)
            if hopeless is not None:
                return hopeless

    async def _rescue(
        self, out: Outlet, stream_outcome: Outcome, *, announce: bool = True
    ) -> Outcome:
        """One non-streaming request; its reply goes downstream as ordinary groups and a stop."""
        policy = self.policy
        self._rescue_failure = None
        if announce:
            reason = retry_reason(self.error)
            await self._put(out, [Status("rescuing", self.attempts + 1, reason=reason)])
        await self._take_token()
        start = trio.current_time()
        if start >= self._total_deadline:
            deadline = start + policy.initial_event_timeout
        else:
            deadline = min(start + policy.initial_event_timeout, self._total_deadline)
        self.attempts += 1
        self.requests += 1
        events: list[UniEvent] = []
        label = self.provider.label
        try:
            await self._ready()
            http = self.provider.dialect.build_request(self.request, self.provider, stream=False)
            with trio.move_on_at(deadline) as scope:
                response = await self.upstream.open(http)
                try:
                    if response.status >= 300:  # judged as a stream's status is (D5, F58)
                        failure = await status_failure(
                            self.provider, self.policy, response, deadline
                        )
                        self._rescue_failure = failure
                        self.rescue_error = failure.error
                        return stream_outcome
                    dialect = self.provider.dialect
                    # a server that streams anyway (it ignored `"stream": false`) is read as one
                    streamed = dialect.framing == "sse" and "text/event-stream" in (
                        response.headers.get("content-type", "").lower()
                    )
                    decoder = WireDecoder(
                        dialect, max_frame=policy.max_frame, provider=label, stream=streamed
                    )
                    await read_reply(response, decoder, events, policy.max_body)
                    self.provider_finish = decoder.grammar.provider_finish
                    self.cache_write = decoder.grammar.cache_write_tokens
                    said = decoder.grammar
                    self.response_id, self.response_model = said.message_id, said.model
                finally:
                    await response.aclose()
            if scope.cancelled_caught:
                raise TurnTimeout(label, "rescue", deadline - start)
        except UpstreamError as exc:
            self.rescue_error = transport_error(exc, self.provider.label)
            return stream_outcome
        except RilletError as exc:
            self.rescue_error = reported(self.provider, exc)
            return stream_outcome
        if self.first_event_at is None:
            self.first_event_at = trio.current_time() - self._start
        if not self._hops:
            await self._send(out, events)
            return Outcome.RESCUED
        # checked here, whole: the grammar downstream passes the events through, owing the reset
        await self._put(out, [cast("Item", AttemptOpen(self.attempts))])
        await self._send(out, events)
        self._judged(None, await out.settle(close=False))
        return Outcome.RESCUED


async def _finish(exchange: Exchange) -> None:
    """Let an exchange whose reply said it is complete end its body, if it can (`finish`, an
    optional part of the `Exchange` protocol: HTTP keeps its connection for the next request)."""
    finish = getattr(exchange, "finish", None)
    if finish is not None:
        await finish()
