"""Stdout's reader: a command whose output no one reads any more stops its run.

`rillet run … | head -c 20` leaves after twenty bytes; the turn would otherwise go on to its
end, paid for, with every later write failing (`BrokenPipeError`, which the sinks note as
`broken_pipe`). A watched sink sets an event the moment it notes that, and the command cancels
its run on it: the provider request is closed within a write of the reader leaving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._turn._turn import SinkBatch

__all__ = ["ReaderGone", "cancel_when_gone"]


@attrs.define(eq=False)
class ReaderGone:
    """A sink that writes to stdout, watched: once stdout's reader has gone (`rillet run … |
    head`), `gone` is set and the run is stopped, since no one reads what it would go on paying
    for."""

    sink: Any
    gone: trio.Event = attrs.field(factory=trio.Event)

    @property
    def broken_pipe(self) -> bool:
        """Whether stdout's reader went away."""
        return bool(getattr(self.sink, "broken_pipe", False))

    async def deliver(self, batch: SinkBatch) -> None:
        """Pass the batch on; note a reader that went away."""
        await self.sink.deliver(batch)
        if self.broken_pipe:
            self.gone.set()

    async def close(self) -> None:
        """Close the sink it watches."""
        await self.sink.close()


async def cancel_when_gone(sinks: Sequence[Any], cancel: Callable[[], object]) -> None:
    """Call `cancel` once any of the sinks finds stdout's reader gone."""
    watched = [s.gone for s in sinks if isinstance(s, ReaderGone)]
    if not watched:
        return
    async with trio.open_nursery() as nursery:

        async def wait(gone: trio.Event) -> None:
            await gone.wait()
            cancel()
            nursery.cancel_scope.cancel()

        for gone in watched:
            nursery.start_soon(wait, gone)
