"""The delivery server's test harness: a real server on 127.0.0.1 (port 0) in the test's
nursery with the loopback provider behind it (`serving`), and real clients: httpx, or a raw
socket where the bytes themselves are the point. Shared with the WebSocket, MMSP, wire and
security tests.
"""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio
import trio.testing
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet._core._runevents import (
    AnswerDelta,
    AttemptResetEvent,
    RunEvent,
    decode_run_event,
)
from rillet._hub._hub import Hub
from rillet.frames import SSEDecoder, SSEEvent
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import (
    LoopbackProvider,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_stream,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence


POLICY = Policy(backoff_base=0.01, random=lambda: 0.0)
WORDS = ["Hello", ", ", "world", "!"]
PROVIDER_KEY = "sk-provider-secret-0123456789abcdef"
_RCVBUF = (socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # a client that backs up quickly


# --- helpers (shared with test_server_ws and test_server_mmsp) -----------------------------------


def chat_provider(url: str, *, api_key: str | None = None) -> Provider:
    """An OpenAI Chat Completions provider on the loopback server."""
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{url}/v1",
        model="gpt-4o-mini",
        api_key=Secret(api_key) if api_key else None,
    )


def text_reply(words: Sequence[str] = WORDS, *, per_chunk: int = 1, **fields: Any) -> Reply:
    """A complete text stream, `per_chunk` SSE frames per chunk."""
    stream = openai_text_stream(list(words))
    frames = [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]
    chunks = tuple(b"".join(frames[i : i + per_chunk]) for i in range(0, len(frames), per_chunk))
    return Reply(chunks=chunks, **fields)


def dropped_then_ok(words: Sequence[str], kept: int) -> list[Reply]:
    """A stream that breaks after `kept` text fragments, then a whole one: a retry with a
    reset."""
    stream = openai_text_stream(list(words))
    frames = stream.split(b"\n\n")
    cut = len(b"\n\n".join(frames[: 1 + kept])) + 2
    return [Reply(chunks=(stream,), drop_after_bytes=cut), text_reply(words)]


@attrs.define
class Served:
    """A running server and what it runs on."""

    url: str
    loopback: LoopbackProvider
    hub: Hub
    client: httpx.AsyncClient

    @property
    def ws_base(self) -> str:
        return "ws" + self.url.removeprefix("http")

    async def start(self, prompt: str = "Hi", **fields: Any) -> dict[str, str]:
        """Start a run; its `{"run_id", "token", ...}`."""
        reply = await self.client.post("/v1/runs", json={"prompt": prompt, **fields})
        assert reply.status_code == 201, reply.text
        answer: dict[str, str] = reply.json()
        return answer

    def log(self, run_id: str) -> list[bytes]:
        """The run's log as the hub keeps it: every entry's JSON."""
        return [entry.data for entry in self.hub.log.get(run_id).entries]

    async def wait_for(self, run_id: str, seq: int | None = None) -> None:
        """Wait until the run's log holds `seq` (None: its `run.done`), following the hub."""
        head = self.hub.log.get(run_id).last_seq
        with self.hub.subscribe(run_id, head) as sub:  # from the head: trimming cannot bite
            if head == seq:
                return
            async for entry in sub:
                if entry.seq == seq:
                    return


@asynccontextmanager
async def serving(
    script: Script | None = None,
    *,
    hub: Hub | None = None,
    client_options: dict[str, Any] | None = None,
    provider_key: str | None = None,
    **config: Any,
) -> AsyncIterator[Served]:
    """The loopback provider playing `script`, and the server in front of it."""
    hub = hub or Hub()
    async with open_loopback_provider(script or [text_reply()]) as loopback:
        config.setdefault("provider", chat_provider(loopback.url, api_key=provider_key))
        config.setdefault("policy", POLICY)
        server = ServerConfig(port=0, **config)
        async with trio.open_nursery() as nursery:
            url: str = await nursery.start(
                lambda task_status: serve(server, hub=hub, task_status=task_status)
            )
            options = {"timeout": None, **(client_options or {})}  # each test has its deadline
            async with httpx.AsyncClient(base_url=url, **options) as client:
                yield Served(url, loopback, hub, client)
            nursery.cancel_scope.cancel()


@attrs.define
class Stream:
    """What an SSE client read."""

    status: int
    headers: httpx.Headers
    events: list[SSEEvent]
    comments: int
    clean_end: bool  # the body ended properly (not cut, not reset)

    @property
    def run_events(self) -> list[RunEvent]:
        return [decode_run_event(event.data) for event in self.events]

    @property
    def seqs(self) -> list[int]:
        return [event.seq for event in self.run_events]


async def read_sse(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> Stream:
    """Read an SSE response to its end, or stop (closing it) after `limit` events."""
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    clean = False
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return Stream(response.status_code, response.headers, [], 0, True)
        # Stopping early cancels the read instead of breaking out of it: the body's generators
        # then finish rather than being left suspended.
        with trio.CancelScope() as cut:
            try:
                async for chunk in response.aiter_raw():
                    events += decoder.feed(chunk)
                    if limit is not None and len(events) >= limit:
                        del events[limit:]
                        cut.cancel()
                clean = True
            except httpx.RemoteProtocolError:
                pass
    return Stream(response.status_code, response.headers, events, decoder.comments, clean)


def kind(event: RunEvent) -> str:
    """A run event's `type`."""
    return str(type(event).__struct_config__.tag)


def texts(events: Sequence[RunEvent]) -> str:
    """The answer text rebuilt as a client must: append deltas, clear on a reset."""
    text = ""
    for event in events:
        if isinstance(event, AttemptResetEvent):
            text = ""
        elif isinstance(event, AnswerDelta):
            text += event.delta
    return text


async def raw_exchange(url: str, request: bytes, *, until_close: bool = True) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        received = bytearray()
        while data := await stream.receive_some(65536):
            received += data
            if not until_close:
                break
    return bytes(received)


def act(run: dict[str, str]) -> dict[str, str]:
    """The header that acts on a run (cancels it, answers its approvals): its act token."""
    return {"authorization": f"Bearer {run['act_token']}"}


def client_at(url: str, address: str, **headers: str) -> httpx.AsyncClient:
    """An HTTP client whose connections come from `address`: Linux routes all of 127.0.0.0/8
    to loopback, so 127.0.0.2 is another peer address to the server, as another machine is."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, headers=headers, timeout=None)
