"""`serve`, the server's entry point: in this process, or as the supervisor of its workers.

It sits above what it chooses between (`_serve` for one process, `_workers` for several, whose
workers each serve in their own process), so neither imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from ._config import ServerConfigError
from ._serve import serve_in_process
from ._workers import supervise

if TYPE_CHECKING:
    from collections.abc import Callable

    from rillet._hub._hub import RunHub

    from ._config import ServerConfig

__all__ = ["serve"]


async def serve(
    config: ServerConfig,
    *,
    hub: RunHub | None = None,
    worker_setup: Callable[[], object] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started` gets the bound `http://host:port` URL.

    Embeddable: `url = await nursery.start(serve, config)`. Every connection and every run is a
    task of this call's nursery, so cancelling it stops them all. Pass a `hub` to share run logs
    with the application; with `config.redis_url` (and no `hub`) the logs live in Redis and
    every server sharing it serves every run's subscribers; otherwise a server serves the runs
    it started. Raises `ServerConfigError` before binding for an open server off loopback, and
    `HubUnavailable` before binding when the configured Redis does not answer.

    With `config.workers` above 1 this process supervises that many worker processes on the
    port (`_workers`: `SO_REUSEPORT`, runs shared through `config.redis_url`); `worker_setup`
    then runs first in each (to configure logging, say) and must pickle, as `config` must. A
    worker that does not start raises `WorkerFailed` with its cause.
    """
    config.check()
    if config.workers > 1:
        if hub is not None:
            raise ServerConfigError("workers share runs through redis_url, not a hub object")
        await supervise(config, setup=worker_setup, task_status=task_status)
        return
    await serve_in_process(config, hub=hub, task_status=task_status)
