"""rillet from asyncio programs: the trio pipeline in trio's guest mode, async iterators for
asyncio code.

```python
from rillet.asyncio import stream_turn

async with stream_turn(request, provider) as stream:  # UniEvents; events="run" for run events
    async for event in stream:
        ...
result = await stream.result()
```

Every turn of one asyncio loop runs in one trio run hosted by that loop (guest mode: trio's
scheduler runs as callbacks on the loop's thread), started by the first turn and stopped with
the loop. A turn's events reach the asyncio side through a bounded buffer that is one of the
turn's sinks, so a slow asyncio consumer is backpressure all the way to the provider's socket,
exactly as a slow sink is in trio. Cancelling the asyncio task that iterates the stream (or
awaits its result), or closing the stream early, cancels the turn; the call returns once the
turn has ended and its provider response is closed.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

import trio

from ._core._public import fixup_module_metadata as _fixup_module_metadata
from ._turn._api import run_turn
from ._turn._guest import GuestRun, guest_run, settled

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from types import TracebackType

    from typing_extensions import Unpack

    from ._core._dialect import Provider
    from ._core._request import TurnRequest
    from ._core._runevents import RunEvent
    from ._turn._api import TurnOptions
    from ._turn._turn import SinkBatch, Turn, TurnResult, UniItem

__all__ = ["TurnStream", "run_in_trio", "stream_turn"]

E = TypeVar("E")
T = TypeVar("T")
EventKind = Literal["uni", "run"]


@overload
def stream_turn(
    request: TurnRequest,
    provider: Provider,
    *,
    events: Literal["uni"] = "uni",
    buffer: int = 64,
    **options: Unpack[TurnOptions],
) -> TurnStream[UniItem]: ...


@overload
def stream_turn(
    request: TurnRequest,
    provider: Provider,
    *,
    events: Literal["run"],
    buffer: int = 64,
    **options: Unpack[TurnOptions],
) -> TurnStream[RunEvent]: ...


def stream_turn(
    request: TurnRequest,
    provider: Provider,
    *,
    events: EventKind = "uni",
    buffer: int = 64,
    **options: Unpack[TurnOptions],
) -> TurnStream[UniItem] | TurnStream[RunEvent]:
    """A turn for asyncio code: an async iterator of its MMSP items (`events="uni"`: UniEvents
    and `AttemptReset`s) or of its public run events (`events="run"`), and `result()`.

    The turn starts on first use (iterating, `result()`, or `async with`). `buffer` is how many
    events may wait for the consumer before the turn waits too. The options are `run_turn`'s
    (`policy`, `limiter`, `sinks`, `reasoning`, `tool_arguments`, `run_id`...); they are used on
    the trio side, so an httpx client passed as `client` must not be used by asyncio code too.
    """
    if events not in ("uni", "run"):
        raise ValueError(f"events must be 'uni' or 'run', not {events!r}")
    if buffer < 1:
        raise ValueError("buffer must be at least 1")
    if "task_status" in options:
        raise TypeError("stream_turn takes no task_status")
    return TurnStream(request, provider, events, buffer, options)


async def run_in_trio(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run a trio function from asyncio code, in this loop's trio run, and return its result.

    Cancelling the awaiting asyncio task cancels the trio task; the call returns once it has
    ended. Exceptions come out as they are."""

    async def call(scope: trio.CancelScope) -> T:
        return await async_fn(*args)

    return await guest_run().call(call)


class TurnStream(Generic[E]):
    """A turn running in this loop's trio run: iterate its events, await its result.

    One consumer iterates it; `async with` closes it at the end of the block (cancelling the
    turn if it is still running)."""

    def __init__(
        self,
        request: TurnRequest,
        provider: Provider,
        events: EventKind,
        buffer: int,
        options: TurnOptions,
    ) -> None:
        self._request = request
        self._provider = provider
        self._events = events
        self._buffer = buffer
        self._options = options
        self._items: collections.deque[E] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None  # the consumer, for items
        self._space: trio.Event | None = None  # the turn's sink, for room
        self._ended = False  # the turn's sink was closed: no more items
        self._closed = False  # the consumer closed the stream
        self._cancel_requested = False
        self._guest: GuestRun | None = None
        self._turn: Turn | None = None
        self._task: asyncio.Task[TurnResult] | None = None

    # --- the asyncio side ------------------------------------------------------------------

    def _start(self) -> asyncio.Task[TurnResult]:
        if self._task is None:
            if self._closed:
                raise RuntimeError("the stream was closed before its turn started")
            self._guest = guest_run()
            self._task = asyncio.get_running_loop().create_task(self._guest.call(self._main))
            self._task.add_done_callback(lambda _: self._wake())
        return self._task

    def __aiter__(self) -> TurnStream[E]:
        return self

    async def __anext__(self) -> E:
        if self._closed and self._task is None:
            raise StopAsyncIteration
        task = self._start()
        while not self._items:
            if self._ended or task.done() or self._closed:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                await self.aclose()
                raise
        item = self._items.popleft()
        if self._space is not None and len(self._items) < self._buffer:
            space, self._space = self._space, None
            self._call_trio(space.set)
        return item

    async def result(self) -> TurnResult:
        """Wait for the turn to end; its result (outcome `CANCELLED` after an early close).

        Needs no iteration: events nobody reads wait in the buffer, then hold the turn."""
        task = self._start()
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop reading: cancel the turn if it is still running and wait for it to end (its
        provider response closed, its sinks given `run.done`)."""
        self._closed = True
        self._items.clear()
        if self._task is None:
            return
        self._cancel_turn()
        if self._space is not None:
            space, self._space = self._space, None
            self._call_trio(space.set)
        await settled(self._task)

    async def __aenter__(self) -> TurnStream[E]:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cancel_turn(self) -> None:
        self._cancel_requested = True
        turn = self._turn
        if turn is not None and not turn.done:
            self._call_trio(turn.cancel)

    def _call_trio(self, fn: Callable[[], object]) -> None:
        if self._guest is not None:
            self._guest.run_sync_soon(fn)

    # --- the trio side ---------------------------------------------------------------------

    async def _main(self, scope: trio.CancelScope) -> TurnResult:
        options: dict[str, Any] = dict(self._options)
        sinks: Sequence[Any] = (*options.pop("sinks", ()), _StreamSink(self))
        options.setdefault("history", False)
        async with trio.open_nursery() as nursery:
            turn: Turn = await nursery.start(
                _run_turn, self._request, self._provider, sinks, options
            )
            self._turn = turn
            if self._cancel_requested:
                turn.cancel()
            return await turn.result()

    def _take(self, batch: SinkBatch) -> list[E]:
        items: Sequence[Any] = batch.uni if self._events == "uni" else batch.run
        return list(items)

    def _push(self, items: list[E]) -> None:
        if items and not self._closed:
            self._items.extend(items)
            self._wake()

    def _full(self) -> bool:
        return not self._closed and len(self._items) >= self._buffer


class _StreamSink:
    """The turn's sink feeding a `TurnStream`'s buffer, on the trio side."""

    def __init__(self, stream: TurnStream[Any]) -> None:
        self._stream = stream

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        stream = self._stream
        if stream._full():
            return False
        stream._push(stream._take(batch))
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        stream = self._stream
        while stream._full():
            space = stream._space = trio.Event()
            await space.wait()
        stream._push(stream._take(batch))

    async def close(self) -> None:
        self._stream._ended = True
        self._stream._wake()


async def _run_turn(
    request: TurnRequest,
    provider: Provider,
    sinks: Sequence[Any],
    options: dict[str, Any],
    task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
) -> None:
    await run_turn(request, provider, sinks=sinks, task_status=task_status, **options)


_fixup_module_metadata(__name__, globals())
