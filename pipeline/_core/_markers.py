"""The source's side of the actor graph: the markers a handler sends downstream between its
UniEvents (`AttemptReset`, `Status`, and `AttemptOpen` to a grammar downstream), and the outlet
it sends its batches to (`Outlet`, with the grammar's `Verdict` on an attempt). Pure: no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

import msgspec

from ._events import UniEvent

if TYPE_CHECKING:
    from ._errors import RilletError

__all__ = [
    "AttemptOpen",
    "AttemptReset",
    "Batch",
    "DeltaRun",
    "Item",
    "Outlet",
    "Status",
    "Verdict",
]


class AttemptReset(msgspec.Struct, frozen=True, gc=False):
    """Downstream marker: everything the previous attempt(s) emitted is void."""

    attempt: int  # the attempt whose events follow


class Status(msgspec.Struct, frozen=True, gc=False):
    """Downstream marker: what the handler is doing (for the public stream's `status`)."""

    phase: str  # requesting | waiting_rate_limit | backing_off | rescuing | resuming | hedged
    attempt: int
    delay: float = 0.0
    reason: str | None = None  # why the last attempt failed, a safe code (`retry_reason`)


class AttemptOpen(msgspec.Struct, frozen=True, gc=False):
    """Downstream marker, to a grammar downstream only: the lanes that follow are attempt
    `attempt`'s."""

    attempt: int


class DeltaRun(msgspec.Struct, frozen=True, gc=False):
    """A run of one lane's fragments, standing for their delta UniEvents (one per string): what
    a `Grammar` with `runs` on releases for the lane streaming now. A turn asks for it when its
    accumulator is its only reader (no sink, no handle): `Accumulator.feed_many` reads the
    strings, and the turn counts the UniEvents the run stands for. Its `content_items` is empty,
    so a reader of UniEvents that is handed one finds nothing in it to read as an item."""

    kind: str  # the lane's kind: text, thinking or tool_call
    values: list[str]
    content_items: ClassVar[tuple[()]] = ()


Item = UniEvent | AttemptReset | Status | DeltaRun
Batch = list[Item]


class Verdict(Protocol):
    """A grammar downstream's word on one attempt."""

    @property
    def error(self) -> RilletError | None:
        """Its first error (a grammar breach, an in-stream error, an incomplete reply)."""
        ...

    @property
    def emitted(self) -> int:
        """The UniEvents it released."""
        ...

    @property
    def finish(self) -> str | None:
        """The provider's own finish reason, as it spelt it, if the reply gave one."""
        ...

    @property
    def cache_write(self) -> int | None:
        """The prompt tokens the reply says were written to the provider's cache, if it said."""
        ...

    @property
    def response_id(self) -> str:
        """The reply's id as the provider gave it ("" when it gave none)."""
        ...

    @property
    def response_model(self) -> str:
        """The model that answered, as the provider named it ("" when it did not)."""
        ...


class Outlet(Protocol):
    """Where the handler's batches go. `offer` takes a batch at once and says whether it went
    all the way; when it did not, the handler awaits `drain` (backpressure) before the next.
    In a batch, the markers (`AttemptReset`, `Status`) come before every UniEvent.

    An outlet with `grammar_downstream` takes lane events instead of UniEvents (the grammar is
    an actor of its own): the handler then opens each attempt (`AttemptOpen`), stops reading
    once the outlet says the attempt `failed`, and `settle`s it for the grammar's verdict."""

    grammar_downstream: bool
    failed: bool

    @property
    def wants_deltas(self) -> bool:
        """Whether anything reads the delta UniEvents; if not, runs of them will do
        (`DeltaRun`)."""
        ...

    def offer(self, items: Batch) -> bool:
        """Take the batch; False if part of it waits for room downstream."""
        ...

    async def drain(self) -> None:
        """Wait until what `offer` could not pass on has gone."""
        ...

    async def settle(self, *, close: bool) -> Verdict:
        """End an attempt (`close`: its body ended); the grammar's verdict on it."""
        ...
