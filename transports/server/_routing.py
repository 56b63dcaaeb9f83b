"""HTTP routing and security: one task per connection reads requests, refuses what must not
be answered (past the connection cap, a `Host` that is not a loopback name on loopback, another
site's `Origin`), and hands each request to its route."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import attrs
import h11
import msgspec
import trio
import trio_websocket
from wsproto.utilities import LocalProtocolError

from ._config import is_loopback
from ._fanout import Fanout
from ._http11 import (
    BodyTooLarge,
    ConnectionStream,
    HttpConnection,
    Request,
    RequestRefused,
    RequestTimeout,
)
from ._log import log_request
from ._messages import Messages
from ._metrics import METRICS_EXTRA
from ._mmsp import Mmsp
from ._openai import OpenAIChat
from ._page import Page
from ._replies import GONE, CloseConnection, ErrorReply, error_body
from ._responses import OpenAIResponses
from ._runs import Runs
from ._shared import Shared
from ._tracing import continued
from ._uiagent import UiAgentRuns
from ._uistream import UiStream

if TYPE_CHECKING:
    from ._config import Limits

__all__ = ["Server", "connection_cap"]

logger = logging.getLogger("rillet.transports.server")
_QUIET = (*GONE, trio_websocket.ConnectionClosed, LocalProtocolError)
"""A connection's ends that are no bug: its client left, or its WebSocket closed."""


def _quiet(exc: BaseException) -> bool:
    """Whether an exception (or all a group holds) is only a connection's end."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_QUIET)[1] is None
    return isinstance(exc, _QUIET)


PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SPARE_FDS = 64  # descriptors kept for what is not a client connection
_EVICT_STALLED = 5.0  # seconds a client has read nothing before, at the cap, it may be closed

_Handler = Callable[[HttpConnection, Request, str], Awaitable[None]]

_FULL_BODY = b'{"error":{"type":"too_many_connections","message":"too many connections"}}'
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"x-content-type-options: nosniff\r\nretry-after: 1\r\ncontent-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_FULL_BODY), _FULL_BODY)
)


def connection_cap(limits: Limits) -> int:
    """`max_connections`, kept under the process's file limit with room for what else needs a
    descriptor: a connection upstream for every stream admitted, the listeners, logs, Redis."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return limits.max_connections
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    room = soft - limits.max_streams - _SPARE_FDS
    return max(1, min(limits.max_connections, room))


@attrs.define(eq=False)
class Server:
    """The server's connections and routes."""

    shared: Shared
    runs: Runs = attrs.field()
    fanout: Fanout = attrs.field()
    mmsp: Mmsp = attrs.field()
    openai: OpenAIChat = attrs.field()
    messages: Messages = attrs.field()
    ui: UiStream = attrs.field()
    responses: OpenAIResponses = attrs.field()
    page: Page = attrs.field(factory=Page)
    connection_cap: int = attrs.field()
    # every connection, by the scope its task runs in (cancelled to close it at the cap), and
    # those waiting for a request head, the longest waiting first
    _open: dict[HttpConnection, trio.CancelScope] = attrs.field(init=False, factory=dict)
    _idle: dict[HttpConnection, None] = attrs.field(init=False, factory=dict)
    _static: dict[str, dict[str, _Handler]] = attrs.field(init=False)
    _per_run: dict[str, dict[str, _Handler]] = attrs.field(init=False)

    @connection_cap.default
    def _cap(self) -> int:
        return connection_cap(self.shared.limits)

    @runs.default
    def _runs(self) -> Runs:
        return Runs(self.shared)

    @fanout.default
    def _fanout(self) -> Fanout:
        return Fanout(self.shared, self.runs)

    @mmsp.default
    def _mmsp(self) -> Mmsp:
        return Mmsp(self.shared)

    @openai.default
    def _openai(self) -> OpenAIChat:
        return OpenAIChat(self.shared)

    @messages.default
    def _messages(self) -> Messages:
        return Messages(self.shared)

    @ui.default
    def _ui(self) -> UiStream:
        return UiStream(self.shared, agents=UiAgentRuns(self.shared))

    @responses.default
    def _responses(self) -> OpenAIResponses:
        return OpenAIResponses(self.shared)

    def __attrs_post_init__(self) -> None:
        self._static = {
            "/": {"GET": self.page.serve},
            "/index.html": {"GET": self.page.serve},
            "/favicon.ico": {"GET": self.page.favicon},
            "/healthz": {"GET": self._healthz},
            "/metrics": {"GET": self._prometheus},
            "/metrics.json": {"GET": self._metrics},
            "/v1/models": {"GET": self.mmsp.models},
            "/v1/stream": {"POST": self.mmsp.stream},
            "/v1/chat/completions": {"POST": self.openai.completions},
            "/v1/responses": {"POST": self.responses.create},
            "/v1/messages": {"POST": self.messages.create},
            "/v1/messages/count_tokens": {"POST": self.messages.count_tokens},
            "/v1/ui/chat": {"POST": self.ui.chat},
            "/v1/runs": {"POST": self.runs.start_run},
        }
        self._per_run = {
            "": {"DELETE": self.runs.cancel_run},
            "events": {"GET": self.fanout.events},
            "ws": {"GET": self.fanout.websocket},
        }

    async def handle(self, socket_stream: trio.SocketStream) -> None:
        """One connection: requests until the client leaves, a response ends it, or it stalls."""
        if self.shared.limits.send_buffer is not None:
            socket_stream.setsockopt(
                trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, self.shared.limits.send_buffer
            )
        if self.shared.metrics.connections >= self.connection_cap and not self._evict():
            await self._refuse_connection(socket_stream)
            return
        stream = ConnectionStream(socket_stream, write_timeout=self.shared.limits.write_timeout)
        http = HttpConnection(stream)
        self.shared.metrics.connections += 1
        try:
            with trio.CancelScope() as self._open[http]:  # cancelled: closed at the cap
                await self._converse(http)
        except* GONE:
            pass
        except* trio_websocket.ConnectionClosed:
            pass
        except* LocalProtocolError:  # a ping that came after our close: wsproto sends no pong
            pass
        except* Exception as group:  # a bug must not take the server down with it
            logger.error("connection failed", exc_info=group)
        finally:
            self._open.pop(http, None)
            self.shared.metrics.connections -= 1
            try:
                if http.refused:
                    await stream.linger(self.shared.limits.close_timeout)
            finally:  # cancelled (the server stops) or not, the socket is closed
                await stream.close_transport()

    def _evict(self) -> bool:
        """At the cap, close a connection that does nothing for its client, to let a new one
        in: the one waiting longest for a request head (idle between requests, or sending one
        slowly), else the one whose client has read nothing for longest, at least
        `_EVICT_STALLED` seconds. Whether there was one. Connections that do nothing cannot
        hold the cap against a client that has something to ask; an idle keep-alive connection
        may be closed at any time (RFC 9112 §9.5)."""
        http = next(iter(self._idle), None) or self._stalled()
        if http is None:
            return False
        self._idle.pop(http, None)
        self._open.pop(http).cancel()
        self.shared.metrics.connections_evicted += 1
        return True

    def _stalled(self) -> HttpConnection | None:
        """The connection whose write has waited longest for its client, if one has waited
        `_EVICT_STALLED` seconds."""
        oldest, since = None, trio.current_time() - _EVICT_STALLED
        for http in self._open:
            at = http.stream.stalled_since
            if at is not None and at <= since:
                oldest, since = http, at
        return oldest

    async def _refuse_connection(self, socket_stream: trio.SocketStream) -> None:
        """Past the connection cap: a 503 if the socket takes it at once, then closed."""
        self.shared.metrics.connections_refused += 1
        with contextlib.suppress(OSError):  # the socket is non-blocking: this never waits
            os.write(socket_stream.socket.fileno(), _FULL)
        await trio.aclose_forcefully(socket_stream)

    async def _converse(self, http: HttpConnection) -> None:
        while True:
            self._idle[http] = None  # closed first at the cap
            try:
                request = await http.next_request(self.shared.limits.head_timeout)
            except RequestTimeout:
                return
            except RequestRefused as refused:
                body = error_body("bad_request", refused.message)
                await http.respond(refused.status, body, close=True)
                return
            except h11.RemoteProtocolError as exc:
                if http.responding:
                    status = exc.error_status_hint
                    body = error_body("bad_request", "malformed HTTP request")
                    await http.respond(status, body, close=True)
                return
            finally:
                self._idle.pop(http, None)
            if request is None:
                return
            keep = await self._dispatch(http, request)
            if not keep or not http.reusable:
                return
            http.next_cycle()

    async def _dispatch(self, http: HttpConnection, request: Request) -> bool:
        """Answer one request and log it; False when the connection must close after it."""
        started, sent = trio.current_time(), http.stream.sent
        http.status = None
        with continued(request):  # the caller's trace, when it sent one
            try:
                return await self._answer(http, request)
            finally:
                size = http.stream.sent - sent
                self.shared.metrics.sent(size)
                status = http.status or (101 if request.is_websocket and size else None)
                duration = trio.current_time() - started
                log_request(request.method, request.path, status, size, duration, request.client)

    async def _answer(self, http: HttpConnection, request: Request) -> bool:
        try:
            self._check_host(request)
            handler, arg = self._route(request)
            if request.method not in ("GET", "HEAD") or request.path.endswith("/ws"):
                self._check_origin(request)
            await handler(http, request, arg)
        except ErrorReply as reply:
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
                await http.respond(status, error_body(kind, message), close=True)
            return False
        except CloseConnection:
            return False
        except Exception as exc:
            if not http.responding or _quiet(exc):
                raise  # a head already went out, or the client is gone: the connection ends
            # a bug of ours: the operator reads it in the log, the client gets an answer
            logger.error("%s %s failed", request.method, request.path[:80], exc_info=exc)
            body = error_body(
                "internal_error", "the server failed on this request: its log says why"
            )
            await http.respond(500, body, close=True)
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
                if methods is None and len(parts) == 6 and parts[4] == "approvals" and parts[5]:
                    arg, methods = f"{parts[3]}/{parts[5]}", {"POST": self.runs.agents.answer}
            elif len(parts) in (4, 5) and parts[:3] == ["", "v1", "responses"] and parts[3]:
                # a background response (`OpenAIResponses`): whole or its events, or cancelled
                arg = unquote(parts[3])
                if len(parts) == 4:
                    methods = {"GET": self.responses.retrieve}
                elif parts[4] == "cancel":
                    methods = {"POST": self.responses.cancel}
            elif len(parts) == 6 and parts[:4] == ["", "v1", "ui", "chat"] and parts[5] == "stream":
                # a chat's kept UI stream (`ServerConfig.ui_resume`)
                arg, methods = unquote(parts[4]), {"GET": self.ui.resume, "DELETE": self.ui.stop}
            elif len(parts) >= 4 and parts[:3] == ["", "v1", "models"] and parts[3]:
                # one model (a routed one is named `kind/model`)
                arg, methods = unquote("/".join(parts[3:])), {"GET": self.mmsp.model}
        if methods is None:
            raise ErrorReply(404, "not_found", "no such route")
        head = "GET" in methods and (not arg or path.startswith("/v1/models/"))  # not a run's
        handler = methods.get("GET" if method == "HEAD" and head else method)
        if handler is None:
            allow = ", ".join(sorted({*methods, *(["HEAD"] if head else [])}))
            raise ErrorReply(
                405, "method_not_allowed", "method not allowed", headers=[("allow", allow)]
            )
        return handler, arg

    def _check_host(self, request: Request) -> None:
        """On loopback, only loopback names: a page on another site whose name was rebound to
        127.0.0.1 must not reach the server."""
        if not self.shared.config.loopback:
            return
        host = request.headers.get("host")
        if host is None:
            return  # HTTP/1.0: no name to rebind
        name = urlsplit(f"//{host}").hostname or ""
        if not is_loopback(name):
            raise ErrorReply(
                403, "forbidden", "this server answers loopback names only", close=True
            )

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
            raise ErrorReply(403, "forbidden", "cross-origin requests are refused", close=True)

    async def _healthz(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /healthz`: the server answers."""
        await http.respond(200, b'{"status":"ok"}', head_only=request.method == "HEAD")

    async def _prometheus(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /metrics` (the server key, when one is set): the Prometheus text format; 501
        with the way to install it when `prometheus-client` is not installed."""
        self.shared.require_key(request)
        prom = self.shared.metrics.prom
        if prom is None:
            raise ErrorReply(
                501,
                "not_implemented",
                f"Prometheus metrics need prometheus-client: {METRICS_EXTRA} "
                "(the counters are at /metrics.json)",
            )
        prom.active.set(self.shared.admission.running)
        prom.queued.set(self.shared.admission.waiting)
        prom.subscribers.set(self.shared.hub.subscribers)
        prom.connections.set(self.shared.metrics.connections)
        await http.respond(
            200,
            prom.exposition(),
            content_type=PROMETHEUS_TYPE,
            head_only=request.method == "HEAD",
        )

    async def _metrics(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /metrics.json` (the server key, when one is set): counters as JSON."""
        self.shared.require_key(request)
        m = self.shared.metrics
        body = {
            "runs_active": self.shared.admission.running,
            "runs_queued": self.shared.admission.waiting,
            "runs_started": m.runs_started,
            "runs_kept": len(self.runs.runs),
            "runs_taken_over": m.runs_taken_over,
            "streams_started": m.streams_started,
            "connections": m.connections,
            "connections_refused": m.connections_refused,
            "connections_evicted": m.connections_evicted,
            "subscribers": self.shared.hub.subscribers,
            "subscribers_dropped": m.subscribers_dropped,
            "events_per_second": round(m.events_per_second(), 3),
            "time_to_first_event_ms": m.ttfe(),
            "worker": self.shared.config.worker,  # which of `--workers`, None for no worker
            "pid": os.getpid(),
        }
        await http.respond(200, msgspec.json.encode(body), head_only=request.method == "HEAD")
