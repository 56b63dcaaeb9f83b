"""The server's configuration: what it serves (`ServerConfig`) and its limits (`Limits`)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

import attrs
from rillet._core._cost import Prices, as_money, as_prices
from rillet._core._dialect import Provider, Secret
from rillet._core._errors import RilletError
from rillet._core._policy import Policy

__all__ = ["Limits", "ServerConfig", "ServerConfigError", "is_loopback"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


class ServerConfigError(RilletError, ValueError):
    """The server cannot start as configured (an open server off loopback, several workers
    without a Redis to share runs through, or no `SO_REUSEPORT` for them)."""


@attrs.frozen(kw_only=True)
class Limits:
    """The server's limits (sizes in bytes, times in seconds). `docs/reliability.md` says why
    each default is what it is.

    Attributes:
        max_body: the largest request body (413 past it).
        max_ws_message: the largest WebSocket message a client may send (1009 past it;
            trio-websocket measures text in characters).
        ws_rate, ws_burst: client messages per second on a WebSocket, and the burst allowed
            (1008 past them).
        max_subscribers_per_run: live SSE and WebSocket subscribers of one run (429 / 1008).
        max_subscribers_per_client: live subscribers one client holds (429 / 1008). A client
            is what it cannot choose: its address, and the server key when it sends it; a
            header or a token it picks never makes it another client. Behind a proxy every
            client is the proxy's address: raise the shares there.
        max_subscribers_per_session: the part of its client's share one `X-Rillet-Session`
            holds: local programs that name their sessions keep one from locking the others
            out; a session only narrows its client's share, never widens it. None: half the
            client's (at least 1).
        max_streams: provider streams (runs and MMSP streams) running at once, process-wide;
            a run past it waits in the queue (a `status` event, phase `queued`). The upstream
            connection pool is this size, so an admitted stream never waits for a connection.
        max_queued: runs and streams waiting for a slot; past it 429 with `Retry-After`.
        max_runs_per_client: the runs and streams one client (its address, and the server
            key when it sends it) may hold running or queued (429 past it): no client takes
            the whole capacity, whatever headers or tokens it rotates.
        max_runs_per_session: the part of its client's share one `X-Rillet-Session` may hold
            (429 past it); a session only narrows its client's share. None: half the
            client's (at least 1).
        max_active_runs: runs and streams started and not finished, queued ones included
            (429 past it); the lower of it and `max_streams + max_queued` applies.
        max_connections: client connections open at once. At it, the connection that has
            waited longest for a request head is closed to let a new one in, else the one
            whose client has read nothing for longest (5 s at least); when there is neither,
            a new connection gets 503 and is closed at once. The cap applied is kept
            under the process's file limit (`RLIMIT_NOFILE`, less a descriptor for every
            stream admitted and 64 more).
        heartbeat: seconds of silence before an SSE comment (or a WebSocket pong) goes out.
        head_timeout: seconds a connection may take to send a request's head, counted from
            when the server waits for it, and again for its body (slow clients are closed).
        write_timeout: seconds a write may make no progress (the client reads nothing) before
            the connection is closed.
        close_timeout: seconds a closing stream gives a client to take its last bytes.
        sweep_interval: seconds between sweeps of expired runs (and their tokens).
        approval_timeout: seconds an agent run's approval may wait for an answer before it is
            denied (the run holds its provider-stream slot while it waits).
        send_buffer: the kernel send buffer of each connection (`SO_SNDBUF`), None for the
            system's: what may sit in the kernel for a client that stopped reading.
    """

    max_body: int = 1024 * 1024
    max_ws_message: int = 64 * 1024
    ws_rate: float = 20.0
    ws_burst: int = 40
    max_subscribers_per_run: int = 1000
    max_subscribers_per_client: int = 64
    max_subscribers_per_session: int | None = None
    max_streams: int = 32
    max_queued: int = 64
    max_runs_per_client: int = 16
    max_runs_per_session: int | None = None
    max_active_runs: int = 256
    max_connections: int = 4096
    heartbeat: float = 15.0
    head_timeout: float = 10.0
    write_timeout: float = 30.0
    close_timeout: float = 2.0
    sweep_interval: float = 30.0
    approval_timeout: float = 300.0
    send_buffer: int | None = None


def _models(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ServerConfig:
    """What the server serves and how.

    Attributes:
        provider: what runs use; or a function of the model id giving the provider for it.
        host: the address to bind; anything but loopback needs `api_key`.
        port: the port (0: any free one).
        api_key: the key clients must send (`Authorization: Bearer`) to start runs and to use
            the MMSP endpoints, and which may cancel any run or answer its approvals; None
            leaves them open (loopback only). `rillet serve` reads it from
            `--server-key-file PATH` or `RILLET_SERVER_KEY`, and warns when it is given with
            `--server-key`, where every local user can read it.
        models: the model ids offered (`/v1/models`); the first is the default. Empty: the
            provider's own model.
        policy: the turns' policy (None: the default policy).
        limits: sizes, rates and timeouts.
        reasoning: whether run events carry the model's reasoning text.
        tool_arguments: whether run events carry tool call arguments.
        route_kinds: provider kinds (`anthropic`, `gemini`, ...) a model name `kind/model` routes
            to on the OpenAI and UI stream endpoints (`anthropic/claude-sonnet-4-5`); a kind not
            listed is `model_not_found`. Empty: only the offered models.
        route_env: where those providers' keys and base URLs come from (the variables
            `provider_from_env` reads); None: the process's environment.
        redis_url: keep run logs in this Redis (`redis://...`, needs the `redis` extra), so that
            every server sharing it serves every run's subscribers; None keeps them in memory.
            An unreachable Redis stops the server from starting (no fallback to memory).
        takeover: with `redis_url`, a run whose server is gone (killed, hung: its lease ran
            out) is started again by another server sharing the Redis, its events following
            the log's last (a `status` `taken_over`, an `attempt.reset`, the new attempt), so
            that its readers get an answer, not `server_lost`. The run's request stays in Redis
            while the run is open. Agent runs are never taken over. Off: such runs end
            `server_lost`.
        ui_resume: keep each AI SDK chat's current UI stream running when its reader leaves, so
            `useChat({ resume: true })` resumes it after a reload (`GET
            /v1/ui/chat/{id}/stream`, from its first part); `DELETE` there, or the chat's next
            message, stops it. Off: a reader that leaves stops its stream and the provider's
            request, and there is nothing to resume (204).
        tools: a named tool set (`demo`) runs may ask for (`"tools": "demo"` in
            `POST /v1/runs`): such a run is an agent run, its approvals answered at
            `POST /v1/runs/{id}/approvals/{approval_id}`. None: runs are single turns.
        workers: server processes sharing the port (`SO_REUSEPORT`: Linux spreads new
            connections over them; macOS and the BSDs have the option but may hand every
            connection to one), their runs shared through `redis_url`, which more than one
            needs. `serve` then
            supervises them: the configuration (and `api_key`) reaches each worker pickled,
            so the provider (or its function) must pickle. 1: this process serves.
        reuse_port: bind with `SO_REUSEPORT`, so that other processes may bind the same port
            and the kernel spreads connections among them (what each worker does).
        worker: which worker this process is (0-based, set by the supervisor; shown at
            `/metrics.json`); None when it is no worker.
        hub_options: with `redis_url`, settings of the Redis hub (`RedisHub`'s attributes:
            `lease`, `lease_interval`, `retention`, `block`, ...) over its defaults; a
            deployment rarely needs them (the chaos soak shortens the lease so that a killed
            worker's runs are taken over within seconds).
        prices: what the models cost (`rillet.Prices`: a `PriceTable`, `GenAIPrices`...):
            each run's `usage` event then carries its cost, and `/metrics` counts the money
            spent by model (`rillet_cost_total`). `rillet serve --prices genai|FILE`.
        max_cost: the most one run may spend, in the prices' currency (needs `prices`): a
            request its money cannot pay for is not sent, and a reply is capped at what the
            rest buys; the run then ends `max_cost`. An agent run's steps share it.
    """

    provider: Provider | Callable[[str], Provider]
    host: str = "127.0.0.1"
    port: int = 8787
    api_key: Secret | None = None
    models: tuple[str, ...] = attrs.field(default=(), converter=_models)
    policy: Policy | None = None
    limits: Limits = Limits()
    reasoning: bool = False
    tool_arguments: bool = False
    redis_url: str | None = None
    tools: str | None = None
    ui_resume: bool = False
    takeover: bool = True
    route_kinds: tuple[str, ...] = attrs.field(default=(), converter=_models)
    route_env: Mapping[str, str] | None = None
    workers: int = 1
    reuse_port: bool = False
    worker: int | None = None
    hub_options: Mapping[str, float] = attrs.field(factory=dict)
    prices: Prices | None = attrs.field(default=None, converter=as_prices)
    max_cost: Decimal | None = attrs.field(default=None, converter=as_money)

    @property
    def loopback(self) -> bool:
        """Whether `host` is a loopback address (or name)."""
        return is_loopback(self.host)

    def check(self) -> None:
        """Raise `ServerConfigError` for a configuration that must not start."""
        if not self.loopback and self.api_key is None:
            raise ServerConfigError(
                f"refusing to serve on {self.host!r} without a server key: anyone who can reach "
                "it could spend the provider's credit. Set api_key (--server-key-file or "
                "RILLET_SERVER_KEY) or bind to 127.0.0.1."
            )
        if self.workers < 1:
            raise ServerConfigError(f"workers must be at least 1, not {self.workers}")
        if self.max_cost is not None and self.prices is None:
            raise ServerConfigError(
                "max_cost needs prices to count the money: give prices (--prices genai, or a "
                "JSON file of each model's prices)"
            )
        if self.workers > 1 and self.redis_url is None:
            raise ServerConfigError(
                f"{self.workers} workers need a Redis to share their runs: set redis_url "
                "(--redis redis://host:port/0), or serve with one worker"
            )
        if (self.workers > 1 or self.reuse_port) and not hasattr(socket, "SO_REUSEPORT"):
            raise ServerConfigError(
                "this system has no SO_REUSEPORT: serve with one worker (or one server per "
                "port behind a load balancer)"
            )


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or name."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
