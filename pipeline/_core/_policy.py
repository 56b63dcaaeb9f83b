"""The handler's policy and the pure arithmetic behind it: outcomes, failure shapes, backoff and
server-directed waits. No I/O: the handler (`_handler.py`) applies these rules.

Defaults are the design's: deadlines 120 s to the first event, 180 s between events, 300 s for
the whole turn; at most 10 consecutive timeouts (2 while no event ever came); 3 transport
retries backing off from 100 ms to 10 s with 10 % jitter; 5 rate-limit retries honouring
`retry-after-ms` / `Retry-After` (default 5 s, at most 60 s); one non-streaming rescue. Which
failure takes which ladder is the failure taxonomy's (`_failures`). A turn
without a policy gets these defaults: an unguarded stream is never the default.
"""

from __future__ import annotations

import contextvars
import datetime
import enum
import inspect
import math
import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import attrs

from ._deprecated import renamed

__all__ = ["FailureClass", "Outcome", "Policy", "backoff_delay", "default_graph", "retry_after"]

default_graph: contextvars.ContextVar[str] = contextvars.ContextVar(
    "default_graph", default="chained"
)
"""The graph a `Policy` gets when it names none, in this context: `chained` unless set (the
test suite runs the turn's tests under both graphs with it)."""


class Outcome(enum.IntEnum):
    """How a turn ended: exactly one per turn, ordered by severity.

    Completed < TotalTimeout < EventTimeout < RateLimited < Failed < InitFailed < Rescued <
    Cancelled. Failed is a permanent error after the first event; InitFailed, an error ending
    a turn whose attempts never produced an event; Rescued, a reply the non-streaming rescue
    brought home after streaming was hopeless. `FALLBACK_TO_NON_STREAMING` is Rescued's old
    name, kept for one release (an alias of the same member; it cannot warn).
    """

    COMPLETED = 0
    TOTAL_TIMEOUT = 1
    EVENT_TIMEOUT = 2
    RATE_LIMITED = 3
    FAILED = 4
    INIT_FAILED = 5
    RESCUED = 6
    CANCELLED = 7
    FALLBACK_TO_NON_STREAMING = 6  # Rescued's old name, for one release

    def __str__(self) -> str:
        """Its name as the docs spell it (`Completed`, `TotalTimeout`), not its number: what
        `print(result.outcome)` and f-strings show. The value and the ordering stay numeric."""
        return self.name.title().replace("_", "")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @property
    def succeeded(self) -> bool:
        """Whether the turn brought a reply home (streamed or rescued)."""
        return self in (Outcome.COMPLETED, Outcome.RESCUED)

    @property
    def label(self) -> str:
        """Its name in snake case as metrics, logs and MCP results carry it (`completed`,
        `total_timeout`). Rescued keeps the label it had before it was renamed,
        `fallback_to_non_streaming`, so dashboards and alerts keyed on it go on matching."""
        return _LABELS[self]


_LABELS = {o: o.name.lower() for o in Outcome} | {Outcome.RESCUED: "fallback_to_non_streaming"}


class FailureClass(enum.Enum):
    """What kind of failure an attempt ended with: it decides the ladder that handles it."""

    TRANSPORT = "transport"  # connect/read errors, 5xx, 408, truncation, a frame not JSON
    STALL = "stall"  # a deadline between events blew (transport-shaped, and counts a timeout)
    TOTAL = "total"  # the turn's total deadline blew
    RATE_LIMIT = "rate_limit"  # 429, 503, 529, RateLimitError
    PERMANENT = "permanent"  # 4xx, grammar breaches, bad tool arguments, quota, oversized frames
    WRONG_SHAPE = "wrong_shape"  # valid JSON of the wrong shape: no 2nd streamed attempt, rescue


def _check_graph(_: object, __: object, value: str) -> None:
    if value not in ("chained", "hops"):
        raise ValueError("graph must be 'chained' or 'hops'")


def _check_hedge(_: object, __: object, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError("hedge_after must be a positive number of seconds, or None")


def _check_channel(_: object, __: object, value: int) -> None:
    if not 1 <= value <= 1024:
        raise ValueError("channel_size must be between 1 and 1024")


def _check_deadline(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:  # (NaN too)
        raise ValueError(f"{attribute.name} must be a positive number of seconds, not {value!r}")


def _check_wait(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be 0 or more seconds, not {value!r}")


def _check_count(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be a whole number, 0 or more, not {value!r}")


def _check_size(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a whole number of bytes, 1 or more")


def _check_jitter(_: object, __: object, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"jitter must be between 0 and 1, not {value!r}")


def _check_rate(_: object, __: object, value: float) -> None:
    if not (0 <= value < math.inf):
        raise ValueError(f"requests_per_minute must be 0 (off) or a positive number, not {value!r}")


@attrs.frozen
class Policy:
    """Deadlines, retry ladders, rescue and throttle for a turn (seconds unless named).

    Attributes:
        initial_event_timeout: from sending a request to its first event.
        per_event_timeout: between one event and the next (SSE comments do not count).
        total_timeout: the whole turn's streaming; a rescue still gets one fresh
            initial-event deadline when it starts at or after it.
        max_consecutive_timeouts: stalls in a row before streaming is hopeless...
        max_empty_timeouts: ...or this many while no attempt has produced an event.
        transport_retries: retries for transport-shaped failures.
        backoff_base, backoff_max, jitter: backoff `min(base * 2**n, max) * (1 - jitter * u)`.
        rate_limit_retries: retries for rate-limit-shaped failures (a separate budget).
        retry_after_default: the wait when the server names none (or an invalid one).
        retry_after_max: a longer server-directed wait ends the turn RateLimited at once.
        rescue: whether a hopeless stream gets one non-streaming rescue request
            (`fallback`, its old name, is still read and taken for one release).
        requests_per_minute: the proactive token bucket per base URL (0 = off).
        limiter_max_wait: the longest an attempt waits for a token before sending anyway.
        channel_size: the capacity of each bounded channel between actors (1..1024).
        hedge_after: opt-in hedged requests: an attempt with no first event this many seconds
            after sending sends the same request again, and the first of the two to deliver an
            event wins (the other is cancelled at once: never billed twice for output). None:
            off.
        graph: how the turn's actors run: `chained` (the default) chains every actor that
            never blocks onto the task before it, as stream engines chain operators; `hops`
            runs each on its own task with channels between (the same events, more hops).
        max_frame: the cap on one incoming frame of the provider's stream, in bytes (32 MiB:
            real frames repeat a whole answer or carry an image); past it, `FrameTooLarge`.
        max_body: the cap on a non-streaming (rescue) or error body, in bytes.
        random: the jitter source, `u` in [0, 1) (inject a constant for deterministic tests).
        wall_clock: Unix time, for `Retry-After` HTTP-dates (the trio clock stays separate).

    A value that cannot mean anything (a deadline of 0 or NaN, a negative count, a jitter over
    1) is a `ValueError` naming the field, here rather than as a turn that cannot run.
    """

    initial_event_timeout: float = attrs.field(default=120.0, validator=_check_deadline)
    per_event_timeout: float = attrs.field(default=180.0, validator=_check_deadline)
    total_timeout: float = attrs.field(default=300.0, validator=_check_deadline)
    max_consecutive_timeouts: int = attrs.field(default=10, validator=_check_count)
    max_empty_timeouts: int = attrs.field(default=2, validator=_check_count)
    transport_retries: int = attrs.field(default=3, validator=_check_count)
    backoff_base: float = attrs.field(default=0.1, validator=_check_wait)
    backoff_max: float = attrs.field(default=10.0, validator=_check_wait)
    jitter: float = attrs.field(default=0.1, validator=_check_jitter)
    rate_limit_retries: int = attrs.field(default=5, validator=_check_count)
    retry_after_default: float = attrs.field(default=5.0, validator=_check_wait)
    retry_after_max: float = attrs.field(default=60.0, validator=_check_wait)
    rescue: bool = True
    requests_per_minute: float = attrs.field(default=0.0, validator=_check_rate)
    limiter_max_wait: float = attrs.field(default=30.0, validator=_check_wait)
    channel_size: int = attrs.field(default=64, validator=_check_channel)
    hedge_after: float | None = attrs.field(default=None, validator=_check_hedge)
    graph: str = attrs.field(factory=lambda: default_graph.get(), validator=_check_graph)
    max_frame: int = attrs.field(default=32 * 1024 * 1024, validator=_check_size)
    max_body: int = attrs.field(default=16 * 1024 * 1024, validator=_check_size)
    random: Callable[[], float] = attrs.field(default=random.random, eq=False, repr=False)
    wall_clock: Callable[[], float] = attrs.field(default=time.time, eq=False, repr=False)

    if not TYPE_CHECKING:  # type checkers see the fields' own `__init__`, without the old name

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if "fallback" in kwargs:
                renamed("Policy(fallback=...)", "Policy(rescue=...)")
                # it wins over `rescue`: `attrs.evolve(policy, fallback=...)` passes both
                kwargs["rescue"] = kwargs.pop("fallback")
            self.__attrs_init__(*args, **kwargs)

    @property
    def fallback(self) -> bool:
        """`rescue`'s old name, kept for one release (it warns once)."""
        renamed("Policy.fallback", "Policy.rescue")
        return self.rescue


if not TYPE_CHECKING:  # `help(Policy)` and `inspect.signature` show the fields, not `**kwargs`
    Policy.__init__.__signature__ = inspect.signature(Policy.__attrs_init__)


def backoff_delay(policy: Policy, retry: int) -> float:
    """The wait before transport retry number `retry` (0-based): exponential, capped, jittered
    downwards by at most `jitter` of itself."""
    delay: float = min(policy.backoff_base * 2.0**retry, policy.backoff_max)
    return delay * (1.0 - policy.jitter * policy.random())


def retry_after(headers: Mapping[str, str], wall_clock: float) -> float | None:
    """The wait a server asked for, in seconds: `retry-after-ms` first, then `Retry-After` as
    seconds or an HTTP-date. None when absent or unusable (zero, negative, not finite,
    unparsable, or a date already past): the caller then uses its default."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        value = _positive_float(ms)
        if value is not None:
            return value / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _positive_float(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime and `-0000` name no zone: an HTTP-date is always GMT
        when = when.replace(tzinfo=datetime.UTC)
    wait = when.timestamp() - wall_clock
    return wait if wait > 0 else None


def _positive_float(text: str) -> float | None:
    text = text.strip()
    if not text or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return value
