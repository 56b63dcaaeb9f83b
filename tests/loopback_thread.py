"""The loopback provider in a thread of its own, with its own `trio.run`: a provider outside the
program under test, for tests whose program is an asyncio one (or a subprocess)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import trio
from rillet.transports.testing import LoopbackProvider, RecordedRequest, Script

if TYPE_CHECKING:
    from types import TracebackType

WAIT = 20.0  # seconds a check may wait for the provider; a passing test takes milliseconds


class LoopbackThread:
    """`with LoopbackThread(script) as provider:` serves `provider.url` until the block ends."""

    def __init__(self, script: Script) -> None:
        self.provider = LoopbackProvider(script)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None

    @property
    def url(self) -> str:
        """Where the provider listens."""
        return self.provider.url

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests it received."""
        return list(self.provider.requests)

    def __enter__(self) -> LoopbackThread:
        self._thread.start()
        if not self._ready.wait(WAIT):
            raise RuntimeError("the loopback provider did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._scope is not None
        assert self._token is not None
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(WAIT)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.provider.serve)
                self._ready.set()

    def _run(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def wait_for_requests(self, count: int) -> None:
        """Block until the provider has recorded `count` requests (at most `WAIT` s)."""
        self._run(_within, self.provider.wait_for_requests, count)

    def wait_connections_closed(self) -> None:
        """Block until every connection to the provider is closed (at most `WAIT` s)."""
        self._run(_within, self.provider.wait_connections_closed)

    def open_connections(self) -> int:
        """How many connections to the provider are open now."""
        return int(self._run(_read, lambda: self.provider.open_connections))


async def _within(fn: Any, *args: Any) -> None:
    with trio.fail_after(WAIT):
        await fn(*args)


async def _read(fn: Any) -> Any:
    return fn()
