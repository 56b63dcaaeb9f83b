"""httpcore's connection pool with bookkeeping that grows with its connections, not their
square.

Each time a request enters or leaves httpcore's pool (`AsyncConnectionPool`), the pool walks its
connections to drop the closed, close the expired and evict surplus idle ones, then hands
queued requests a connection. In httpcore 1.0 the surplus check counts every connection again
for each idle one, so a pass costs the square of the pool's size: a gateway holding 500
provider streams spent tens of milliseconds per request on it, and whole seconds of CPU when
many streams ended together. (It also compares the count of all connections, not of the idle
ones, with `max_keepalive_connections`.)

`linear_pool` gives a transport's pool a pass of the same policy in one walk: closed
connections dropped, expired ones closed, idle ones past `max_keepalive_connections` (counted
as idle) closed oldest first, then each queued request gets an available connection for its
origin, else a new one while there is room, else an idle connection is closed to make room.
The connections, the requests, their waiting and the retry on `ConnectionNotAvailable` stay
httpcore's own.

It applies only to the pool class it knows (`linear_pool` says False otherwise): the pool's
other names are httpcore's, private, and an httpcore that moved them keeps its own pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import httpcore
except ImportError:  # pragma: no cover - httpx always brings it
    httpcore = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import httpx

__all__ = ["linear_pool"]

_NEEDS = ("_connections", "_requests", "_max_connections", "_max_keepalive_connections")


def linear_pool(transport: httpx.AsyncHTTPTransport) -> bool:
    """Give `transport`'s pool the linear pass; whether it could (an httpx transport over
    httpcore's own pool, with the names the pass uses)."""
    pool = getattr(transport, "_pool", None)
    base = getattr(httpcore, "AsyncConnectionPool", None)
    if base is None or type(pool) is not base:
        return False
    if not all(hasattr(pool, name) for name in _NEEDS):
        return False
    if not callable(getattr(pool, "create_connection", None)):
        return False
    pool.__class__ = _pool_class(base)
    return True


_CLASS: dict[type, type] = {}


def _pool_class(base: type) -> type:
    """The subclass of httpcore's pool with the linear pass (made once)."""
    if base not in _CLASS:
        methods = {"_assign_requests_to_connections": _assign}
        _CLASS[base] = type("LinearConnectionPool", (base,), methods)
    return _CLASS[base]


def _assign(pool: Any) -> list[Any]:
    """One pass over the pool (see the module's docstring); the connections to close."""
    closing: list[Any] = []
    kept: list[Any] = []
    idle: list[Any] = []
    for connection in pool._connections:
        if connection.is_closed():
            continue
        if connection.has_expired():
            closing.append(connection)
            continue
        kept.append(connection)
        if connection.is_idle():
            idle.append(connection)
    surplus = len(idle) - pool._max_keepalive_connections
    if surplus > 0:  # the longest in the pool go first, as httpcore's own pass does
        evicted = {id(connection) for connection in idle[:surplus]}
        closing += idle[:surplus]
        idle = idle[surplus:]
        kept = [connection for connection in kept if id(connection) not in evicted]
    queued = [request for request in pool._requests if request.is_queued()]
    if queued:
        available = [connection for connection in kept if connection.is_available()]
        for request in queued:
            origin = request.request.url.origin
            found = next((c for c in available if c.can_handle_request(origin)), None)
            if found is None:
                if len(kept) >= pool._max_connections:
                    if not idle:
                        continue  # it waits for a connection to come back
                    victim = idle.pop(0)
                    kept.remove(victim)
                    closing.append(victim)
                found = pool.create_connection(origin)
                kept.append(found)
            elif found in idle:  # spoken for: never the one closed to make room
                idle.remove(found)
            request.assign_to_connection(found)
    pool._connections[:] = kept
    return closing
