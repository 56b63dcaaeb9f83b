"""Admission: how many provider streams the process runs at once (32 by default).

Every turn holds one slot for as long as it talks to its provider (its attempts, waits and
rescue), whether a host started it alone, in a chain or as an agent's step; a turn
that finds no free slot says so (`status` `queued`) and waits its turn, cancel-aware.
"""

from __future__ import annotations

import trio

__all__ = ["DEFAULT_STREAMS", "Admission", "shared_admission"]

DEFAULT_STREAMS = 32
"""Provider streams a process admits at once unless told otherwise."""


class Admission:
    """A limit on concurrent provider streams, shared by turns and agents: a
    `trio.CapacityLimiter` with a name for what it counts. Change `total` at any time."""

    def __init__(self, total: int = DEFAULT_STREAMS) -> None:
        self._limiter = trio.CapacityLimiter(total)

    @property
    def total(self) -> int:
        """How many streams may run at once."""
        return int(self._limiter.total_tokens)

    @total.setter
    def total(self, value: int) -> None:
        self._limiter.total_tokens = value

    @property
    def in_use(self) -> int:
        """Streams running now."""
        return self._limiter.borrowed_tokens

    @property
    def waiting(self) -> int:
        """Turns waiting for a slot."""
        return self._limiter.statistics().tasks_waiting

    def try_acquire(self) -> bool:
        """Take a slot for the current task if one is free."""
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    async def acquire(self) -> None:
        """Wait for a slot for the current task (first come, first served)."""
        await self._limiter.acquire()

    def release(self) -> None:
        """Give back the current task's slot."""
        self._limiter.release()


_SHARED: trio.lowlevel.RunVar[Admission] = trio.lowlevel.RunVar("rillet_admission")


def shared_admission() -> Admission:
    """The process's admission, used by every turn that is not given its own (one per trio
    run: a limiter belongs to the run that uses it)."""
    try:
        return _SHARED.get()
    except LookupError:
        admission = Admission()
        _SHARED.set(admission)
        return admission
