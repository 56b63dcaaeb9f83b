"""S17, S22 and S24 once more: what connections that do nothing, or frame their requests in
ways h11 takes, cost the clients that do something.

A real server on 127.0.0.1, raw client sockets. At the connection cap, connections that do
nothing for their client (waiting for a head, or for a client that reads nothing) make room for
a new one; a chunked body's framing counts toward its limit; a pipelined head is checked as its
bytes came.
"""

from __future__ import annotations

import contextlib

import trio
import trio.testing
from rillet.transports.server import Limits

from ..server_support import raw_exchange, serving
from .test_reliability_hostile import connect, read_all, read_head

# --- S17: the connection cap ---------------------------------------------------------------------


async def test_s17_idle_connections_at_the_cap_make_room_for_a_new_client(
    mock_clock: trio.testing.MockClock,
) -> None:
    # one program holds every connection the cap allows, idle or sending its heads slowly,
    # and keeps them (a request now and then would restart the head deadline); another
    # program still gets its answers: the connection that waited longest for a head is closed
    mock_clock.autojump_threshold = 0.05
    with trio.fail_after(60):
        async with serving(limits=Limits(max_connections=20)) as served:
            held = []
            for n in range(20):  # one at a time: the server's tasks wait in this order
                held.append(await connect(served.url))
                if n < 5:
                    await held[-1].send_all(b"GET /healthz HTTP/1.1\r\nHo")  # never finished
                await trio.testing.wait_all_tasks_blocked()
            answers, others = [], []
            for _ in range(5):  # new clients, each keeping its connection
                others.append(await connect(served.url))
                await others[-1].send_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answers.append(await read_head(others[-1]))
            evicted = [await read_all(stream) for stream in held[:5]]  # the 5 waiting longest
            kept = 0
            for stream in held[5:]:
                with trio.move_on_after(0.1):
                    await stream.receive_some(1)  # b"" had it been closed
                    continue
                kept += 1
            for stream in held + others:
                await stream.aclose()
            metrics = (await served.client.get("/metrics.json")).json()
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
    assert evicted == [b""] * 5
    assert kept == 15
    assert metrics["connections_evicted"] == 5
    assert metrics["connections_refused"] == 0


async def test_s17_clients_that_never_read_at_the_cap_make_room_for_a_new_client(
    mock_clock: trio.testing.MockClock,
) -> None:
    # every connection the cap allows is busy writing to a client that never reads: once one
    # has waited 5 s for its client, a new connection takes its place
    mock_clock.autojump_threshold = 0.05
    pages = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 64
    limits = Limits(max_connections=20, send_buffer=16384)
    with trio.fail_after(60):
        async with serving(limits=limits) as served:
            stuck = []
            for _ in range(20):
                stuck.append(await connect(served.url, rcvbuf=16384))
                await stuck[-1].send_all(pages)
            await trio.sleep(6.0)  # the writes wait for clients that never read
            async with await connect(served.url) as other:
                await other.send_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = await read_head(other)
            for stream in stuck:
                await stream.aclose()
            metrics = (await served.client.get("/metrics.json")).json()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
    assert metrics["connections_evicted"] == 1
    assert metrics["connections_refused"] == 0


# --- S24: a body's framing --------------------------------------------------------------------


async def test_s24_a_body_whose_framing_passes_the_limit_is_413() -> None:
    # a 15-byte body, each byte in a chunk of its own carrying 12 KB of extension: well under
    # 8,192 pieces, but 180 KB on the wire against a limit of 1 KiB (trailers are bounded by
    # h11's own limit on an incomplete event)
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    data = b'{"prompt":"hi"}'
    body = b"".join(b"1;x=%s\r\n%c\r\n" % (b"a" * 12_000, byte) for byte in data)
    body += b"0\r\n\r\n"
    limits = Limits(max_body=1024)
    with trio.fail_after(10):
        async with serving(limits=limits) as served:
            async with await connect(served.url) as stream:
                await stream.send_all(head)
                with contextlib.suppress(trio.BrokenResourceError):  # refused and closed
                    for start in range(0, len(body), 4096):  # as it would come off a network
                        await stream.send_all(body[start : start + 4096])
                answer = await read_all(stream)
            runs = served.hub.statistics()["runs"]
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert runs == 0


# --- S22: pipelined heads ----------------------------------------------------------------------


async def test_a_pipelined_head_with_folded_lines_is_refused_after_the_one_before() -> None:
    good = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    folded = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n b\r\n\r\n"
    with trio.fail_after(10):
        async with serving() as served:
            answer = await raw_exchange(served.url, good + folded + good)  # one write
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.count(b"HTTP/1.1 ") == 2  # then the refusal, and nothing after it
    assert b"HTTP/1.1 400 " in answer
