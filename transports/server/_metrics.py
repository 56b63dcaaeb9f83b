"""Counters and recent samples for `/metrics`, and the body it answers with."""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from rillet._turn import TurnResult

__all__ = ["Metrics"]


@attrs.define(eq=False)
class Metrics:
    """Counters and recent samples for `/metrics`."""

    window: float = 10.0
    runs_started: int = 0
    streams_started: int = 0
    connections: int = 0
    connections_refused: int = 0
    subscribers_dropped: int = 0
    _buckets: collections.deque[list[float]] = attrs.field(factory=collections.deque)
    _ttfe: collections.deque[float] = attrs.field(factory=lambda: collections.deque(maxlen=1024))

    def count(self, events: int) -> None:
        """`events` were produced now (one-second buckets over the window)."""
        second = math.floor(trio.current_time())
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += events
        else:
            buckets.append([second, events])
            while buckets and buckets[0][0] <= second - self.window:
                buckets.popleft()

    def events_per_second(self) -> float:
        """Events produced a second, over the window."""
        now = trio.current_time()
        total = sum(n for second, n in self._buckets if second > now - self.window)
        return total / self.window

    def finished(self, result: TurnResult) -> None:
        """A turn ended: keep its time to first event."""
        if result.time_to_first_event is not None:
            self._ttfe.append(result.time_to_first_event)

    def ttfe(self) -> dict[str, float | int | None]:
        """Time to first event of recent turns: count and percentiles, in ms."""
        ordered = sorted(self._ttfe)

        def rank(p: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)] * 1000, 3)

        return {"count": len(ordered), "p50": rank(0.5), "p95": rank(0.95), "p99": rank(0.99)}
