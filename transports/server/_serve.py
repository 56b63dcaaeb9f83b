"""`serve`: bind, accept connections (backing off when out of file descriptors), sweep expired
runs, and stop everything when cancelled."""

from __future__ import annotations

import errno
import logging
import socket
from typing import TYPE_CHECKING

import httpx
import trio
from rillet._hub._hub import Hub, RunHub
from rillet.transports.upstream import ObservedTransport
from rillet.transports.upstream._linear_pool import linear_pool

from ._metrics import METRICS_EXTRA, Metrics
from ._routing import Server
from ._shared import Shared

if TYPE_CHECKING:
    from ._config import ServerConfig

__all__ = ["serve_in_process"]

logger = logging.getLogger("rillet.transports.server")


async def serve_in_process(
    config: ServerConfig,
    *,
    hub: RunHub | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve in this process until cancelled (`serve` without its workers): with
    `config.redis_url` and no `hub` the run logs live in Redis."""
    limits = config.limits
    if hub is None and config.redis_url is not None:
        from rillet._hub._redis import open_redis_hub

        options = {"max_subscribers_per_run": limits.max_subscribers_per_run, **config.hub_options}
        async with open_redis_hub(config.redis_url, **options) as shared:
            await _serve(config, shared, task_status)
        return
    await _serve(
        config, hub or Hub(max_subscribers_per_run=limits.max_subscribers_per_run), task_status
    )


async def _serve(config: ServerConfig, hub: RunHub, task_status: trio.TaskStatus[str]) -> None:
    # the pool holds a connection for every stream admitted: none waits for one
    pool = httpx.Limits(
        max_connections=config.limits.max_streams,
        max_keepalive_connections=config.limits.max_streams,
    )
    metrics = Metrics()
    # every provider request goes through it, counted by its answer's status
    inner = httpx.AsyncHTTPTransport(limits=pool)
    linear_pool(inner)  # a pass per request in the pool's size, not its square
    transport = ObservedTransport(inner, metrics.provider_request)
    async with (
        httpx.AsyncClient(
            timeout=httpx.Timeout(None), follow_redirects=False, transport=transport
        ) as client,
        trio.open_nursery() as nursery,
    ):
        if config.reuse_port:
            listeners = await _reuse_port_listeners(config.host, config.port)
        else:
            listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        server = Server(Shared(config, hub, client, nursery, metrics=metrics))
        if config.redis_url is not None:  # cancels and answers for runs other servers drive
            from ._control import Control

            control = Control(config.redis_url, server.runs.controlled)
            await nursery.start(control.run)
            server.shared.control = control
            if config.takeover:  # runs whose server is gone go on here
                from rillet._hub._redis import RedisHub

                if isinstance(hub, RedisHub):
                    hub.takeover = server.runs.take_over
        for listener in listeners:
            nursery.start_soon(_accept, listener, server, nursery)
        nursery.start_soon(server.runs.sweep)
        host, port = listeners[0].socket.getsockname()[:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        logger.info("serving on %s", url, extra={"fields": {"url": url}})
        if metrics.prom is None:
            logger.warning("no Prometheus metrics at /metrics: %s", METRICS_EXTRA)
        task_status.started(url)


async def _reuse_port_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """Listeners on every address of `host`, bound with `SO_REUSEPORT`: other processes (the
    other workers) bind the same port, and the kernel spreads connections among them."""
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    socks: list[trio.socket.SocketType] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = trio.socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            await sock.bind(address)
            sock.listen(0xFFFF)  # the kernel caps it at net.core.somaxconn
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return [trio.SocketListener(sock) for sock in socks]


_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


async def _accept(listener: trio.SocketListener, server: Server, nursery: trio.Nursery) -> None:
    """Accept connections until cancelled. Out of file descriptors (EMFILE) or memory, it backs
    off (10 ms, doubling to 1 s) and keeps serving the connections it has; they free what it
    needs. Logged once per episode, not once per attempt."""
    pause = 0.0
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_ERRORS:
                    raise
                if not pause:
                    logger.warning("accept failed (%s): backing off", errno.errorcode[exc.errno])
                pause = min(max(2 * pause, 0.01), 1.0)
                await trio.sleep(pause)
                continue
            pause = 0.0
            nursery.start_soon(server.handle, stream)
