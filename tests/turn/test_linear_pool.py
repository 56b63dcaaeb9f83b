"""httpcore's pool with the linear pass (`linear_pool`, the server's upstream client): the same
policy as httpcore's own pass in one walk over the connections. The pass is checked alone on
stand-in connections (how many questions it asks of them, what it closes and assigns), and the
pool as a whole with real requests on loopback (connections reused, the connection limit
kept, surplus idle connections closed)."""

from __future__ import annotations

from typing import Any

import attrs
import httpcore
import httpx
import trio
from rillet.transports.testing import Reply, open_loopback_provider
from rillet.transports.upstream._linear_pool import linear_pool

ORIGIN = httpcore.URL("http://127.0.0.1:1/").origin


@attrs.define(eq=False)
class Connection:
    """A stand-in for one of the pool's connections, counting the questions asked of it."""

    state: str = "idle"  # idle, active, closed, expired
    origin: Any = None  # the one origin it serves (None: any)
    asked: int = 0

    def _ask(self) -> None:
        self.asked += 1

    def is_closed(self) -> bool:
        self._ask()
        return self.state == "closed"

    def has_expired(self) -> bool:
        self._ask()
        return self.state == "expired"

    def is_idle(self) -> bool:
        self._ask()
        return self.state == "idle"

    def is_available(self) -> bool:
        self._ask()
        return self.state == "idle"

    def can_handle_request(self, origin: Any) -> bool:
        return self.origin is None or origin == self.origin


@attrs.define(eq=False)
class Queued:
    request: Any
    connection: Any = None

    def is_queued(self) -> bool:
        return self.connection is None

    def assign_to_connection(self, connection: Any) -> None:
        self.connection = connection


def _pool(connections: list[Connection], *, keep: int, most: int) -> Any:
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=most))
    assert linear_pool(transport)
    pool: Any = transport._pool
    pool._connections = list(connections)
    pool._max_keepalive_connections = keep
    pool._requests = []
    return pool


def test_a_pass_asks_each_connection_a_bounded_number_of_questions() -> None:
    connections = [Connection("idle" if i % 2 else "active") for i in range(1000)]
    pool = _pool(connections, keep=1000, most=1000)
    pool._requests = [Queued(httpcore.Request("GET", "http://127.0.0.1:1/"))]
    assert pool._assign_requests_to_connections() == []
    assert max(c.asked for c in connections) <= 4  # httpcore's own pass: ~500 for idle ones
    assert pool._requests[0].connection is connections[1]  # the first idle one, reused


def test_a_pass_drops_the_closed_closes_the_expired_and_the_surplus_idle_oldest_first() -> None:
    states = ["closed", "expired", "idle", "active", "idle", "idle", "active"]
    connections = [Connection(state) for state in states]
    pool = _pool(connections, keep=1, most=10)
    closing = pool._assign_requests_to_connections()
    assert closing == [connections[1], connections[2], connections[4]]
    assert pool._connections == [connections[3], connections[5], connections[6]]


def test_a_full_pool_closes_an_idle_connection_to_make_room_but_never_one_spoken_for() -> None:
    other = httpcore.URL("http://127.0.0.1:2/").origin
    busy, idle = Connection("active"), Connection("idle", ORIGIN)
    pool = _pool([busy, idle], keep=10, most=2)
    mine = Queued(httpcore.Request("GET", "http://127.0.0.1:1/"))
    theirs = Queued(httpcore.Request("GET", "http://127.0.0.1:2/"))
    pool._requests = [mine, theirs]
    closing = pool._assign_requests_to_connections()
    assert mine.connection is idle  # reused: spoken for
    assert closing == []  # no idle connection left to close for the other origin: it waits
    assert theirs.connection is None
    pool._requests = [theirs]
    assert pool._assign_requests_to_connections() == [idle]  # now it may go
    assigned: Any = theirs.connection  # (set by the pass: not the None asserted above)
    assert assigned.can_handle_request(other)


async def test_requests_through_the_linear_pool_reuse_connections_within_the_limit() -> None:
    replies = [Reply(chunks=(b"data: x\n\n",), chunk_delay=0.05) for _ in range(12)]
    with trio.fail_after(30):
        async with open_loopback_provider(replies) as server:
            transport = httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=3, max_keepalive_connections=2)
            )
            assert linear_pool(transport)
            async with httpx.AsyncClient(transport=transport) as client:

                async def one() -> None:
                    answer = await client.post(f"{server.url}/v1/x", content=b"{}")
                    assert answer.status_code == 200

                async with trio.open_nursery() as nursery:
                    for _ in range(6):
                        nursery.start_soon(one)
                assert len(transport._pool.connections) == 2  # the surplus idle one closed
                for _ in range(6):
                    await one()
    used = {request.connection for request in server.requests}
    assert len(server.requests) == 12
    assert len(used) <= 4  # three at once at most, then the two kept, reused
