"""Capacity, fair and explicit: who a client is (`client_of`), the shares clients hold
(`Shares`), and the admission of provider streams (`StreamAdmission`): a process-wide limit, a
bounded queue and a per-client share."""

from __future__ import annotations

import collections
import hashlib
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from ._config import Limits
    from ._http11 import Request

__all__ = [
    "ClientId",
    "Shares",
    "StreamAdmission",
    "Ticket",
    "client_of",
    "session_share",
    "uncount",
]

_MAX_SESSION = 128  # characters of `X-Rillet-Session` that name a session


def uncount(counter: collections.Counter[Any], key: Any) -> None:
    """Count one less of `key`, forgetting it at zero (counters of clients stay small)."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def _digest(*parts: str) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "replace")
        digest.update(b"%d:%s;" % (len(data), data))
    return digest.digest()


@attrs.frozen
class ClientId:
    """Who holds a share: the client (what it cannot choose) and, if it named one, its session
    within that client.

    Attributes:
        client: the client's key: its peer address, and whether it sent the server key.
        session: the key of its `X-Rillet-Session` within `client`; None when it sent none.
    """

    client: bytes
    session: bytes | None = None


def client_of(request: Request, *, keyed: bool = False) -> ClientId:
    """Who `request` comes from, for its limits: its peer address, and when it sent the server
    key (`keyed`), that key's identity. Nothing the client picks makes it another client: a
    header or a Bearer value it invents each time would let it take the whole server. An
    `X-Rillet-Session` names a session within the client, whose share is a part of the
    client's (`Shares`): it may narrow a client's share, never widen it."""
    key = "server-key" if keyed else ""
    client = _digest(request.client, key)
    session = request.headers.get("x-rillet-session")
    if session is None:
        return ClientId(client)
    return ClientId(client, _digest(request.client, key, session[:_MAX_SESSION]))


def session_share(per_client: int, per_session: int | None) -> int:
    """A session's share: `per_session`, else half the client's (1 at least), never more
    than the client's."""
    share = per_session if per_session is not None else max(1, per_client // 2)
    return min(share, per_client)


@attrs.define(eq=False)
class Shares:
    """What each client holds of something limited (runs, subscriptions): at most
    `per_client` a client, and within it at most `per_session` a named session. Both counts
    are taken and given back together."""

    per_client: int
    per_session: int
    clients: collections.Counter[bytes] = attrs.field(factory=collections.Counter)
    sessions: collections.Counter[bytes] = attrs.field(factory=collections.Counter)

    def full(self, who: ClientId) -> bool:
        """Whether `who` holds its whole share (its client's, or its session's)."""
        if self.clients[who.client] >= self.per_client:
            return True
        return who.session is not None and self.sessions[who.session] >= self.per_session

    def take(self, who: ClientId) -> None:
        """Count one more held by `who`."""
        self.clients[who.client] += 1
        if who.session is not None:
            self.sessions[who.session] += 1

    def give(self, who: ClientId) -> None:
        """Count one less held by `who`."""
        uncount(self.clients, who.client)
        if who.session is not None:
            uncount(self.sessions, who.session)


@attrs.define(eq=False)
class Ticket:
    """A run's (or MMSP stream's) place in the admission: reserved at once, holding a slot once
    admitted."""

    client: ClientId
    admitted: bool = False
    released: bool = False


@attrs.define(eq=False)
class StreamAdmission:
    """Fair, explicit capacity for provider streams: at most `slots` run at once (first come,
    first served), at most `queue` wait, and one client holds at most its share of them
    (`shares`), running or waiting. A place is reserved synchronously, in the same step as
    the check, so concurrent starts can never count past the limit."""

    slots: int
    queue: int
    shares: Shares
    ceiling: int  # running and waiting together
    pending: int = 0
    _limiter: trio.CapacityLimiter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.slots)

    @classmethod
    def of(cls, limits: Limits) -> StreamAdmission:
        """The admission `limits` describe."""
        return cls(
            slots=limits.max_streams,
            queue=limits.max_queued,
            shares=Shares(
                limits.max_runs_per_client,
                session_share(limits.max_runs_per_client, limits.max_runs_per_session),
            ),
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

    def reserve(self, client: ClientId) -> Ticket | None:
        """A place for `client`, or None when the capacity or the client's share is taken."""
        if self.pending >= self.ceiling or self.shares.full(client):
            return None
        self.pending += 1
        self.shares.take(client)
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
        self.shares.give(ticket.client)
