"""Several server processes on one port (`ServerConfig.workers`): each worker binds its own
listening socket with `SO_REUSEPORT` and the kernel spreads new connections among them; their
runs live in the Redis hub, so any worker serves any run's subscribers, and a cancel or an
approval answer reaching a worker that does not drive the run goes to the one that does over
Redis (`_control`).

The supervisor (the process `serve` was called in) serves nothing itself. It holds the port
(bound with `SO_REUSEPORT`, never listening, so the kernel hands it no connection: `port=0`
picks the port once for all), starts each worker as `python -c ...` with its configuration
pickled on its standard input (the server key and the provider's credentials go over the
pipe, never the command line or the environment), and waits for each to say `ready`. A worker
that fails to start stops them all, and `serve` raises `WorkerFailed` with that worker's cause.
A worker that dies later is started again after a pause that doubles with each of its deaths in
the last `_DEATH_WINDOW` seconds (0.5 s for the first, up to 8 s), so one death long after the
last is restarted at once again; one that dies `_MAX_DEATHS` times within that window stops them
all with `WorkerFailed`.
Cancelling `serve` (SIGINT, or SIGTERM at the command line) sends each worker SIGTERM (a worker
ignores SIGINT: Ctrl-C reaches the whole process group, and the supervisor handles it), waits
`_GRACE` seconds for it to finish, then kills what is left. A worker also stops by itself when
its standard input closes, so a supervisor killed outright leaves no worker behind.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import attrs
import trio
from rillet._core._errors import RilletError

from ._serve import serve_in_process

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import ServerConfig

__all__ = ["WorkerFailed", "restart_pause", "supervise", "worker_main"]

logger = logging.getLogger("rillet.transports.server")

_ENTRY = "from rillet.transports.server._workers import worker_main; worker_main()"
_START_TIMEOUT = 60.0  # seconds a worker may take to bind and say `ready`
_GRACE = 10.0  # seconds a worker is given to stop after SIGTERM before it is killed
_MAX_DEATHS = 5
_DEATH_WINDOW = 60.0


class WorkerFailed(RilletError):
    """A server worker did not start, or kept dying: the whole server stops (the message
    names the worker and its cause)."""


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to the port with `SO_REUSEPORT` and never listening: it holds the port
    (and picks it, for port 0) without being handed connections."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    return sock


def _describe(exc: BaseException) -> str:
    """One line for an exception, the first leaf of a group."""
    exc = _first(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _first(exc: BaseException) -> BaseException:
    """The first leaf of a (nested) exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


@attrs.define(eq=False)
class _Worker:
    """One worker process and what the supervisor knows of it."""

    index: int
    payload: bytes
    process: trio.Process | None = None
    deaths: list[float] = attrs.field(factory=list)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def start(self) -> None:
        """Start the process and wait until it serves; `WorkerFailed` with its cause if it
        ends first, or does not answer within `_START_TIMEOUT`."""
        self.process = process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _ENTRY], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None
        assert process.stdout is not None
        line = b""
        with trio.move_on_after(_START_TIMEOUT) as waited:
            await process.stdin.send_all(len(self.payload).to_bytes(8, "big") + self.payload)
            while not line.endswith(b"\n"):
                data = await process.stdout.receive_some(4096)
                if not data:
                    break
                line += data
        word, _, rest = line.decode(errors="replace").strip().partition(" ")
        if word == "ready":
            return
        if waited.cancelled_caught:
            cause = f"no answer within {_START_TIMEOUT:g} s"
        elif word == "failed":
            cause = rest
        else:
            code = await process.wait()
            cause = f"it exited with code {code}"
        await self.stop()
        raise WorkerFailed(f"worker {self.index} did not start: {cause}")

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after `_GRACE` seconds; waits until it has ended."""
        process = self.process
        if process is None:
            return
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(_GRACE):
                    await process.wait()
                if process.returncode is None:
                    logger.warning(
                        "worker %d (pid %d) did not stop: killed", self.index, process.pid
                    )
                    process.kill()
                    await process.wait()
            assert process.stdin is not None
            assert process.stdout is not None
            await process.stdin.aclose()
            await process.stdout.aclose()

    async def watch(self) -> None:
        """Start the worker again each time it dies; `WorkerFailed` once it dies too often."""
        while True:
            assert self.process is not None
            code = await self.process.wait()
            await self.stop()
            now = time.monotonic()
            self.deaths = [t for t in self.deaths if now - t < _DEATH_WINDOW] + [now]
            if len(self.deaths) >= _MAX_DEATHS:
                raise WorkerFailed(
                    f"worker {self.index} died {len(self.deaths)} times within "
                    f"{_DEATH_WINDOW:g} s (last exit code {code}): stopping"
                )
            pause = restart_pause(len(self.deaths))
            logger.error(
                "worker %d (pid %s) exited with code %s: starting it again in %g s",
                self.index,
                self.pid,
                code,
                pause,
            )
            await trio.sleep(pause)
            try:
                await self.start()
            except WorkerFailed as exc:
                logger.error("%s", exc)
                continue
            logger.info("worker %d is serving again (pid %s)", self.index, self.pid)


def restart_pause(recent_deaths: int) -> float:
    """Seconds before a dead worker is started again, given its deaths within the window (this
    one included): 0.5 s for one, doubling with each more, at most 8 s."""
    return min(0.5 * (1 << max(recent_deaths - 1, 0)), 8.0)


async def supervise(
    config: ServerConfig,
    *,
    setup: Callable[[], object] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run `config.workers` server processes on one port until cancelled (see the module's
    doc); `task_status.started` gets the URL once every worker serves. `setup` runs first in
    each worker (logging, say); it must pickle, as `config` must."""
    config.check()
    assert config.redis_url is not None
    from rillet._hub._redis import open_redis_hub

    async with open_redis_hub(config.redis_url):  # HubUnavailable here, before any worker
        pass
    holder = _reserve(config.host, config.port)
    with holder:
        port = holder.getsockname()[1]
        workers = [_Worker(i, _payload(config, port, i, setup)) for i in range(config.workers)]
        try:
            async with trio.open_nursery() as starting:
                for worker in workers:
                    starting.start_soon(worker.start)
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    nursery.start_soon(worker.watch)
                host = config.host.strip("[]")
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                pids = [w.pid for w in workers]
                logger.info(
                    "serving on %s with %d workers (pids %s)",
                    url,
                    len(workers),
                    ", ".join(map(str, pids)),
                    extra={"fields": {"url": url, "workers": pids}},
                )
                task_status.started(url)
        except BaseExceptionGroup as group:
            _, others = group.split(WorkerFailed)
            if others is None:  # a worker failed: its cause, not a group
                raise _first(group) from None
            raise
        finally:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as stopping:
                    for worker in workers:
                        stopping.start_soon(worker.stop)


def _payload(
    config: ServerConfig, port: int, index: int, setup: Callable[[], object] | None
) -> bytes:
    """What a worker reads on its standard input: its configuration and `setup`, pickled."""
    mine = attrs.evolve(config, workers=1, reuse_port=True, port=port, worker=index)
    try:
        return pickle.dumps((mine, setup))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise WorkerFailed(
            f"the configuration cannot be handed to workers: {_describe(exc)} (a provider "
            "function must be defined at a module's top level)"
        ) from None


# --- the worker side ------------------------------------------------------------------------------


def _say(line: str) -> None:
    """A line to the supervisor (standard output is the supervisor's pipe)."""
    with_newline = " ".join(line.split()) + "\n"
    with contextlib.suppress(OSError):  # the supervisor is gone: the worker stops on its own
        os.write(1, with_newline.encode())


def worker_main() -> None:
    """A worker process's entry point: read the configuration from standard input, serve
    until SIGTERM or the end of standard input (SIGINT is its supervisor's to handle)."""
    # Ctrl-C reaches the whole process group: the supervisor stops the workers (SIGTERM), so
    # none of them ends first and looks like a worker that died
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    size = int.from_bytes(stdin.read(8) or b"\0", "big")
    code = 0
    try:
        config, setup = pickle.loads(stdin.read(size))
        if setup is not None:
            setup()
        trio.run(functools.partial(_work, config, stdin.fileno()))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        _say(f"failed {_describe(exc)}")
        code = 1
    sys.exit(code)


async def _work(config: ServerConfig, stdin: int) -> None:
    # SIGTERM is caught before the worker says it is ready: a supervisor that stops it at once
    # must not find SIGTERM's default (an exit without a word) still in place
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve_in_process, config))
            _say(f"ready {url}")
            nursery.start_soon(_until_closed, stdin, nursery.cancel_scope)
            async for signum in signals:
                logger.info("worker %s: %s, stopping", config.worker, signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


async def _until_closed(fd: int, scope: trio.CancelScope) -> None:
    """Cancel `scope` once the supervisor's end of standard input closes."""
    stream = trio.lowlevel.FdStream(os.dup(fd))
    async with stream:
        while await stream.receive_some(1024):
            pass
    logger.warning("the supervisor is gone: stopping")
    scope.cancel()
