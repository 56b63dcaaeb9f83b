"""S27: a client's share is held by what it cannot choose, on a real server on loopback.

Clients on other addresses are real: Linux routes all of 127.0.0.0/8 to loopback, so a socket
bound to 127.0.0.2 or 127.0.0.3 before it connects is another peer address to the server, as
another machine would be. One client rotating `X-Rillet-Session` and its Bearer value on every
request holds one client's share and no more; a client on another address is still served.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
from rillet._core._dialect import Secret
from rillet.transports.server import Limits

from ..server_support import client_at, serving
from .test_reliability_hostile import connect, read_head, slow_reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ATTACKER, OTHER = "127.0.0.2", "127.0.0.3"
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}
UI = {"messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}


def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def flood(
    url: str, count: int, headers_of: Any, streams: list[trio.SocketStream]
) -> list[int]:
    """`count` streamed chat completions from `ATTACKER`, each with the headers
    `headers_of(n)` gives, their connections kept open in `streams`: each one's status."""
    statuses: list[int] = []
    for n in range(count):
        stream = await connect(url, source=ATTACKER)
        streams.append(stream)
        await stream.send_all(post("/v1/chat/completions", CHAT, headers_of(n)))
        head = await read_head(stream)
        statuses.append(int(head.split(b" ", 2)[1]))
    return statuses


async def served_from_other(url: str, **headers: str) -> tuple[int, int, int]:
    """What `OTHER` gets: a streamed chat completion, a run and a UI stream (their statuses,
    each read to its head only)."""
    async with client_at(url, OTHER, **headers) as other:
        async with other.stream("POST", "/v1/chat/completions", json=CHAT) as chat:
            chat_status = chat.status_code
        run = await other.post("/v1/runs", json={"prompt": "hi"})
        async with other.stream("POST", "/v1/ui/chat", json=UI) as ui:
            ui_status = ui.status_code
    return chat_status, run.status_code, ui_status


async def closing_all(streams: list[trio.SocketStream]) -> None:
    for stream in streams:
        await stream.aclose()


@asynccontextmanager
async def held_subscriptions() -> AsyncIterator[list[trio.SocketStream]]:
    """Connections kept open for the block, closed after it."""
    streams: list[trio.SocketStream] = []
    try:
        yield streams
    finally:
        await closing_all(streams)


async def test_s27_rotating_sessions_and_bearers_from_one_address_hold_one_clients_share() -> None:
    defaults = Limits()
    streams: list[trio.SocketStream] = []
    with trio.fail_after(60):
        async with serving([slow_reply()]) as served:
            statuses = await flood(
                served.url,
                110,
                lambda n: {"X-Rillet-Session": f"s{n}", "Authorization": f"Bearer k{n}"},
                streams,
            )
            metrics = (await served.client.get("/metrics.json")).json()
            other = await served_from_other(served.url)
            await closing_all(streams)
    assert statuses.count(200) == defaults.max_runs_per_client  # 16, not the whole server
    assert statuses.count(429) == 110 - defaults.max_runs_per_client
    assert metrics["runs_active"] + metrics["runs_queued"] == defaults.max_runs_per_client
    assert other == (200, 201, 200)


async def test_s27_a_session_narrows_its_clients_share_and_never_widens_it() -> None:
    limits = Limits(max_runs_per_client=6, max_runs_per_session=2)
    streams: list[trio.SocketStream] = []
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=limits) as served:
            named = await flood(served.url, 3, lambda n: {"X-Rillet-Session": "tool"}, streams)
            unnamed = await flood(served.url, 5, lambda n: {}, streams)
            widened = await flood(served.url, 1, lambda n: {"X-Rillet-Session": "new"}, streams)
            other = await served_from_other(served.url)
            await closing_all(streams)
    assert named == [200, 200, 429]  # the session's part of the client's share
    assert unnamed == [200, 200, 200, 200, 429]  # the rest of the client's share
    assert widened == [429]  # a new session finds its client's share taken
    assert other == (200, 201, 200)


async def test_s27_on_a_keyed_server_the_key_does_not_make_one_address_many_clients() -> None:
    key = "server-key-0123456789"
    limits = Limits(max_runs_per_client=4)
    streams: list[trio.SocketStream] = []
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=limits, api_key=Secret(key)) as served:
            statuses = await flood(
                served.url,
                8,
                lambda n: {"X-Rillet-Session": f"s{n}", "Authorization": f"Bearer {key}"},
                streams,
            )
            wrong = await flood(served.url, 1, lambda n: {"Authorization": "Bearer x"}, streams)
            other = await served_from_other(served.url, authorization=f"Bearer {key}")
            await closing_all(streams)
    assert statuses == [200] * 4 + [429] * 4
    assert wrong == [401]
    assert other == (200, 201, 200)


async def test_s27_subscriptions_are_one_clients_share_whatever_run_token_or_session() -> None:
    limits = Limits(max_subscribers_per_client=4)
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=limits) as served:
            runs = [await served.start() for _ in range(5)]
            statuses: list[int] = []
            async with held_subscriptions() as streams:
                for n, run in enumerate(runs):  # each run its own read token, a new session
                    stream = await connect(served.url, source=ATTACKER)
                    streams.append(stream)
                    path = run["events_url"].removeprefix(served.url)
                    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Rillet-Session: s{n}\r\n"
                    await stream.send_all(head.encode() + b"\r\n")
                    statuses.append(int((await read_head(stream)).split(b" ", 2)[1]))
                async with (
                    client_at(served.url, OTHER) as other,
                    other.stream("GET", runs[0]["events_url"]) as theirs,
                ):
                    their_status = theirs.status_code
    assert statuses == [200, 200, 200, 200, 429]  # new tokens and sessions: one client
    assert their_status == 200
