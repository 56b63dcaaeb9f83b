"""Capacity, fair and explicit: who a client is (`client_key`), and the admission of provider
streams (`StreamAdmission`): a process-wide limit, a bounded queue and a per-client share."""

from __future__ import annotations

import collections
import hashlib
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from ._config import Limits
    from ._http11 import Request

__all__ = ["StreamAdmission", "Ticket", "client_key", "subscriber", "uncount"]


def uncount(counter: collections.Counter[Any], key: Any) -> None:
    """Count one less of `key`, forgetting it at zero (counters of clients stay small)."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def subscriber(request: Request) -> bytes:
    """The client a subscription counts against: who reads with this run token."""
    return client_key(request, request.bearer() or request.query.get("token", ""))


def client_key(request: Request, credential: str) -> bytes:
    """What identifies a client for its limits: its address, the credential it acts with (a
    run token, the server key) and its `X-Rillet-Session`, if it sends one. Every local
    program shares 127.0.0.1; the address alone would make them one client."""
    session = request.headers.get("x-rillet-session", "")[:128]
    digest = hashlib.sha256()
    for part in (request.client, credential, session):
        data = part.encode("utf-8", "replace")
        digest.update(b"%d:%s;" % (len(data), data))
    return digest.digest()


@attrs.define(eq=False)
class Ticket:
    """A run's (or MMSP stream's) place in the admission: reserved at once, holding a slot once
    admitted."""

    client: bytes
    admitted: bool = False
    released: bool = False


@attrs.define(eq=False)
class StreamAdmission:
    """Fair, explicit capacity for provider streams: at most `slots` run at once (first come,
    first served), at most `queue` wait, and one client holds at most `per_client` of them,
    running or waiting. A place is reserved synchronously, in the same step as the check, so
    concurrent starts can never count past the limit."""

    slots: int
    queue: int
    per_client: int
    ceiling: int  # running and waiting together
    pending: int = 0
    held: collections.Counter[bytes] = attrs.field(factory=collections.Counter)
    _limiter: trio.CapacityLimiter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.slots)

    @classmethod
    def of(cls, limits: Limits) -> StreamAdmission:
        """The admission `limits` describe."""
        return cls(
            slots=limits.max_streams,
            queue=limits.max_queued,
            per_client=limits.max_runs_per_client,
            ceiling=min(limits.max_active_runs, limits.max_streams + limits.max_queued),
        )

    @property
    def running(self) -> int:
        """Streams holding a slot."""
        return int(self._limiter.borrowed_tokens)

    @property
    def waiting(self) -> int:
        """Streams queued for a slot."""
        return self.pending - self.running

    def reserve(self, client: bytes) -> Ticket | None:
        """A place for `client`, or None when the capacity or the client's share is taken."""
        if self.pending >= self.ceiling or self.held[client] >= self.per_client:
            return None
        self.pending += 1
        self.held[client] += 1
        return Ticket(client)

    def try_admit(self, ticket: Ticket) -> bool:
        """Take a slot now if one is free and nobody waits for one."""
        try:
            self._limiter.acquire_on_behalf_of_nowait(ticket)
        except trio.WouldBlock:
            return False
        ticket.admitted = True
        return True

    async def admit(self, ticket: Ticket) -> None:
        """Wait for a slot (in turn)."""
        await self._limiter.acquire_on_behalf_of(ticket)
        ticket.admitted = True

    def release(self, ticket: Ticket) -> None:
        """Give the place (and the slot) back; once."""
        if ticket.released:
            return
        ticket.released = True
        if ticket.admitted:
            self._limiter.release_on_behalf_of(ticket)
        self.pending -= 1
        self.held[ticket.client] -= 1
        if self.held[ticket.client] <= 0:
            del self.held[ticket.client]
