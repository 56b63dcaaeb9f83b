"""A fault-injecting provider on loopback: a real HTTP/1.1 server on 127.0.0.1, under trio.

End-to-end tests of the streaming pipeline need real sockets and real HTTP framing, with faults a
mock transport cannot show (a half-written chunked body, a dropped or reset connection, a server
that reads the request and never answers). `LoopbackProvider` plays a script of `Reply` values:
recorded wire bytes or generated streams, written chunk by chunk with chunked transfer encoding,
paced and faulted as each `Reply` says. HTTP framing is h11's (sans-I/O); this module only reads,
writes, waits and closes.

Every task lives in the nursery of `LoopbackProvider.serve` (or `open_loopback_provider`), so
leaving it cancels everything and closes every socket. All waits are `trio.sleep`, so a
`trio.testing.MockClock` drives the scripted delays in virtual time. A client that goes away is
normal here and never an error.

    async with open_loopback_provider([Reply(chunks=split(openai_text_stream(["Hi"]), 16))]) as p:
        async with httpx.AsyncClient(base_url=p.url) as client:
            ...
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import h11
import msgspec
import trio
from rillet._core._encode import encode_sse
from rillet._core._public import fixup_module_metadata as _fixup_module_metadata

from ._loopback_io import (
    PING,
    Reply,
    drop,
    header_dict,
    phrase,
    receive,
    response_head,
    send,
    send_error,
    stall,
    until_client_leaves,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

__all__ = [
    "DEFAULT_MAX_BODY",
    "PING",
    "LoopbackProvider",
    "RecordedRequest",
    "Reply",
    "Script",
    "fixture_reply",
    "open_loopback_provider",
    "openai_text_body",
    "openai_text_stream",
    "refused_url",
    "split",
    "sse",
    "status_reply",
]

DEFAULT_MAX_BODY = 10 * 1024 * 1024
"""Largest request body the provider accepts; a larger one is read, discarded and answered 413."""

_CONTENT_TYPES = {
    ".sse": "text/event-stream",
    ".ndjson": "application/x-ndjson",
    ".json": "application/json",
}
# the client went away, reset the connection, or spoke broken HTTP: all normal in fault tests
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError)

_CLOSE = (("connection", "close"),)  # an error reply ends the connection


@attrs.frozen
class RecordedRequest:
    """One request as the provider received it, recorded even when its reply is a fault.

    Attributes:
        method: the request method, e.g. `POST`.
        path: the request target, query string included.
        headers: the request headers, names lower-cased, values decoded as Latin-1; repeated
            headers joined with ", ".
        body: the request body (empty for a body over the size limit, which was answered 413).
        at: `trio.current_time()` when the request head arrived.
        connection: the 0-based number of the connection it came on (requests on one keep-alive
            connection share it).
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    connection: int = 0


Script: TypeAlias = Sequence[Reply] | Callable[[RecordedRequest, int], Reply]
"""Replies in order (the last repeats once exhausted), or a function of the request and its
0-based number under this script."""


def _check_script(script: Script) -> Script:
    if not callable(script) and not script:
        raise ValueError("a script needs at least one Reply")
    return script


@attrs.define(eq=False)
class LoopbackProvider:
    """A scripted HTTP/1.1 provider on 127.0.0.1: run `serve` in a nursery, point clients at
    `url`, read what they sent in `requests`.

    Each connection is served in its own task, keep-alive connections answer request after
    request, and a client going away ends its connection quietly. Request bodies over `max_body`
    bytes are answered 413 without consulting the script.

    Attributes:
        requests: every request received, in order of arrival.
        connections: how many connections were accepted so far.
        open_connections: how many of them are still open.
    """

    _script: Script = attrs.field(converter=_check_script)
    max_body: int = DEFAULT_MAX_BODY
    host: str = "127.0.0.1"
    requests: list[RecordedRequest] = attrs.field(factory=list, init=False)
    connections: int = attrs.field(default=0, init=False)
    open_connections: int = attrs.field(default=0, init=False)
    _port: int | None = attrs.field(default=None, init=False)
    _served: int = attrs.field(default=0, init=False)
    _changed: trio.Event | None = attrs.field(default=None, init=False)

    @property
    def url(self) -> str:
        """The base URL, `http://127.0.0.1:<port>`; available once `serve` has started."""
        if self._port is None:
            raise RuntimeError("the loopback provider is not serving yet")
        return f"http://{self.host}:{self._port}"

    def set_script(self, script: Script) -> None:
        """Replace the script; the next request gets the new script's first reply (number 0)."""
        self._script = _check_script(script)
        self._served = 0

    async def wait_for_requests(self, count: int) -> None:
        """Return once at least `count` requests have been recorded: lets a test act at the
        moment the provider holds a request."""
        while len(self.requests) < count:
            await self._wait_for_change()

    async def wait_connections_closed(self) -> None:
        """Return once no connection is open: after a client went away, the provider has
        noticed and closed its end."""
        while self.open_connections:
            await self._wait_for_change()

    async def _wait_for_change(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on `host`, an ephemeral port, and serve until cancelled; for `nursery.start`,
        which returns once `url` is valid. Every connection task lives in this call's nursery."""
        if self._port is not None:
            raise RuntimeError("the loopback provider is already serving")
        async with trio.open_nursery() as nursery:
            listeners: list[trio.SocketListener] = await nursery.start(
                functools.partial(
                    trio.serve_tcp, self._handle, 0, host=self.host, handler_nursery=nursery
                )
            )
            self._port = listeners[0].socket.getsockname()[1]
            task_status.started()

    async def _handle(self, stream: trio.SocketStream) -> None:
        number = self.connections
        self.connections += 1
        self.open_connections += 1
        try:
            await self._converse(stream, number)
        except* _CLIENT_GONE:
            pass
        finally:
            self.open_connections -= 1
            await trio.aclose_forcefully(stream)
            self._notify()

    async def _converse(self, stream: trio.SocketStream, number: int) -> None:
        """Answer requests on one connection until it closes or a reply ends it."""
        conn = h11.Connection(h11.SERVER)
        while True:
            try:
                event = await receive(stream, conn)
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request)  # h11 yields nothing else here
                at = trio.current_time()
                body = await self._read_body(stream, conn)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                    await send_error(
                        stream, conn, status_reply(exc.error_status_hint, headers=_CLOSE)
                    )
                return
            request = RecordedRequest(
                method=event.method.decode("latin-1"),
                path=event.target.decode("latin-1"),
                headers=header_dict(event.headers),
                body=body or b"",
                at=at,
                connection=number,
            )
            self._record(request)
            if body is None:
                await send_error(stream, conn, status_reply(413, headers=_CLOSE))
                return
            if not await self._respond(stream, conn, self._reply_for(request), request.method):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_body(self, stream: trio.SocketStream, conn: h11.Connection) -> bytes | None:
        """The request body, or None when it is over `max_body` (read to its end, discarded)."""
        if conn.they_are_waiting_for_100_continue:
            await send(stream, conn, h11.InformationalResponse(status_code=100, headers=[]))
        body = bytearray()
        size = 0
        while True:
            event = await receive(stream, conn)
            if isinstance(event, h11.EndOfMessage):
                return bytes(body) if size <= self.max_body else None
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size <= self.max_body:
                    body += event.data
                else:
                    body.clear()

    def _record(self, request: RecordedRequest) -> None:
        self.requests.append(request)
        self._notify()

    def _reply_for(self, request: RecordedRequest) -> Reply:
        n = self._served
        self._served += 1
        if callable(self._script):
            return self._script(request, n)
        return self._script[min(n, len(self._script) - 1)]

    async def _respond(
        self, stream: trio.SocketStream, conn: h11.Connection, reply: Reply, method: str
    ) -> bool:
        """Play one reply; False when it ended the connection (a stall or a drop)."""
        if reply.stall_headers:
            await until_client_leaves(stream)
            return False
        if reply.headers_delay:
            await trio.sleep(reply.headers_delay)
        await send(stream, conn, response_head(reply))
        chunks = () if method == "HEAD" else reply.chunks
        sent = 0
        for index, chunk in enumerate(chunks):
            if reply.stall_after is not None and index >= reply.stall_after:
                await stall(stream, conn, reply.ping_every)
                return False
            if reply.chunk_delay:
                await trio.sleep(reply.chunk_delay)
            if reply.drop_after_bytes is not None and sent + len(chunk) >= reply.drop_after_bytes:
                if part := chunk[: reply.drop_after_bytes - sent]:
                    await send(stream, conn, h11.Data(data=part))
                await drop(stream, reset=reply.drop_with_reset)
                return False
            if chunk:  # an empty chunk would end the chunked body
                await send(stream, conn, h11.Data(data=chunk))
            sent += len(chunk)
        if reply.stall_after is not None:
            await stall(stream, conn, reply.ping_every)
            return False
        if reply.drop_after_bytes is not None:
            await drop(stream, reset=reply.drop_with_reset)
            return False
        await send(stream, conn, h11.EndOfMessage())
        return True


@asynccontextmanager
async def open_loopback_provider(
    script: Script, *, max_body: int = DEFAULT_MAX_BODY
) -> AsyncIterator[LoopbackProvider]:
    """A `LoopbackProvider` serving for the duration of the block; leaving the block cancels its
    tasks and closes its sockets. An exception from the block comes out as itself, not wrapped in
    an exception group."""
    provider = LoopbackProvider(script, max_body=max_body)
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.serve)
        try:
            yield provider
        except GeneratorExit:
            raise
        except BaseException as exc:  # re-raised below, once the server is down
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


def refused_url() -> str:
    """A `http://127.0.0.1:<port>` URL nobody listens on (a port bound, then released), so a
    client's connect is refused: the `ConnectError` fault."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- building replies -----------------------------------------------------------------------


def sse(*payloads: str | Mapping[str, Any], event: str | None = None) -> bytes:
    """SSE data frames, one per payload (a mapping is JSON-encoded), each named `event` if given."""
    return b"".join(
        encode_sse(p if isinstance(p, str) else msgspec.json.encode(p).decode(), event=event)
        for p in payloads
    )


def split(data: bytes, size: int) -> tuple[bytes, ...]:
    """`data` cut into chunks of `size` bytes (the last may be shorter); none for no data."""
    if size < 1:
        raise ValueError("chunk size must be positive")
    return tuple(data[i : i + size] for i in range(0, len(data), size))


def fixture_reply(path: Path, *, chunk_size: int = 64, **reply_fields: Any) -> Reply:
    """A recorded wire file as a 200 reply in `chunk_size` chunks; the content type follows the
    suffix (.sse, .ndjson, .json) unless `content_type` is given. Other `Reply` fields pass
    through."""
    if "content_type" not in reply_fields:
        try:
            reply_fields["content_type"] = _CONTENT_TYPES[path.suffix]
        except KeyError:
            raise ValueError(f"no content type known for {path.name}") from None
    return Reply(chunks=split(path.read_bytes(), chunk_size), **reply_fields)


def openai_text_stream(
    fragments: Sequence[str],
    *,
    usage: bool = True,
    done: bool = True,
    model: str = "gpt-4o-mini-2024-07-18",
    completion_id: str = "chatcmpl-loopback",
    finish_reason: str = "stop",
    prompt_tokens: int = 12,
) -> bytes:
    """A Chat Completions stream as OpenAI sends it: a role chunk, one chunk per text fragment,
    the finish chunk, then (with `usage`) the usage chunk with `choices: []`, then (with `done`)
    `data: [DONE]`."""
    head = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": 1764421000,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_loopback",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        extra: dict[str, Any] = {"usage": None} if usage else {}
        return {**head, "choices": [choice], **extra}

    frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
    frames += [chunk({"content": fragment}) for fragment in fragments]
    frames.append(chunk({}, finish_reason))
    if usage:
        frames.append({**head, "choices": [], "usage": _usage(prompt_tokens, len(fragments))})
    return sse(*frames) + (sse("[DONE]") if done else b"")


def openai_text_body(
    text: str,
    *,
    model: str = "gpt-4o-mini-2024-07-18",
    completion_id: str = "chatcmpl-loopback",
    finish_reason: str = "stop",
    prompt_tokens: int = 12,
) -> bytes:
    """The non-streaming `chat.completion` JSON body matching `openai_text_stream`."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": [],
    }
    return msgspec.json.encode(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": 1764421000,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": _usage(prompt_tokens, max(1, len(text.split()))),
            "service_tier": "default",
            "system_fingerprint": "fp_loopback",
        }
    )


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def status_reply(
    status: int,
    *,
    body: bytes | str | Mapping[str, Any] | None = None,
    retry_after: float | str | None = None,
    retry_after_ms: float | str | None = None,
    should_retry: bool | str | None = None,
    content_type: str = "application/json",
    headers: tuple[tuple[str, str], ...] = (),
    **reply_fields: Any,
) -> Reply:
    """An HTTP-level answer (an error, typically) with the retry headers providers send:
    `retry-after`, `retry-after-ms`, `x-should-retry` (values passed as given, so malformed ones
    can be scripted too). With no `body`, an error status gets an OpenAI-shaped error body
    naming the status, any other status an empty one."""
    if body is None:
        message = phrase(status) or f"HTTP {status}"
        data = (
            msgspec.json.encode({"error": {"message": message, "type": None, "code": None}})
            if status >= 400
            else b""
        )
    elif isinstance(body, bytes):
        data = body
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = msgspec.json.encode(body)
    extra = list(headers)
    if retry_after is not None:
        extra.append(("retry-after", _header_value(retry_after)))
    if retry_after_ms is not None:
        extra.append(("retry-after-ms", _header_value(retry_after_ms)))
    if should_retry is not None:
        extra.append(("x-should-retry", _header_value(should_retry)))
    return Reply(
        status=status,
        headers=tuple(extra),
        chunks=(data,) if data else (),
        content_type=content_type,
        **reply_fields,
    )


def _header_value(value: float | str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_fixup_module_metadata(__name__, globals())
