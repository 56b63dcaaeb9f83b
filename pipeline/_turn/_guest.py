"""One trio run inside a running asyncio loop, in trio's guest mode.

`trio.lowlevel.start_guest_run` runs trio's scheduler as callbacks on the host loop, on the host
loop's thread, with trio's I/O waits done in a worker thread. So trio code and asyncio code take
turns on one thread: trio code may resolve an asyncio future directly, and asyncio code reaches
trio through `TrioToken.run_sync_soon` (the one entry point trio allows from outside its run).

There is one guest run per asyncio loop, started by the first call that needs it and stopped
with the loop: a keeper task on the loop waits forever, so `asyncio.run`'s shutdown cancels it,
and it then cancels the trio run and waits for its end before the loop closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import outcome
import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

__all__ = ["GuestRun", "guest_run", "in_trio", "on_host", "settled"]

T = TypeVar("T")

_RUNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GuestRun] = weakref.WeakKeyDictionary()
_HOST: trio.lowlevel.RunVar[asyncio.AbstractEventLoop] = trio.lowlevel.RunVar("rillet_host")


def in_trio() -> bool:
    """Whether the caller runs in a trio task (rather than, say, an asyncio task)."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _host_uses_wakeup_fd() -> bool:
    """Whether the host already set `signal.set_wakeup_fd` (asyncio does, once a signal
    handler is added with `loop.add_signal_handler`): then trio must leave it alone."""
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread has one
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd != -1


def guest_run() -> GuestRun:
    """The running asyncio loop's guest run, made on first use."""
    loop = asyncio.get_running_loop()
    run = _RUNS.get(loop)
    if run is None or run.finished:
        run = _RUNS[loop] = GuestRun(loop)
    return run


@attrs.define(eq=False)
class GuestRun:
    """A trio run hosted by one asyncio loop: `call` runs a trio function from asyncio code."""

    loop: asyncio.AbstractEventLoop
    _ready: asyncio.Future[None] | None = None
    _ended: asyncio.Future[None] | None = None
    _token: trio.lowlevel.TrioToken | None = None
    _nursery: trio.Nursery | None = None
    _keeper: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        """Whether this run has ended (a new one is made for the next call)."""
        return self._ended is not None and self._ended.done()

    async def _start(self) -> None:
        if self._ready is None:
            self._ready = self.loop.create_future()
            self._ended = self.loop.create_future()
            trio.lowlevel.start_guest_run(
                self._main,
                run_sync_soon_threadsafe=self.loop.call_soon_threadsafe,
                run_sync_soon_not_threadsafe=self.loop.call_soon,
                done_callback=self._done,
                host_uses_signal_set_wakeup_fd=_host_uses_wakeup_fd(),
            )
            self._keeper = self.loop.create_task(self._keep(), name="rillet trio guest run")
        await asyncio.shield(self._ready)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        _HOST.set(self.loop)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            assert self._ready is not None
            self._ready.set_result(None)
            await trio.sleep_forever()

    def _done(self, result: outcome.Outcome[None]) -> None:
        self._nursery = None
        if _RUNS.get(self.loop) is self:
            del _RUNS[self.loop]  # the run holds its loop: let both go
        assert self._ended is not None
        assert self._ready is not None
        error = result.error if isinstance(result, outcome.Error) else None
        if not self._ready.done():
            self._ready.set_exception(error or RuntimeError("the trio guest run ended"))
            self._ready.exception()  # a start nobody awaited is not an unretrieved error
        if error is None:
            self._ended.set_result(None)
        else:
            self._ended.set_exception(error)

    async def _keep(self) -> None:
        """Lives as long as the loop runs its tasks; its cancellation stops the trio run."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Cancel everything running in this trio run and wait for the run to end."""
        if self._ended is None:
            return
        nursery, token = self._nursery, self._token
        if nursery is not None and token is not None:
            token.run_sync_soon(nursery.cancel_scope.cancel)
        await asyncio.shield(self._ended)
        self._ended.exception()

    def run_sync_soon(self, fn: Callable[[], object]) -> None:
        """Call `fn` in the trio run's context soon (how asyncio code sets a trio event)."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(fn)

    async def call(
        self,
        async_fn: Callable[[trio.CancelScope], Awaitable[T]],
    ) -> T:
        """Run `async_fn(scope)` as a trio task in this run and return what it returns.

        `scope` is the task's cancel scope. Cancelling the asyncio task that awaits `call`
        cancels the trio task, and `call` returns (raising `CancelledError`) only once the trio
        task has ended, so whatever it held (a provider response) is closed by then."""
        await self._start()
        token, nursery = self._token, self._nursery
        if token is None or nursery is None:
            raise RuntimeError("the trio guest run has ended")
        future: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        async def task() -> None:
            try:
                with scope:
                    value = await async_fn(scope)
            except BaseException as exc:  # handed to the asyncio side as it is
                if not future.done():
                    if isinstance(exc, trio.Cancelled):
                        future.cancel()
                    else:
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            if not future.done():
                if scope.cancelled_caught:
                    future.cancel()
                else:
                    future.set_result(value)

        token.run_sync_soon(nursery.start_soon, task)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.run_sync_soon(scope.cancel)
            await settled(future)
            raise


async def on_host(async_fn: Callable[..., Coroutine[Any, Any, T]], /, **kwargs: Any) -> T:
    """Await `async_fn(**kwargs)` where it was written to run: on the asyncio loop hosting this
    trio run, when it is a guest (an agent started through `rillet.asyncio` runs its tools on
    the application's loop, so they may await asyncio), else right here in trio.

    Cancelling the trio caller cancels the asyncio task, and returns once it has ended."""
    try:
        loop = _HOST.get()
    except LookupError:  # not a guest: trio code calls trio code
        return await async_fn(**kwargs)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    task: asyncio.Task[T] = loop.create_task(async_fn(**kwargs))  # this thread runs the loop
    task.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except BaseException:
        task.cancel()
        with trio.CancelScope(shield=True):
            await done.wait()
        raise
    return task.result()


async def settled(future: asyncio.Future[Any]) -> None:
    """Wait for `future` to resolve, even when the waiting task is cancelled meanwhile (the
    cancellation is re-raised once it has). What it raised is left to whoever awaits it."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = True
    if not future.cancelled():
        future.exception()
    if cancelled:
        raise asyncio.CancelledError
