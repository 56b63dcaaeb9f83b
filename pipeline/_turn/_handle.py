"""A running run's handle: what a turn's, a chain's and an agent's handles have in common.

The code that runs a run makes its two logs and its cancel scope, hands them to the handle as
it makes it, writes the logs, runs inside the scope, and calls `finish` with the result once;
an application follows the logs through `uni_events()` and `run_events()`, awaits `result()`,
or calls `cancel()` (as starlette's `HTTPConnection` is the base of `Request` and `WebSocket`).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

from .._core._errors import NoHistoryError
from .._core._runevents import RunEvent
from ._graph import UniItem
from ._history import PlainLog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["RunHandle", "open_run"]

R = TypeVar("R")


@attrs.define(eq=False)
class RunHandle(Generic[R]):
    """A running run: its id, its events as they come, and how it ends.

    Attributes:
        run_id: the run's id, in every run event it sends.
        history: whether the run keeps its events for `uni_events()` and `run_events()`.
    """

    run_id: str
    history: bool = attrs.field(default=True, kw_only=True)
    _uni: PlainLog[UniItem] = attrs.field(factory=PlainLog, kw_only=True, repr=False)
    _run: PlainLog[RunEvent] = attrs.field(factory=PlainLog, kw_only=True, repr=False)
    _cancel_scope: trio.CancelScope = attrs.field(
        factory=trio.CancelScope, kw_only=True, repr=False
    )
    _done: trio.Event = attrs.field(factory=trio.Event, init=False, repr=False)
    _result: R | None = attrs.field(default=None, init=False, repr=False)

    def uni_events(self) -> AsyncIterator[UniItem]:
        """The MMSP stream (an agent's: every step's, one after another, each ended by its own
        stop): UniEvents, with an `AttemptReset` where a retry voided what came before it (drop
        that attempt's fragments). Replays from the start, then follows live. Raises
        `NoHistoryError` for a run that keeps no history."""
        self._check_history()
        return self._uni.follow()

    def run_events(self, after: int = 0) -> AsyncIterator[RunEvent]:
        """The public delivery stream, from `seq` `after + 1`, ending with `run.done`. Raises
        `NoHistoryError` for a run that keeps no history."""
        self._check_history()
        return self._run.follow(after)

    def _check_history(self) -> None:
        if not self.history:
            raise NoHistoryError(self.run_id)

    def finish(self, result: R) -> None:
        """Record how the run ended and wake whoever awaits `result()`: called once, by the
        code that runs the run."""
        self._result = result
        self._done.set()

    async def result(self) -> R:
        """Wait for the run to end; its result."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Cancel the run; it still ends with `run.done{status: "cancelled"}`."""
        self._cancel_scope.cancel()

    @property
    def done(self) -> bool:
        """Whether the run has ended."""
        return self._done.is_set()


@asynccontextmanager
async def open_run(start: Callable[..., Awaitable[object]]) -> AsyncIterator[Any]:
    """`start(task_status=...)` run in a nursery of its own for the block, its handle yielded
    once it runs; leaving the block cancels the run if it is still running (`open_turn` and
    `open_agent` are this over `run_turn` and `run_agent`)."""
    async with trio.open_nursery() as nursery:
        handle: RunHandle[Any] = await nursery.start(start)
        try:
            yield handle
        finally:
            if not handle.done:
                handle.cancel()
