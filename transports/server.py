"""rillet's delivery server: runs started over HTTP, their events fanned out over SSE and
WebSocket from the hub, an MMSP-compatible streaming endpoint, and the live page.

Endpoints:

- `GET /`: the live page (`static/index.html`).
- `POST /v1/runs`: start a run (`{"prompt"}` or `{"messages", ...}`); the server key when one is
  configured; answers 201 `{"run_id", "token", "events_url", "ws_url"}`. The token reads that
  run only. `DELETE /v1/runs/{id}` (with the token) cancels it.
- `GET /v1/runs/{id}/events`: the run events as SSE, `id: <run_id>:<seq>`, resumable by
  `Last-Event-ID` (which wins) or `?after=<seq>`; a comment every `heartbeat` seconds of
  silence; 204 when the cursor is already at the end of a finished run (an EventSource then
  stops reconnecting).
- `GET /v1/runs/{id}/ws`: the same events as WebSocket text frames, resumable by `?after=`.
  Close codes: 1000 after `run.done`, 1013 fell behind (resume), 1008 policy (`not_found`,
  `cursor_invalid`, `cursor_expired`, `too_many_subscribers`, `rate_limited`, `not_json`),
  1009 message too big, 1003 binary message, 1007 invalid UTF-8.
- `POST /v1/stream`, `GET /v1/models`: MMSP's server wire (UniEvents as SSE `data:` lines ended
  by `data: [DONE]`; errors as `{"error": {"type", "message", ...}}`).
- `GET /healthz`, `GET /metrics` (JSON).

Security: the server key is compared in constant time; a run's token reads only that run, and an
unknown run and a wrong token get the same bytes; provider keys, provider messages (but for an
invalid request's, with the key scrubbed) and request headers never reach a response or a log
line; bodies over `max_body` get 413, subscribers over the per-run or per-client limit 429 (WS
1008), a request head not complete within `head_timeout` a closed connection. A server bound to
loopback answers only requests whose `Host` is a loopback name (DNS rebinding), and any
state-changing request or WebSocket whose `Origin` is another site is refused (403).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import re
import secrets
from base64 import b64encode
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import h11
import httpx
import msgspec
import trio
import trio_websocket
from rillet._errors import (
    FallbackFailed,
    FrameError,
    InvalidRequestError,
    ProviderError,
    RilletError,
    StreamError,
    TransportError,
    TurnTimeout,
)
from rillet._events import UniEvent, UniMessage, encode_json
from rillet._handler import AttemptReset
from rillet._hub import (
    CursorExpired,
    CursorInvalid,
    Entry,
    Hub,
    HubError,
    HubUnavailable,
    RunHub,
    SubscriberDropped,
    Subscription,
    UnknownRun,
    parse_cursor,
)
from rillet._policy import Outcome, Policy
from rillet._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest, user
from rillet._runevents import RunDone, RunEvent, StatusEvent
from rillet._turn import Sink, SinkBatch, Turn, TurnResult, UniItem, run_turn
from rillet.providers._base import Provider, Secret

from ._http11 import BodyTooLarge, HttpConnection, Request, RequestRefused, RequestTimeout
from ._http11 import ConnectionStream as _ConnectionStream
from ._ws import TokenBucket, close_websocket, handshake_problem, open_websocket, text_frame

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


__all__ = ["Limits", "ServerConfig", "ServerConfigError", "serve"]

logger = logging.getLogger(__name__)

SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-cache, no-transform"),
    ("x-accel-buffering", "no"),
)
_HEARTBEAT = b": keep-alive\n\n"
_RETRY = b"retry: 1000\n\n"  # EventSource reconnects after a second
_DONE = b"data: [DONE]\n\n"
_PROBE = b":\n\n"  # an empty SSE comment
_PROBE_WAIT = 0.05  # seconds for a reset to come back over loopback or a LAN
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
_RUN_ID = re.compile(r"[0-9a-f]{1,64}")
_FULL_BODY = b'{"error":{"type":"too_many_connections","message":"too many connections"}}'
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"x-content-type-options: nosniff\r\nretry-after: 1\r\ncontent-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_FULL_BODY), _FULL_BODY)
)
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


class ServerConfigError(RilletError, ValueError):
    """The server cannot start as configured (an open server off loopback)."""


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
            is its address, the run token it reads with and its `X-Rillet-Session`, if any:
            every local program is 127.0.0.1, and one of them holding its quota must not lock
            the others out.
        max_streams: provider streams (runs and MMSP streams) running at once, process-wide;
            a run past it waits in the queue (a `status` event, phase `queued`). The upstream
            connection pool is this size, so an admitted stream never waits for a connection.
        max_queued: runs and streams waiting for a slot; past it 429 with `Retry-After`.
        max_runs_per_client: the runs and streams one client (its address, server key and
            `X-Rillet-Session`) may hold running or queued (429 past it): no client takes the
            whole capacity.
        max_active_runs: runs and streams started and not finished, queued ones included
            (429 past it); the lower of it and `max_streams + max_queued` applies.
        max_connections: client connections open at once; past it a connection gets 503 and is
            closed at once (the cap stays under the process's file limit).
        heartbeat: seconds of silence before an SSE comment (or a WebSocket pong) goes out.
        head_timeout: seconds a connection may take to send a request's head, counted from
            when the server waits for it, and again for its body (slow clients are closed).
        write_timeout: seconds a write may make no progress (the client reads nothing) before
            the connection is closed.
        close_timeout: seconds a closing stream gives a client to take its last bytes.
        sweep_interval: seconds between sweeps of expired runs (and their tokens).
        send_buffer: the kernel send buffer of each connection (`SO_SNDBUF`), None for the
            system's: what may sit in the kernel for a client that stopped reading.
    """

    max_body: int = 1024 * 1024
    max_ws_message: int = 64 * 1024
    ws_rate: float = 20.0
    ws_burst: int = 40
    max_subscribers_per_run: int = 1000
    max_subscribers_per_client: int = 64
    max_streams: int = 32
    max_queued: int = 64
    max_runs_per_client: int = 16
    max_active_runs: int = 256
    max_connections: int = 4096
    heartbeat: float = 15.0
    head_timeout: float = 10.0
    write_timeout: float = 30.0
    close_timeout: float = 2.0
    sweep_interval: float = 30.0
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
            the MMSP endpoints; None leaves them open (loopback only).
        models: the model ids offered (`/v1/models`); the first is the default. Empty: the
            provider's own model.
        policy: the turns' policy (None: the default policy).
        limits: sizes, rates and timeouts.
        reasoning: whether run events carry the model's reasoning text.
        tool_arguments: whether run events carry tool call arguments.
        redis_url: keep run logs in this Redis (`redis://...`, needs the `redis` extra), so that
            every server sharing it serves every run's subscribers; None keeps them in memory.
            An unreachable Redis stops the server from starting (no fallback to memory).
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

    @property
    def loopback(self) -> bool:
        """Whether `host` is a loopback address (or name)."""
        return _is_loopback(self.host)

    def check(self) -> None:
        """Raise `ServerConfigError` for a configuration that must not start."""
        if not self.loopback and self.api_key is None:
            raise ServerConfigError(
                f"refusing to serve on {self.host!r} without a server key: anyone who can reach "
                "it could spend the provider's credit. Set api_key (--server-key) or bind to "
                "127.0.0.1."
            )


def _is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


async def serve(
    config: ServerConfig,
    *,
    hub: RunHub | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started` gets the bound `http://host:port` URL.

    Embeddable: `url = await nursery.start(serve, config)`. Every connection and every run is a
    task of this call's nursery, so cancelling it stops them all. Pass a `hub` to share run logs
    with the application; with `config.redis_url` (and no `hub`) the logs live in Redis and
    every server sharing it serves every run's subscribers; otherwise a server serves the runs
    it started. Raises `ServerConfigError` before binding for an open server off loopback, and
    `HubUnavailable` before binding when the configured Redis does not answer.
    """
    config.check()
    limits = config.limits
    if hub is None and config.redis_url is not None:
        from rillet._redis_hub import open_redis_hub

        async with open_redis_hub(
            config.redis_url, max_subscribers_per_run=limits.max_subscribers_per_run
        ) as shared:
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
    async with (
        httpx.AsyncClient(
            timeout=httpx.Timeout(None), follow_redirects=False, limits=pool
        ) as client,
        trio.open_nursery() as nursery,
    ):
        listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        server = _Server(config, hub, client, nursery)
        for listener in listeners:
            nursery.start_soon(_accept, listener, server, nursery)
        nursery.start_soon(server.sweep)
        host, port = listeners[0].socket.getsockname()[:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        logger.info("serving on %s", url)
        task_status.started(url)


_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


async def _accept(listener: trio.SocketListener, server: _Server, nursery: trio.Nursery) -> None:
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


# --- replies --------------------------------------------------------------------------------


class _Reply(Exception):
    """A whole response to send instead of going on (an error, usually)."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        close: bool = False,
        **fields: Any,
    ) -> None:
        super().__init__(kind)
        self.status = status
        self.body = _error_body(kind, message, **fields)
        self.headers = headers
        self.close = close


def _error_body(kind: str, message: str, **fields: Any) -> bytes:
    return msgspec.json.encode({"error": {"type": kind, "message": message, **fields}})


def _not_found() -> _Reply:
    """One answer for "no such run" and "not your run": the same bytes, nothing tells them
    apart."""
    return _Reply(404, "not_found", "no such run")


def _log_unavailable() -> _Refused:
    """The shared run log (Redis) cannot be reached: retry later."""
    return _Refused(
        503, "log_unavailable", "the run log is unavailable; retry shortly", retry_after=1
    )


class _Refused(Exception):
    """A subscription refused: `kind` is the WebSocket close reason, `status` the HTTP one."""

    def __init__(self, status: int, kind: str, message: str, **fields: Any) -> None:
        super().__init__(kind)
        self.status = status
        self.kind = kind
        self.message = message
        self.fields = fields

    def reply(self) -> _Reply:
        return _Reply(self.status, self.kind, self.message, **self.fields)


# --- request bodies -------------------------------------------------------------------------


class _RunBody(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/runs`: a prompt, or a conversation with its settings."""

    prompt: str | None = None
    messages: list[UniMessage] | None = None
    model: str | None = None
    system_prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    thinking_level: ThinkingLevel | None = None
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None


class _UniConfig(msgspec.Struct, frozen=True, kw_only=True):
    """MMSP's UniConfig (the keys rillet acts on; `thinking_summary` and `prompt_caching` are
    accepted and left to the provider's defaults)."""

    max_tokens: int | None = None
    temperature: float | None = None
    tools: list[ToolSpec] | None = None
    thinking_summary: bool | None = None
    thinking_level: ThinkingLevel | None = None
    tool_choice: ToolChoice | None = None
    system_prompt: str | None = None
    prompt_caching: Any = None


class _StreamBody(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/stream`: MMSP's request."""

    model: str
    messages: list[UniMessage]
    config: _UniConfig = _UniConfig()


_decode_run_body = msgspec.json.Decoder(_RunBody).decode
_decode_stream_body = msgspec.json.Decoder(_StreamBody).decode


def _run_request(body: _RunBody) -> TurnRequest:
    if (body.prompt is None) == (body.messages is None):
        raise ValueError("send either `prompt` or `messages`")
    if body.prompt is not None:
        if not body.prompt.strip():
            raise ValueError("`prompt` is empty")
        messages = [user(body.prompt)]
    else:
        assert body.messages is not None
        if not body.messages:
            raise ValueError("`messages` is empty")
        messages = body.messages
    return TurnRequest(
        messages=messages,
        system_prompt=body.system_prompt,
        tools=body.tools,
        tool_choice=body.tool_choice,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        thinking_level=body.thinking_level,
    )


def _stream_request(body: _StreamBody) -> TurnRequest:
    if not body.messages:
        raise ValueError("`messages` is empty")
    config = body.config
    return TurnRequest(
        messages=body.messages,
        system_prompt=config.system_prompt or None,
        tools=config.tools or [],
        tool_choice=config.tool_choice,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        thinking_level=config.thinking_level,
    )


# --- state ----------------------------------------------------------------------------------


@attrs.define(eq=False)
class RunState:
    """A run: who may read it (`access`: its token's digest, which the hub shares with other
    servers), and its turn while this server runs it."""

    token: str
    turn: Turn | None = None
    waiting: trio.CancelScope | None = None  # its wait for admission, while queued
    access: bytes = attrs.field()

    @access.default
    def _digest(self) -> bytes:
        return _token_digest(self.token)


def _token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@attrs.define(eq=False)
class _Metrics:
    """Counters and recent samples for `/metrics`."""

    window: float = 10.0
    runs_started: int = 0
    streams_started: int = 0
    connections: int = 0
    connections_refused: int = 0
    subscribers_dropped: int = 0
    _buckets: collections.deque[list[float]] = attrs.field(factory=collections.deque)
    _ttfe: collections.deque[float] = attrs.field(factory=lambda: collections.deque(maxlen=1024))

    def count(self, events: int) -> None:
        """`events` were produced now (one-second buckets over the window)."""
        second = math.floor(trio.current_time())
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += events
        else:
            buckets.append([second, events])
            while buckets and buckets[0][0] <= second - self.window:
                buckets.popleft()

    def events_per_second(self) -> float:
        now = trio.current_time()
        total = sum(n for second, n in self._buckets if second > now - self.window)
        return total / self.window

    def finished(self, result: TurnResult) -> None:
        if result.time_to_first_event is not None:
            self._ttfe.append(result.time_to_first_event)

    def ttfe(self) -> dict[str, float | int | None]:
        ordered = sorted(self._ttfe)

        def rank(p: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)] * 1000, 3)

        return {"count": len(ordered), "p50": rank(0.5), "p95": rank(0.95), "p99": rank(0.99)}


@attrs.define(eq=False)
class _HubFeed:
    """A run's sink into the hub, counting the events for `/metrics`. A run that waited in the
    queue has its own events first (`status` queued): the turn's events follow them, their seqs
    moved by `shift`, so the log stays gapless from seq 1."""

    inner: Sink
    metrics: _Metrics
    run_id: str = ""
    turn: Turn | None = None
    shift: int = 0
    offset_ms: int = 0  # how long the run waited before its turn started
    started: float = attrs.field(factory=trio.current_time)

    async def deliver(self, batch: SinkBatch) -> None:
        if batch.run:
            self.metrics.count(len(batch.run))
            if self.shift:
                shift = self.shift
                offset = self.offset_ms
                moved = [
                    msgspec.structs.replace(e, seq=e.seq + shift, elapsed_ms=e.elapsed_ms + offset)
                    for e in batch.run
                ]
                batch = SinkBatch(run=moved, uni=batch.uni)
            await self.inner.deliver(batch)

    async def own(self, event: RunEvent) -> None:
        """One of the server's own events for the run (before the turn's, or instead)."""
        self.shift += 1
        await self.inner.deliver(SinkBatch(run=[event], uni=()))

    def envelope(self) -> dict[str, Any]:
        """The envelope of the server's next own event."""
        elapsed = int((trio.current_time() - self.started) * 1000)
        return {"run_id": self.run_id, "seq": self.shift + 1, "elapsed_ms": elapsed}

    async def close(self) -> None:
        await self.inner.close()


@attrs.define(eq=False)
class _ChannelSink:
    """Hands a turn's MMSP items to the connection that streams them (backpressure: a client
    that reads slowly slows its own turn, nobody else's)."""

    send: trio.MemorySendChannel[list[UniItem]]

    async def deliver(self, batch: SinkBatch) -> None:
        if batch.uni:
            with contextlib.suppress(*_GONE):  # the response is over; the turn is cancelled
                await self.send.send(list(batch.uni))

    async def close(self) -> None:
        await self.send.aclose()


@attrs.define(eq=False)
class _WsState:
    """How a WebSocket session ends: the close to send, or the client already gone."""

    code: int | None = None
    reason: str | None = None

    def close(self, code: int, reason: str) -> None:
        if self.code is None:
            self.code, self.reason = code, reason


# --- capacity -------------------------------------------------------------------------------


def _uncount(counter: collections.Counter[Any], key: Any) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def _subscriber(request: Request) -> bytes:
    """The client a subscription counts against: who reads with this run token."""
    return _client_key(request, request.bearer() or request.query.get("token", ""))


def _client_key(request: Request, credential: str) -> bytes:
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
class _Ticket:
    """A run's (or MMSP stream's) place in the admission: reserved at once, holding a slot once
    admitted."""

    client: bytes
    admitted: bool = False
    released: bool = False


@attrs.define(eq=False)
class _Admission:
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
    def of(cls, limits: Limits) -> _Admission:
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

    def reserve(self, client: bytes) -> _Ticket | None:
        """A place for `client`, or None when the capacity or the client's share is taken."""
        if self.pending >= self.ceiling or self.held[client] >= self.per_client:
            return None
        self.pending += 1
        self.held[client] += 1
        return _Ticket(client)

    def try_admit(self, ticket: _Ticket) -> bool:
        """Take a slot now if one is free and nobody waits for one."""
        try:
            self._limiter.acquire_on_behalf_of_nowait(ticket)
        except trio.WouldBlock:
            return False
        ticket.admitted = True
        return True

    async def admit(self, ticket: _Ticket) -> None:
        """Wait for a slot (in turn)."""
        await self._limiter.acquire_on_behalf_of(ticket)
        ticket.admitted = True

    def release(self, ticket: _Ticket) -> None:
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


# --- writing a run's events ----------------------------------------------------------------


def _sse_events(prefix: bytes, batch: Sequence[Entry]) -> bytes:
    """A batch as SSE events, `id: <run_id>:<seq>` (`prefix` is `id: <run_id>:`)."""
    return b"".join(b"%s%d\ndata: %s\n\n" % (prefix, entry.seq, entry.data) for entry in batch)


def _ws_frames(batch: Sequence[Entry]) -> bytes:
    """A batch as WebSocket text frames, one per event, to go out in one write."""
    return b"".join([text_frame(entry.data) for entry in batch])


@attrs.define(eq=False)
class _LastBatch:
    """The bytes of the batch encoded last, and when. The hub hands every subscriber it pushes
    to in one sweep the same list: a run's events are encoded once for all of them."""

    batch: list[Entry] | None = None
    data: bytes = b""
    at: float = 0.0


@attrs.define(eq=False)
class _Pusher:
    """A subscriber's `push` writer: new events written straight to its connection, without
    waiting and without waking its task, while the task waits in `next_batch`.

    Attributes:
        stream: the connection.
        encode: a batch's bytes as they go on the wire, the same for every connection of its
            kind (SSE, WebSocket).
        last: the last batch encoded, shared by the connections of that kind.
        ws: the WebSocket, if it is one (nothing is pushed once it is closing).
        scope: the task's wait, cancelled when a push left bytes parked (the task flushes them).
        written_at: when bytes last went out (a heartbeat is due `heartbeat` s after it).
    """

    stream: _ConnectionStream
    encode: Callable[[list[Entry]], bytes]
    last: _LastBatch
    ws: trio_websocket.WebSocketConnection | None = None
    scope: trio.CancelScope | None = None
    written_at: float = attrs.field(factory=trio.current_time)

    def wire(self, batch: list[Entry]) -> bytes:
        """The batch's bytes: encoded once for every connection handed the same list."""
        last = self.last
        if batch is not last.batch:
            last.data, last.batch, last.at = self.encode(batch), batch, trio.current_time()
        return last.data

    def __call__(self, batch: list[Entry]) -> bool:
        if self.ws is not None and self.ws.closed is not None:
            return False
        if not self.stream.try_send(self.wire(batch)):
            return False
        self.written_at = self.last.at
        if self.scope is not None and self.stream.parked:
            self.scope.cancel()
        return True


# --- the server -----------------------------------------------------------------------------


_Handler = Callable[[HttpConnection, Request, str], Awaitable[None]]


@attrs.define(eq=False)
class _Server:
    config: ServerConfig
    hub: RunHub
    client: httpx.AsyncClient
    nursery: trio.Nursery
    runs: dict[str, RunState] = attrs.field(factory=dict)
    metrics: _Metrics = attrs.field(factory=_Metrics)
    per_run: collections.Counter[str] = attrs.field(factory=collections.Counter)
    per_client: collections.Counter[bytes] = attrs.field(factory=collections.Counter)
    admission: _Admission = attrs.field()
    _decoy: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))
    _page: tuple[bytes, str] = attrs.field(factory=lambda: _load_page())
    _sse_last: _LastBatch = attrs.field(factory=_LastBatch)
    _ws_last: _LastBatch = attrs.field(factory=_LastBatch)
    _static: dict[str, dict[str, _Handler]] = attrs.field(init=False)
    _per_run: dict[str, dict[str, _Handler]] = attrs.field(init=False)

    @admission.default
    def _admission(self) -> _Admission:
        return _Admission.of(self.config.limits)

    def __attrs_post_init__(self) -> None:
        self._static = {
            "/": {"GET": self._page_handler},
            "/index.html": {"GET": self._page_handler},
            "/healthz": {"GET": self._healthz},
            "/metrics": {"GET": self._metrics},
            "/v1/models": {"GET": self._models},
            "/v1/stream": {"POST": self._stream},
            "/v1/runs": {"POST": self._start_run},
        }
        self._per_run = {
            "": {"DELETE": self._cancel_run},
            "events": {"GET": self._events},
            "ws": {"GET": self._websocket},
        }

    @property
    def limits(self) -> Limits:
        return self.config.limits

    # --- connections ------------------------------------------------------------------------

    async def handle(self, socket_stream: trio.SocketStream) -> None:
        """One connection: requests until the client leaves, a response ends it, or it stalls."""
        if self.limits.send_buffer is not None:
            socket_stream.setsockopt(
                trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, self.limits.send_buffer
            )
        if self.metrics.connections >= self.limits.max_connections:
            await self._refuse_connection(socket_stream)
            return
        stream = _ConnectionStream(socket_stream, write_timeout=self.limits.write_timeout)
        http = HttpConnection(stream)
        self.metrics.connections += 1
        try:
            await self._converse(http)
        except* _GONE:
            pass
        except* trio_websocket.ConnectionClosed:
            pass
        except* Exception as group:  # a bug must not take the server down with it
            logger.error("connection failed", exc_info=group)
        finally:
            self.metrics.connections -= 1
            try:
                if http.refused:
                    await stream.linger(self.limits.close_timeout)
            finally:  # cancelled (the server stops) or not, the socket is closed
                await stream.close_transport()

    async def _refuse_connection(self, socket_stream: trio.SocketStream) -> None:
        """Past the connection cap: a 503 if the socket takes it at once, then closed."""
        self.metrics.connections_refused += 1
        with contextlib.suppress(OSError):  # the socket is non-blocking: this never waits
            os.write(socket_stream.socket.fileno(), _FULL)
        await trio.aclose_forcefully(socket_stream)

    async def _converse(self, http: HttpConnection) -> None:
        while True:
            try:
                request = await http.next_request(self.limits.head_timeout)
            except RequestTimeout:
                return
            except RequestRefused as refused:
                body = _error_body("bad_request", refused.message)
                await http.respond(refused.status, body, close=True)
                return
            except h11.RemoteProtocolError as exc:
                if http.responding:
                    status = exc.error_status_hint
                    body = _error_body("bad_request", "malformed HTTP request")
                    await http.respond(status, body, close=True)
                return
            if request is None:
                return
            keep = await self._dispatch(http, request)
            if not keep or not http.reusable:
                return
            http.next_cycle()

    async def _dispatch(self, http: HttpConnection, request: Request) -> bool:
        """Answer one request; False when the connection must close after it."""
        try:
            self._check_host(request)
            handler, arg = self._route(request)
            if request.method not in ("GET", "HEAD") or request.path.endswith("/ws"):
                self._check_origin(request)
            await handler(http, request, arg)
        except _Reply as reply:
            if not http.responding:
                return False
            head_only = request.method == "HEAD"
            # a request whose body was not read cannot be followed by another one
            close = reply.close or not http.request_read()
            await http.respond(
                reply.status, reply.body, reply.headers, head_only=head_only, close=close
            )
            return not close
        except (BodyTooLarge, RequestTimeout, RequestRefused, h11.RemoteProtocolError) as exc:
            if http.responding:
                if isinstance(exc, RequestRefused):
                    status, kind, message = exc.status, "bad_request", exc.message
                elif isinstance(exc, BodyTooLarge):
                    status, kind, message = 413, "body_too_large", "the request body is too large"
                elif isinstance(exc, RequestTimeout):
                    status, kind, message = 408, "request_timeout", "the request body was too slow"
                else:
                    status, kind, message = 400, "bad_request", "malformed HTTP request body"
                await http.respond(status, _error_body(kind, message), close=True)
            return False
        except _CloseConnection:
            return False
        return True

    def _route(self, request: Request) -> tuple[_Handler, str]:
        path, method = request.path, request.method
        methods = self._static.get(path)
        arg = ""
        if methods is None:
            parts = path.split("/")
            if len(parts) >= 4 and parts[:3] == ["", "v1", "runs"]:
                arg = parts[3]
                methods = self._per_run.get("/".join(parts[4:]))
        if methods is None:
            raise _Reply(404, "not_found", "no such route")
        head = "GET" in methods and not arg  # a run's streams have no HEAD
        handler = methods.get("GET" if method == "HEAD" and head else method)
        if handler is None:
            allow = ", ".join(sorted({*methods, *(["HEAD"] if head else [])}))
            raise _Reply(
                405, "method_not_allowed", "method not allowed", headers=[("allow", allow)]
            )
        return handler, arg

    def _check_host(self, request: Request) -> None:
        """On loopback, only loopback names: a page on another site whose name was rebound to
        127.0.0.1 must not reach the server."""
        if not self.config.loopback:
            return
        host = request.headers.get("host")
        if host is None:
            return  # HTTP/1.0: no name to rebind
        name = urlsplit(f"//{host}").hostname or ""
        if not _is_loopback(name):
            raise _Reply(403, "forbidden", "this server answers loopback names only", close=True)

    @staticmethod
    def _check_origin(request: Request) -> None:
        """A browser on another site may not start runs or open WebSockets here."""
        origin = request.headers.get("origin")
        if origin is None:
            return
        try:
            source = urlsplit(origin)
            target = urlsplit(f"//{request.headers.get('host', '')}")
            default = 443 if source.scheme == "https" else 80
            same = (source.hostname, source.port or default) == (target.hostname, target.port or 80)
        except ValueError:  # a port that is not one
            same = False
        if not same:
            raise _Reply(403, "forbidden", "cross-origin requests are refused", close=True)

    def _require_key(self, request: Request, *, mmsp: bool = False) -> None:
        key = self.config.api_key
        if key is None:
            return
        # digests of equal length: the comparison tells nothing, not even the key's length
        given = hashlib.sha256((request.bearer() or "").encode()).digest()
        if not hmac.compare_digest(given, hashlib.sha256(key.reveal().encode()).digest()):
            kind = "AuthenticationError" if mmsp else "unauthorized"
            raise _Reply(
                401,
                kind,
                "missing or wrong server key (Authorization: Bearer <key>)",
                headers=[("www-authenticate", "Bearer")],
            )

    async def _read_json(
        self, http: HttpConnection, request: Request, decode: Callable[[bytes], Any], kind: str
    ) -> Any:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            # a browser may send other types cross-site without asking first: refuse them
            raise _Reply(415, kind, "the body must be application/json")
        body = await http.read_body(request, self.limits.max_body, self.limits.head_timeout)
        try:
            return decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise _Reply(400, kind, f"invalid request body: {exc}") from None
        except RecursionError:  # nested deeper than the decoder follows: refused, not a crash
            raise _Reply(400, kind, "invalid request body: nested too deeply") from None

    def _offered_models(self) -> tuple[str, ...]:
        """The models served: the configured list, else the provider's own model."""
        configured = self.config.provider
        if not self.config.models and isinstance(configured, Provider):
            return (configured.model,)
        return self.config.models

    def _provider(self, model: str | None, *, mmsp: bool) -> Provider:
        configured = self.config.provider
        models = self._offered_models()
        if model is None:
            if not models:
                raise _Reply(400, "InvalidRequestError" if mmsp else "invalid_request", "no model")
            model = models[0]
        if models and model not in models:
            raise _Reply(404, "NotFoundError" if mmsp else "unknown_model", "unknown model")
        if isinstance(configured, Provider):
            if configured.model == model:
                return configured
            return attrs.evolve(configured, model=model)
        try:
            return configured(model)
        except Exception as exc:
            logger.warning("no provider for a model: %s", type(exc).__name__)
            raise _Reply(
                400, "InvalidRequestError" if mmsp else "invalid_request", "model unavailable"
            ) from None

    def _reserve(self, request: Request, *, mmsp: bool) -> _Ticket:
        """A place in the admission for this request's client; 429 with `Retry-After` when the
        server's capacity or the client's share is taken."""
        ticket = self.admission.reserve(_client_key(request, request.bearer() or ""))
        if ticket is None:
            raise _Reply(
                429,
                "RateLimitError" if mmsp else "too_many_runs",
                "too many runs at once; retry shortly",
                headers=[("retry-after", "1")],
            )
        return ticket

    # --- simple endpoints -------------------------------------------------------------------

    async def _page_handler(self, http: HttpConnection, request: Request, _: str) -> None:
        body, csp = self._page
        headers = [
            ("cache-control", "no-cache"),
            ("content-security-policy", csp),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
        ]
        await http.respond(
            200,
            body,
            headers,
            content_type="text/html; charset=utf-8",
            head_only=request.method == "HEAD",
        )

    async def _healthz(self, http: HttpConnection, request: Request, _: str) -> None:
        await http.respond(200, b'{"status":"ok"}', head_only=request.method == "HEAD")

    async def _metrics(self, http: HttpConnection, request: Request, _: str) -> None:
        self._require_key(request)
        m = self.metrics
        body = {
            "runs_active": self.admission.running,
            "runs_queued": self.admission.waiting,
            "runs_started": m.runs_started,
            "runs_kept": len(self.runs),
            "streams_started": m.streams_started,
            "connections": m.connections,
            "connections_refused": m.connections_refused,
            "subscribers": self.hub.subscribers,
            "subscribers_dropped": m.subscribers_dropped,
            "events_per_second": round(m.events_per_second(), 3),
            "time_to_first_event_ms": m.ttfe(),
        }
        await http.respond(200, msgspec.json.encode(body), head_only=request.method == "HEAD")

    async def _models(self, http: HttpConnection, request: Request, _: str) -> None:
        self._require_key(request, mmsp=True)
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "rillet"}
            for model in self._offered_models()
        ]
        body = msgspec.json.encode({"object": "list", "data": data})
        await http.respond(200, body, head_only=request.method == "HEAD")

    # --- runs -------------------------------------------------------------------------------

    async def _start_run(self, http: HttpConnection, request: Request, _: str) -> None:
        self._require_key(request)
        body: _RunBody = await self._read_json(http, request, _decode_run_body, "invalid_request")
        try:
            turn_request = _run_request(body)
        except ValueError as exc:
            raise _Reply(400, "invalid_request", str(exc)) from None
        provider = self._provider(body.model, mmsp=False)
        ticket = self._reserve(request, mmsp=False)
        run_id = secrets.token_hex(12)
        record = RunState(token=secrets.token_urlsafe(24))
        try:
            try:
                inner = await self.hub.open_run(run_id, access=record.access)
            except HubUnavailable as exc:
                logger.error("refusing a new run: %s", exc)
                raise _log_unavailable().reply() from None
            sink = _HubFeed(inner, self.metrics, run_id)
            self.runs[run_id] = record
            try:
                await self.nursery.start(
                    self._run, turn_request, provider, run_id, sink, record, ticket
                )
            except RuntimeError:  # it failed before it could start (logged by `_run`)
                raise _Reply(500, "internal_error", "the run could not start") from None
        except BaseException:
            self.admission.release(ticket)
            raise
        base = self._base(request)
        query = f"?token={record.token}"
        answer = {
            "run_id": run_id,
            "token": record.token,
            "events_url": f"{base}/v1/runs/{run_id}/events{query}",
            "ws_url": f"ws{base.removeprefix('http')}/v1/runs/{run_id}/ws{query}",
        }
        await http.respond(201, msgspec.json.encode(answer))

    async def _run(
        self,
        request: TurnRequest,
        provider: Provider,
        run_id: str,
        sink: _HubFeed,
        record: RunState,
        ticket: _Ticket,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One run, in the server's nursery: it goes on whoever watches, or nobody. Started
        once its turn runs (so it can be cancelled); the turn is let go when it ends (the hub
        keeps its events)."""

        async def turn_task(
            task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
        ) -> TurnResult:
            return await run_turn(
                request,
                provider,
                sinks=[sink],
                policy=self.config.policy,
                client=self.client,
                run_id=run_id,
                reasoning=self.config.reasoning,
                tool_arguments=self.config.tool_arguments,
                history=False,  # the hub keeps the events; the turn need not keep a replay
                task_status=task_status,
            )

        self.metrics.runs_started += 1
        try:
            if not self.admission.try_admit(ticket):
                await self._queued(sink, record, ticket, task_status)
                if not ticket.admitted:
                    return
                task_status = trio.TASK_STATUS_IGNORED
            async with trio.open_nursery() as nursery:
                record.turn = sink.turn = await nursery.start(turn_task)
                task_status.started()
                self.metrics.finished(await record.turn.result())
        except Exception as exc:  # a bug in one run must not take the server down
            logger.error("run %s failed: %s", run_id, type(exc).__name__, exc_info=True)
        finally:
            self.admission.release(ticket)
            record.turn = sink.turn = None

    async def _queued(
        self, sink: _HubFeed, record: RunState, ticket: _Ticket, task_status: trio.TaskStatus[None]
    ) -> None:
        """Wait in the queue for a slot: the run's log says so first (`status`, phase
        `queued`), and the run is started for its client meanwhile. Cancelled while it waits,
        the run ends there (`run.done` cancelled) and never reaches the provider."""
        await sink.own(StatusEvent(**sink.envelope(), phase="queued", attempt=0))
        with trio.CancelScope() as record.waiting:
            task_status.started()
            await self.admission.admit(ticket)
        record.waiting = None
        if ticket.admitted:
            sink.offset_ms = int((trio.current_time() - sink.started) * 1000)
            return
        await sink.own(RunDone(**sink.envelope(), status="cancelled", code="cancelled"))
        await sink.close()

    async def sweep(self) -> None:
        """Every `sweep_interval` seconds: the hub forgets expired runs, and the server the
        tokens of runs the hub has forgotten (not only when a run starts: an idle server must
        give its memory back too)."""
        while True:
            await trio.sleep(self.limits.sweep_interval)
            try:
                await self.hub.sweep()
                kept = await self.hub.kept(list(self.runs))
            except HubUnavailable as exc:
                logger.warning("sweep skipped: %s", exc)
                continue
            for run_id in [r for r in self.runs if r not in kept]:
                self.runs.pop(run_id, None)

    def _base(self, request: Request) -> str:
        host = request.headers.get("host")
        if host is None or not re.fullmatch(r"[A-Za-z0-9.:\[\]-]+", host):
            return f"http://{self.config.host}:{self.config.port}"
        return f"http://{host}"

    async def _authorized(self, request: Request, run_id: str) -> RunState | None:
        """The run when the request carries its token; None for an unknown run or a wrong
        token alike (one constant-time comparison either way). A run another server started
        is known by the access the shared hub keeps; `_Refused` (503) when it cannot be asked."""
        record = self.runs.get(run_id) if _RUN_ID.fullmatch(run_id) else None
        if record is None and _RUN_ID.fullmatch(run_id):
            try:
                access = await self.hub.access(run_id)
            except HubUnavailable:
                raise _log_unavailable() from None
            record = RunState(token="", access=access) if access is not None else None
        given = _token_digest(request.bearer() or request.query.get("token", ""))
        expected = record.access if record is not None else _token_digest(self._decoy)
        if hmac.compare_digest(given, expected) and record is not None:
            return record
        return None

    async def _cancel_run(self, http: HttpConnection, request: Request, run_id: str) -> None:
        try:
            record = await self._authorized(request, run_id)
        except _Refused as refused:
            raise refused.reply() from None
        if record is None:
            raise _not_found()
        if run_id not in self.runs:
            raise _Reply(409, "elsewhere", "cancel the run on the server that started it")
        if record.turn is not None:
            record.turn.cancel()
        elif record.waiting is not None:
            record.waiting.cancel()
        await http.respond(202, msgspec.json.encode({"run_id": run_id}))

    @asynccontextmanager
    async def _subscription(
        self, run_id: str, cursor: str | None, client: bytes
    ) -> AsyncIterator[Subscription]:
        """Follow a run from a cursor, counted against the limits. Raises `_Refused`."""
        limits = self.limits
        try:
            after = parse_cursor(run_id, cursor)
            if self.per_run[run_id] >= limits.max_subscribers_per_run:
                raise HubError("too many subscribers for this run")
            if self.per_client[client] >= limits.max_subscribers_per_client:
                raise HubError("too many subscribers from this client")
            sub = await self.hub.follow(run_id, after)
        except UnknownRun:
            self.runs.pop(run_id, None)
            raise _Refused(404, "not_found", "no such run") from None
        except CursorInvalid as exc:
            raise _Refused(400, "cursor_invalid", exc.reason) from None
        except CursorExpired as exc:
            raise _Refused(
                410, "cursor_expired", "the log no longer keeps that seq", first_kept=exc.first_kept
            ) from None
        except HubUnavailable:
            raise _log_unavailable() from None
        except HubError as exc:
            raise _Refused(429, "too_many_subscribers", str(exc)) from None
        self.per_run[run_id] += 1
        self.per_client[client] += 1
        try:
            yield sub
        finally:
            sub.close()
            if sub.drop_reason is not None:
                self.metrics.subscribers_dropped += 1
            _uncount(self.per_run, run_id)
            _uncount(self.per_client, client)

    def _finished(self, run_id: str, sub: Subscription) -> bool:
        """Whether the subscriber is at the end of a run that is over."""
        return sub.at_end

    # --- SSE --------------------------------------------------------------------------------

    async def _events(self, http: HttpConnection, request: Request, run_id: str) -> None:
        cursor = request.headers.get("last-event-id") or request.query.get("after")
        try:
            if await self._authorized(request, run_id) is None:
                raise _not_found()
            async with self._subscription(run_id, cursor, _subscriber(request)) as sub:
                if self._finished(run_id, sub):
                    await http.respond(204, content_type="")
                    return
                await http.start_stream(200, SSE_HEADERS)
                pump = functools.partial(self._pump_sse, http, sub, run_id)
                completed = await self._until_gone(http, pump)
        except _Refused as refused:
            raise refused.reply() from None  # an unknown run: the same bytes as above
        await self._end_stream(http, completed)

    async def _end_stream(self, http: HttpConnection, completed: bool) -> None:
        """End a streamed body within the close grace; otherwise the connection closes."""
        if completed:
            with trio.move_on_after(self.limits.close_timeout):
                if http.conn.our_state is h11.SEND_BODY:
                    await http.end_stream()
                return
        raise _CloseConnection

    async def _pump_sse(self, http: HttpConnection, sub: Subscription, run_id: str) -> None:
        """Write the run's events until `run.done`, or until the subscriber is dropped (the
        stream then just ends: the client resumes from its `Last-Event-ID`)."""
        prefix = f"id: {run_id}:".encode()
        heartbeat = self.limits.heartbeat
        stream = http.stream

        def encode(batch: list[Entry]) -> bytes:
            return http.body_chunk(_sse_events(prefix, batch))

        pusher = _Pusher(stream, encode, self._sse_last)
        try:
            with sub.cancel_scope:
                await http.send_data(_RETRY)
                if http.chunked:  # an HTTP/1.0 client's body goes through h11 only
                    sub.push = pusher
                while True:
                    with trio.move_on_at(pusher.written_at + heartbeat) as idle:
                        pusher.scope = idle
                        batch = await sub.next_batch()
                    pusher.scope = None
                    if idle.cancelled_caught:
                        if stream.parked:  # a push left part of its bytes
                            await stream.flush()
                        elif pusher.written_at + heartbeat <= trio.current_time():
                            await http.send_data(_HEARTBEAT)
                            pusher.written_at = trio.current_time()
                        continue
                    if not batch:
                        return
                    if http.chunked:
                        await stream.send_all(pusher.wire(batch))
                    else:
                        await http.send_data(_sse_events(prefix, batch))
                    pusher.written_at = trio.current_time()
        except (SubscriberDropped, CursorExpired):
            return
        finally:
            sub.push = None

    async def _until_gone(self, http: HttpConnection, body: Callable[[], Awaitable[None]]) -> bool:
        """Run a streamed response's body while watching the connection: True when the body
        finished, False when the client went away first (the body is then cancelled)."""
        gone = False

        async def watch(scope: trio.CancelScope) -> None:
            nonlocal gone
            stream = http.stream
            while (more := await stream.receive_ahead()) is True:
                pass
            if more is None:  # the end of its requests: a close, or a half-close
                while not await self._probe(http):  # noqa: ASYNC110 (no event says the head went)
                    await trio.sleep(self.limits.heartbeat)
                await trio.sleep(_PROBE_WAIT)  # a client that closed answers the probe with a reset
                if not await stream.reset_by_peer():
                    await trio.sleep_forever()  # it half-closed: it still reads; stream on
            gone = True
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            try:
                await body()
            except _GONE:
                gone = True
            nursery.cancel_scope.cancel()
        return not gone

    @staticmethod
    async def _probe(http: HttpConnection) -> bool:
        """Send an SSE comment, if the streamed body has begun (False when it has not): a
        client that closed its connection answers it with a reset, one that half-closed reads
        it as nothing."""
        if http.conn.our_state is not h11.SEND_BODY:
            return False
        await http.send_data(_PROBE)
        return True

    # --- WebSocket --------------------------------------------------------------------------

    async def _websocket(self, http: HttpConnection, request: Request, run_id: str) -> None:
        if not request.is_websocket:
            raise _Reply(
                426,
                "upgrade_required",
                "this route speaks WebSocket",
                headers=[("upgrade", "websocket")],
                close=True,
            )
        problem = handshake_problem(request)
        if problem is not None:
            status, message = problem
            raise _Reply(
                status,
                "bad_handshake",
                message,
                headers=[("sec-websocket-version", "13")],
                close=True,
            )
        limits = self.limits
        try:
            async with open_websocket(
                http, request, max_message=limits.max_ws_message, within=limits.head_timeout
            ) as ws:
                state = _WsState()
                await self._ws_session(ws, http.stream, request, run_id, state)
                await close_websocket(
                    ws, http.stream, state.code, state.reason, within=limits.close_timeout
                )
        except (trio.TooSlowError, trio_websocket.HandshakeError):
            pass
        raise _CloseConnection

    async def _ws_session(
        self,
        ws: trio_websocket.WebSocketConnection,
        stream: _ConnectionStream,
        request: Request,
        run_id: str,
        state: _WsState,
    ) -> None:
        try:
            if await self._authorized(request, run_id) is None:
                state.close(1008, "not_found")
                return
            cursor = request.query.get("after")
            async with (
                self._subscription(run_id, cursor, _subscriber(request)) as sub,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(self._ws_reader, ws, state, nursery.cancel_scope)
                await self._ws_sender(ws, stream, sub, state)
                nursery.cancel_scope.cancel()
        except _Refused as refused:
            state.close(1013 if refused.status == 503 else 1008, refused.kind)

    async def _ws_sender(
        self,
        ws: trio_websocket.WebSocketConnection,
        stream: _ConnectionStream,
        sub: Subscription,
        state: _WsState,
    ) -> None:
        """Write the run's events as text frames (built once per run, written to the stream
        directly, several in one write) until `run.done`, a drop, or the client's close."""
        heartbeat = self.limits.heartbeat
        pusher = _Pusher(stream, _ws_frames, self._ws_last, ws)
        try:
            with sub.cancel_scope:
                sub.push = pusher
                while True:
                    with trio.move_on_at(pusher.written_at + heartbeat) as idle:
                        pusher.scope = idle
                        batch = await sub.next_batch()
                    pusher.scope = None
                    if idle.cancelled_caught:
                        if stream.parked:  # a push left part of its bytes
                            await stream.flush()
                        elif pusher.written_at + heartbeat <= trio.current_time():
                            await ws.pong()  # an unsolicited pong: a heartbeat needing no answer
                            pusher.written_at = trio.current_time()
                        continue
                    if not batch:
                        state.close(1000, "done")
                        return
                    if ws.closed is not None:  # closing: no more messages
                        return
                    await stream.send_all(pusher.wire(batch))
                    pusher.written_at = trio.current_time()
        except SubscriberDropped:
            pass
        except CursorExpired:
            state.close(1008, "cursor_expired")
        except (trio_websocket.ConnectionClosed, *_GONE):
            return
        finally:
            sub.push = None
        if sub.drop_reason is not None:
            state.close(1013, sub.drop_reason)

    async def _ws_reader(
        self, ws: trio_websocket.WebSocketConnection, state: _WsState, scope: trio.CancelScope
    ) -> None:
        """Read what the client sends: JSON text within the rate; anything else closes."""
        bucket = TokenBucket(self.limits.ws_rate, self.limits.ws_burst)
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                break
            if isinstance(message, bytes):
                state.close(1003, "binary messages are not accepted")
                break
            if not bucket.take():
                state.close(1008, "rate_limited")
                break
            try:
                msgspec.json.decode(message)
            except msgspec.DecodeError:
                state.close(1008, "not_json")
                break
        scope.cancel()

    # --- MMSP -------------------------------------------------------------------------------

    async def _stream(self, http: HttpConnection, request: Request, _: str) -> None:
        self._require_key(request, mmsp=True)
        body: _StreamBody = await self._read_json(
            http, request, _decode_stream_body, "InvalidRequestError"
        )
        try:
            turn_request = _stream_request(body)
        except ValueError as exc:
            raise _Reply(400, "InvalidRequestError", str(exc)) from None
        provider = self._provider(body.model, mmsp=True)
        ticket = self._reserve(request, mmsp=True)
        try:
            await self._mmsp_turn(http, turn_request, provider, ticket)
        finally:
            self.admission.release(ticket)

    async def _mmsp_turn(
        self, http: HttpConnection, turn_request: TurnRequest, provider: Provider, ticket: _Ticket
    ) -> None:
        """Wait for a slot (while the client stays), then stream the turn."""
        admit = functools.partial(self.admission.admit, ticket)
        if not self.admission.try_admit(ticket) and not await self._until_gone(http, admit):
            raise _CloseConnection
        policy = self.config.policy or Policy()
        send, receive = trio.open_memory_channel[list[UniItem]](policy.channel_size)
        self.metrics.streams_started += 1
        completed = False
        async with trio.open_nursery() as nursery:
            turn: Turn = await nursery.start(
                functools.partial(
                    run_turn,
                    turn_request,
                    provider,
                    sinks=[_ChannelSink(send)],
                    policy=policy,
                    client=self.client,
                    history=False,  # the stream is written from the sink's channel
                )
            )
            try:
                pump = functools.partial(self._pump_mmsp, http, turn, receive, provider)
                completed = await self._until_gone(http, pump)
            finally:
                if not completed:
                    turn.cancel()
        self.metrics.finished(await turn.result())
        await self._end_stream(http, completed)

    async def _pump_mmsp(
        self,
        http: HttpConnection,
        turn: Turn,
        receive: trio.MemoryReceiveChannel[list[UniItem]],
        provider: Provider,
    ) -> None:
        """Stream the turn's UniEvents as MMSP does. The head waits for the first event (or the
        turn's end) up to one heartbeat, so a request refused upstream gets an HTTP error
        status; after that, errors are one `{"error"}` event and `[DONE]`.

        A retry that voids events the client already has cannot be said in MMSP's grammar: the
        stream then ends with `IncompleteStreamError` (what the client would have seen from the
        failed attempt itself), and the client's own retry takes over. A reset before anything
        was written just drops the voided events."""
        heartbeat = self.limits.heartbeat
        started = written = False
        deadline = trio.current_time() + heartbeat
        while True:
            items: list[UniItem] | None = None
            with trio.move_on_at(deadline) as idle:
                try:
                    items = await receive.receive()
                except trio.EndOfChannel:
                    break
            if idle.cancelled_caught:
                if started:
                    await http.send_data(_HEARTBEAT)
                else:
                    await http.start_stream(200, SSE_HEADERS)
                    started = True
                deadline = trio.current_time() + heartbeat
                continue
            assert items is not None
            frames: list[bytes] = []
            stopped = reset = False
            for item in items:
                if type(item) is AttemptReset:
                    if written:
                        reset = True
                        break
                    frames.clear()
                    continue
                assert isinstance(item, UniEvent)
                frames.append(b"data: %s\n\n" % encode_json(item))
                stopped = item.event_type == "stop"
            if frames:
                self.metrics.count(len(frames))
                if not started:
                    await http.start_stream(200, SSE_HEADERS)
                    started = True
                await http.send_data(b"".join(frames))
                written = True
                deadline = trio.current_time() + heartbeat
            if reset:
                error = {
                    "type": "IncompleteStreamError",
                    "message": "the upstream attempt failed mid-stream; retry the request",
                    "missing": ["usage_metadata", "finish_reason"],
                    "finish_reason": None,
                    "usage_metadata": None,
                }
                await http.send_data(b"data: %s\n\n%s" % (_json({"error": error}), _DONE))
                turn.cancel()
                return
            if stopped:
                await http.send_data(_DONE)
                return
        result = await turn.result()
        if result.ok:  # a rescued reply without a stop cannot happen; end the stream anyway
            if not started:
                await http.start_stream(200, SSE_HEADERS)
            await http.send_data(_DONE)
            return
        error, status, headers = _mmsp_error(result, provider)
        if not started:
            await http.respond(status, _json({"error": error}), headers)
            return
        await http.send_data(b"data: %s\n\n%s" % (_json({"error": error}), _DONE))


class _CloseConnection(Exception):
    """The response is over and the connection must close (a stream cut short, a hand-over)."""


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _mmsp_error(
    result: TurnResult, provider: Provider
) -> tuple[dict[str, Any], int, list[tuple[str, str]]]:
    """The MMSP error object for a failed turn, the HTTP status for it, and extra headers.

    Messages are our own words; a provider's own message is passed on only for an invalid
    request (it says what was invalid), with the provider's key scrubbed from it.
    """
    error = result.error
    if isinstance(error, FallbackFailed):
        error = error.stream_error or error.rescue_error
    headers: list[tuple[str, str]] = []
    if result.outcome is Outcome.CANCELLED:
        return {"type": "Cancelled", "message": "the turn was cancelled"}, 503, headers
    if isinstance(error, ProviderError):
        message = f"the upstream provider {error.provider} reported an error"
        if error.status is not None:
            message += f" (status {error.status})"
        if isinstance(error, InvalidRequestError) and error.provider_message:
            message += f": {_scrub(error.provider_message, provider)}"
        body: dict[str, Any] = {"type": type(error).__name__, "message": message}
        if error.status is not None:
            body["status"] = error.status
        status = error.status if error.status is not None and 400 <= error.status <= 599 else 502
        wait = result.retry_after if result.retry_after is not None else error.retry_after
        if wait is not None:
            body["retry_after"] = wait
            headers.append(("retry-after", str(max(1, math.ceil(wait)))))
        return body, status, headers
    if isinstance(error, StreamError):
        body = {"type": type(error).__name__, "message": str(error)}
        for name in (
            "missing",
            "finish_reason",
            "usage_metadata",
            "tool_name",
            "tool_call_id",
            "raw_arguments_length",
            "raw_arguments_preview",
        ):
            if hasattr(error, name):
                value = getattr(error, name)
                body[name] = list(value) if isinstance(value, tuple) else value
        return msgspec.to_builtins(body), 502, headers
    if isinstance(error, TurnTimeout):
        return {"type": "TurnTimeout", "message": str(error)}, 504, headers
    if isinstance(error, TransportError | FrameError):
        return {"type": type(error).__name__, "message": str(error)}, 502, headers
    return {"type": "UpstreamError", "message": "the turn failed"}, 502, headers


def _scrub(text: str, provider: Provider) -> str:
    key = provider.api_key.reveal() if provider.api_key is not None else ""
    return text.replace(key, "…") if len(key) >= 4 else text


# --- the page -------------------------------------------------------------------------------


def _load_page() -> tuple[bytes, str]:
    """The page, and a Content-Security-Policy that allows its own inline script and style
    (by hash) and nothing else."""
    page = resources.files("rillet.transports").joinpath("static/index.html").read_bytes()
    text = page.decode("utf-8")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag in hashes:
        for block in re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL):
            digest = b64encode(hashlib.sha256(block.encode("utf-8")).digest()).decode()
            hashes[tag].append(f"'sha256-{digest}'")
    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(hashes['script']) or chr(39) + 'none' + chr(39)}; "
        f"style-src {' '.join(hashes['style']) or chr(39) + 'none' + chr(39)}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return page, csp
