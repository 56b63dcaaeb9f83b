"""The client side of the run events a turn tool sends in its progress notifications: a
dispatcher that routes them to their call by correlation id and hands them on in `seq` order.

The MCP client SDK runs each notification's handler in a task of its own, so notifications may
reach the handler out of order even though they left the server in order, and the call's
result may come back before the last of them. The dispatcher puts each call's events back in
order within a bounded buffer: a duplicate is ignored, an event that arrives early waits for
the ones before it, and a gap that the buffer cannot bridge (more events waiting than it
holds, or events still missing when the result says the run is over and `settle` seconds have
passed) raises `RunEventGap` in the consumer. Nothing is dropped silently.
"""

from __future__ import annotations

import collections
import secrets
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import anyio
import attrs
import msgspec
from mcp_types import CallToolResult, ProgressNotification

from .._core._errors import RilletError, RunEventGap
from .._core._runevents import RunDone, RunEvent, decode_run_event
from ._server import CORRELATION_ID_KEY, LAST_SEQ_KEY, RUN_EVENT_KEY, RUN_EVENTS_KEY

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from mcp import Client
    from mcp_types import RequestParamsMeta

__all__ = ["RunEventDispatcher", "RunEvents"]


@attrs.define(eq=False)
class RunEvents:
    """One call's run events, in `seq` order: an async iterator that ends after `run.done`.

    Attributes:
        correlation_id: the id the call was made with.
        result: the tool's result, once it came.
        duplicates: events that came twice (ignored).
    """

    correlation_id: str
    _buffer: int
    _settle: float
    result: CallToolResult | None = None
    duplicates: int = 0
    _next: int = 1
    _last: int | None = None  # the seq of run.done, once known
    _early: dict[int, RunEvent] = attrs.field(factory=dict)
    _ready: collections.deque[RunEvent] = attrs.field(factory=collections.deque)
    _error: BaseException | None = None
    _changed: anyio.Event = attrs.field(factory=anyio.Event)

    def feed(self, event: RunEvent) -> None:
        """Take one event as it arrived."""
        seq = event.seq
        if seq < self._next or seq in self._early:
            self.duplicates += 1
            return
        if isinstance(event, RunDone):
            self._last = seq
        self._early[seq] = event
        while self._next in self._early:
            self._ready.append(self._early.pop(self._next))
            self._next += 1
        if len(self._early) > self._buffer and self._error is None:
            self._error = RunEventGap(self.correlation_id, self._next, len(self._early))
        self._wake()

    def finish(self, result: CallToolResult | None, error: BaseException | None = None) -> None:
        """The call is over: its result (which names the last `seq`), or why it failed."""
        self.result = result
        meta = (result.meta or {}) if result is not None else {}
        last = meta.get(LAST_SEQ_KEY)
        if isinstance(last, int) and not isinstance(last, bool):
            self._last = last
        elif self._last is None:
            self._last = self._next - 1  # the server sent no run events: nothing is owed
        if error is not None and self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def drained(self) -> bool:
        """Whether every event up to `run.done` has been handed on."""
        return self._complete and not self._ready

    @property
    def _complete(self) -> bool:
        return self._last is not None and self._next > self._last

    def __aiter__(self) -> RunEvents:
        return self

    async def __anext__(self) -> RunEvent:
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._error is not None:
                raise self._error
            if self._complete:
                raise StopAsyncIteration
            if self.result is not None:  # over, with events still in flight or lost
                changed = self._changed
                with anyio.move_on_after(self._settle):
                    await changed.wait()
                if not self._ready and not self._complete and self._error is None:
                    self._error = RunEventGap(self.correlation_id, self._next, len(self._early))
                continue
            await self._changed.wait()


@attrs.define(eq=False)
class RunEventDispatcher:
    """Routes the run events of turn-tool calls to each call's `RunEvents`.

    Pass `handle` as the MCP client's `message_handler` (`Client(..., message_handler=
    dispatcher.handle)`), then `async with dispatcher.call(client, {"prompt": ...}) as events`.

    Attributes:
        buffer: how many events may wait for a missing one before it is a `RunEventGap`.
        settle: seconds to wait, once the result came, for events still in flight.
        unrouted: notifications with run events for no open call (after it was closed).
    """

    buffer: int = 256
    settle: float = 2.0
    unrouted: int = 0
    _runs: dict[str, RunEvents] = attrs.field(factory=dict)

    def open(self, correlation_id: str | None = None) -> RunEvents:
        """Register a call about to be made; its events (route them with `request_meta`)."""
        cid = correlation_id or secrets.token_hex(8)
        if cid in self._runs:
            raise ValueError(f"a call with correlation id {cid!r} is already open")
        run = self._runs[cid] = RunEvents(cid, self.buffer, self.settle)
        return run

    def close(self, run: RunEvents) -> None:
        """Stop routing events to `run`."""
        if self._runs.get(run.correlation_id) is run:
            del self._runs[run.correlation_id]

    @staticmethod
    def request_meta(run: RunEvents) -> dict[str, Any]:
        """The request `_meta` that asks the server for run events with this call's id."""
        return {RUN_EVENTS_KEY: True, CORRELATION_ID_KEY: run.correlation_id}

    async def handle(self, message: object) -> None:
        """The client's message handler: route a progress notification's run event; ignore
        anything else."""
        if not isinstance(message, ProgressNotification):
            return
        meta: Mapping[str, Any] = message.params.meta or {}
        raw = meta.get(RUN_EVENT_KEY)
        cid = meta.get(CORRELATION_ID_KEY)
        if raw is None or not isinstance(cid, str):
            return
        run = self._runs.get(cid)
        if run is None:
            self.unrouted += 1
            return
        try:
            event = decode_run_event(msgspec.json.encode(raw))
        except msgspec.ValidationError as exc:
            run.finish(run.result, RilletError(f"a run event that does not decode: {exc}"))
            return
        run.feed(event)

    @asynccontextmanager
    async def call(
        self,
        client: Client,
        arguments: dict[str, Any],
        *,
        tool: str = "run_turn",
        correlation_id: str | None = None,
    ) -> AsyncIterator[RunEvents]:
        """Call the turn tool and iterate its run events in order; `events.result` is the
        tool's result once the iteration has ended. Leaving the block early cancels the call
        (the SDK sends `notifications/cancelled`, which cancels the turn)."""
        run = self.open(correlation_id)

        async def noop(progress: float, total: float | None, message: str | None) -> None:
            """A progress callback, so the SDK sends a progress token."""

        async def call() -> None:
            try:
                meta = cast("RequestParamsMeta", self.request_meta(run))
                result = await client.call_tool(tool, arguments, progress_callback=noop, meta=meta)
            except Exception as exc:
                run.finish(None, exc)
            else:
                run.finish(result)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(call)
                try:
                    yield run
                except BaseException:
                    tasks.cancel_scope.cancel()
                    raise
                if not run.drained:  # left early: the call is abandoned
                    tasks.cancel_scope.cancel()
        finally:
            self.close(run)
