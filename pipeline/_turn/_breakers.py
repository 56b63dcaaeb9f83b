"""Circuit breakers: a chain skips a provider that keeps failing, and tries it again later.

One breaker per (base URL, model), shared by the process: after `threshold` hopeless turns in
a row (default 5) it opens and the chain skips that provider at once; after `cooldown`
(default 30 s) it lets one trial through (half-open); a success closes it, a failure opens it
again. What counts as hopeless is the chain's to say (`_chain`); the breaker only counts.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from .._core._dialect import Provider

__all__ = ["BreakerState", "CircuitBreaker", "CircuitBreakers", "shared_breakers"]


class BreakerState(enum.Enum):
    """A circuit breaker's state."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@attrs.define(eq=False)
class CircuitBreaker:
    """One provider's breaker: counts hopeless turns in a row, opens, cools down, retries.

    Attributes:
        threshold: hopeless turns in a row that open it.
        cooldown: seconds it stays open before one trial may go through.
    """

    threshold: int = 5
    cooldown: float = 30.0
    failures: int = 0
    opened_at: float | None = None
    _trial: bool = False  # a half-open trial is under way

    @property
    def state(self) -> BreakerState:
        """Closed, open, or half-open (cooled down: the next turn is a trial)."""
        if self.opened_at is None:
            return BreakerState.CLOSED
        if self._trial or trio.current_time() >= self.opened_at + self.cooldown:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allow(self) -> bool:
        """Whether a turn may go to this provider now; a half-open breaker lets one trial
        through at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._trial:
            self._trial = True
            return True
        return False

    def succeeded(self) -> None:
        """A turn brought its reply home: close."""
        self.failures = 0
        self.opened_at = None
        self._trial = False

    def failed(self) -> None:
        """A hopeless turn: count it; open at the threshold, or again after a failed trial."""
        self.failures += 1
        if self._trial or self.failures >= self.threshold:
            self.opened_at = trio.current_time()
        self._trial = False

    def abandoned(self) -> None:
        """A turn that ended neither way (cancelled, a permanent error): a trial may go again."""
        self._trial = False


@attrs.define(eq=False)
class CircuitBreakers:
    """The breakers of a process, one per (base URL, model), made on first use."""

    threshold: int = 5
    cooldown: float = 30.0
    _breakers: dict[tuple[str, str], CircuitBreaker] = attrs.field(factory=dict)

    def get(self, provider: Provider) -> CircuitBreaker:
        """The breaker for this provider's base URL and model."""
        key = (provider.base_url.rstrip("/"), provider.model)
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = self._breakers[key] = CircuitBreaker(self.threshold, self.cooldown)
        return breaker


_SHARED: trio.lowlevel.RunVar[CircuitBreakers] = trio.lowlevel.RunVar("rillet_breakers")


def shared_breakers() -> CircuitBreakers:
    """The process's breakers, used by every chain not given its own (one set per trio run:
    their times are the run's clock)."""
    try:
        return _SHARED.get()
    except LookupError:
        breakers = CircuitBreakers()
        _SHARED.set(breakers)
        return breakers
