"""S17-S26: the server against a hostile client, over loopback.

Each test runs the real server on 127.0.0.1 with the loopback provider behind it, and clients
that misbehave the way an attack on `rillet serve` did: they stop reading, hold every
subscription they may, start runs until nothing is left, send heads and bodies h11 lets through,
and half-close. The limits are the defaults unless a test says otherwise (and why).
"""

from __future__ import annotations

import logging
import os
import pydoc
import re
import resource
import socket
import statistics
import time
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing
from rillet._core._dialect import Secret
from rillet._core._runevents import AnswerDelta, RunDone, RunStarted, StatusEvent, decode_run_event
from rillet._hub._hub import Hub, MemoryRunLog
from rillet.transports.server import Limits, ServerConfig
from rillet.transports.server._routing import connection_cap

from ..server_support import (
    Served,
    act,
    chat_provider,
    client_at,
    kind,
    raw_exchange,
    read_sse,
    serving,
    text_reply,
    texts,
)
from .test_server_mmsp import body as mmsp_body

if TYPE_CHECKING:
    from collections.abc import Sequence

    import httpx


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def connect(
    url: str, *, rcvbuf: int | None = None, source: str | None = None
) -> trio.SocketStream:
    """A raw client connection; `rcvbuf` makes it back up after a few kilobytes, `source` is
    the loopback address it comes from (127.0.0.2: another client to the server)."""
    host, port = host_port(url)
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source is not None:
        await sock.bind((source, 0))
    await sock.connect((host, port))
    return trio.SocketStream(sock)


async def read_head(stream: trio.SocketStream) -> bytes:
    """Read until the end of a response head; the head."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            break
        buffer += data
    return bytes(buffer)


async def read_all(stream: trio.SocketStream) -> bytes:
    """Read until the server closes the connection."""
    buffer = bytearray()
    try:
        while data := await stream.receive_some(65536):
            buffer += data
    except trio.BrokenResourceError:  # a reset after the last bytes
        pass
    return bytes(buffer)


async def health_latencies(client: httpx.AsyncClient, n: int) -> list[float]:
    """`n` sequential `/healthz` answers, each timed on the wall clock (seconds)."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        answer = await client.get("/healthz")
        out.append(time.perf_counter() - start)
        assert answer.status_code == 200
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def events_of(body: bytes) -> list[Any]:
    """The run events in a raw SSE response (head and chunk framing skipped)."""
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            out.append(decode_run_event(line.removeprefix(b"data: ").rstrip(b"\r")))
    return out


def slow_reply(words: Sequence[str] = ("Hello", " world")) -> Any:
    """A reply that sends its start and first fragment, then stays silent with the connection
    open (a slow generation) until the run is cancelled or the client goes."""
    return text_reply(list(words), stall_after=2)


# --- S17 -----------------------------------------------------------------------------------------


async def test_s17_clients_that_never_read_are_cut_off_and_health_still_answers(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.05  # bytes in flight on loopback are not silence
    pages = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 64  # 64 pages, ~660 KB to write
    with trio.fail_after(120):
        async with serving(limits=Limits(send_buffer=16384)) as served:
            await served.client.get("/healthz")
            baseline = open_fds()
            clients = []
            for _ in range(300):
                stream = await connect(served.url, rcvbuf=16384)
                await stream.send_all(pages)
                clients.append(stream)
            while (await served.client.get("/metrics.json")).json()["connections"] < 301:  # noqa: ASYNC110
                await trio.sleep(0.01)  # the server counts connections; it has no event
            stuck = await health_latencies(served.client, 10)
            start = trio.current_time()
            while (await served.client.get("/metrics.json")).json()["connections"] > 1:  # noqa: ASYNC110
                await trio.sleep(1.0)
            cut_after = trio.current_time() - start
            for stream in clients:
                await stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            after = open_fds()
            healthy = await served.client.get("/healthz")
    assert max(stuck) < 1.0, stuck
    assert 29.0 <= cut_after <= 32.0  # the write deadline: 30 s without progress
    assert after <= baseline
    assert healthy.status_code == 200


async def test_s17_past_the_connection_cap_a_connection_gets_503_and_is_closed(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.05
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=Limits(max_connections=20)) as served:
            run = await served.start()
            path = path_of(run["events_url"])
            # 20 subscribers: every connection busy (the last took the place of the test's own
            # client, idle since it started the run)
            held = [(await hold_sse(served.url, path))[0] for _ in range(20)]
            refused = []
            for _ in range(5):
                async with await connect(served.url) as extra:
                    refused.append(await read_all(extra))
            for stream in held:  # their streams end: the cap frees itself
                await stream.aclose()
            await served.client.delete(f"/v1/runs/{run['run_id']}", headers=act(run))
            while (await served.client.get("/metrics.json")).json()["connections"] > 1:  # noqa: ASYNC110
                await trio.sleep(0.1)  # the server counts connections; it has no event
            metrics = (await served.client.get("/metrics.json")).json()
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in refused)
    assert all(b"retry-after: 1" in answer for answer in refused)
    assert metrics["connections_refused"] == 5
    assert metrics["connections_evicted"] == 1


async def test_s17_out_of_file_descriptors_the_server_backs_off_and_serves_again(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    mock_clock.autojump_threshold = 0.05
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with trio.fail_after(60):
        async with serving() as served:
            await served.client.get("/healthz")
            clients: list[trio.SocketStream] = []
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + 40, hard))
            try:
                while True:  # until the process (server and clients alike) is out of fds
                    try:
                        clients.append(await connect(served.url))
                    except OSError:
                        break
                await trio.sleep(5.0)  # the accept loop fails meanwhile, backing off
                for stream in clients:
                    await stream.aclose()
                clients.clear()
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            healthy = await served.client.get("/healthz")
    assert healthy.status_code == 200
    backoffs = [r for r in caplog.records if "accept failed (EMFILE)" in r.getMessage()]
    assert len(backoffs) == 1  # it happened, and was said once, not once per attempt


# --- S18 -----------------------------------------------------------------------------------------


async def hold_sse(
    url: str, path: str, headers: str = "", *, source: str | None = None
) -> tuple[trio.SocketStream, bytes]:
    """Open an SSE subscription on a raw connection and keep it: the stream and its head."""
    stream = await connect(url, source=source)
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
    return stream, await read_head(stream)


def path_of(url: str) -> str:
    return "/" + url.split("/", 3)[3]


async def test_s18_one_client_holding_its_quota_leaves_other_clients_unaffected() -> None:
    defaults = Limits()
    with trio.fail_after(30):
        async with serving([slow_reply()]) as served:
            mine = await served.start()
            held = [
                await hold_sse(served.url, path_of(mine["events_url"]))
                for _ in range(defaults.max_subscribers_per_client)
            ]
            over = await served.client.get(mine["events_url"])  # the same client once more
            page = await served.start()  # its own run and token, from the same address
            same = await served.client.get(page["events_url"])
            session, session_head = await hold_sse(
                served.url, path_of(mine["events_url"]), "X-Rillet-Session: dashboard\r\n"
            )
            theirs, theirs_head = await hold_sse(  # another client: another address
                served.url, path_of(page["events_url"]), source="127.0.0.2"
            )
            for stream, _ in [*held, (theirs, b""), (session, b"")]:
                await stream.aclose()
    assert all(head.startswith(b"HTTP/1.1 200 ") for _, head in held)
    assert over.status_code == 429
    assert over.json()["error"]["type"] == "too_many_subscribers"
    assert same.status_code == 429  # another token is not another client (S27)
    assert session_head.startswith(b"HTTP/1.1 429 ")  # a session narrows, never widens
    assert theirs_head.startswith(b"HTTP/1.1 200 ")


# --- S19 -----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_s19_kept_runs_are_bounded_in_total_and_the_oldest_finished_go_first() -> None:
    bound = 2 * 1024 * 1024
    log = MemoryRunLog(max_total_bytes=bound, max_total_events=20_000)
    words = ["x" * 1000] * 4  # ~4 KB of answer a run, ~10 KB in the log
    limits = Limits(max_runs_per_client=64, max_streams=32)
    with trio.fail_after(240):
        async with serving([text_reply(words)], hub=Hub(log=log), limits=limits) as served:
            run_ids: list[str] = []

            async def one() -> None:
                run = await served.start()
                run_ids.append(run["run_id"])

            for _ in range(2000 // 20):
                async with trio.open_nursery() as nursery:
                    for _ in range(20):
                        nursery.start_soon(one)
                peak = log.total_bytes
                assert peak <= bound
            while any(r in log.runs() and not log.get(r).done for r in run_ids):  # noqa: ASYNC110
                await trio.sleep(0.01)
            kept = log.runs()
    assert len(run_ids) == 2000
    assert log.total_bytes <= bound
    assert log.total_events <= 20_000
    assert 0 < len(kept) < 2000
    assert log.evicted == 2000 - len(kept)
    # the oldest finished runs went first: the first runs are gone, the last ones kept
    assert not set(run_ids[:100]) & set(kept)
    assert set(run_ids[-10:]) <= set(kept)


async def test_s19_a_live_run_trimmed_to_the_bound_refuses_a_resume_below_it() -> None:
    log = MemoryRunLog(max_total_bytes=256 * 1024)
    words = ["y" * 500] * 400
    with trio.fail_after(30):
        async with serving([text_reply(words)], hub=Hub(log=log)) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            base = log.get(run["run_id"]).base
            expired = await served.client.get(run["events_url"] + "&after=1")
            kept = await read_sse(served.client, run["events_url"] + f"&after={base - 1}")
    assert base > 1
    assert expired.status_code == 410
    assert expired.json()["error"]["type"] == "cursor_expired"
    assert kept.status == 200
    assert kept.seqs[0] == base
    assert log.total_bytes <= 256 * 1024


async def test_s19_expired_runs_are_swept_on_a_timer_without_new_runs(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.05
    log = MemoryRunLog(retention=60.0)
    with trio.fail_after(600):
        async with serving(hub=Hub(log=log)) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            kept_before = (await served.client.get("/metrics.json")).json()["runs_kept"]
            await trio.sleep(60.0 + 2 * Limits().sweep_interval)  # no run starts meanwhile
            kept_after = (await served.client.get("/metrics.json")).json()["runs_kept"]
            runs = log.runs()
    assert kept_before == 1
    assert runs == []
    assert kept_after == 0


def test_s19_the_memory_estimate_covers_what_kept_entries_hold() -> None:
    import tracemalloc

    async def fill() -> tuple[int, int]:
        log = MemoryRunLog()
        log.create("r")
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for seq in range(1, 5001):
                text = "word " * (seq % 40)
                log.append("r", [AnswerDelta(run_id="r" * 24, seq=seq, elapsed_ms=seq, delta=text)])
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        return held, log.total_bytes

    held, estimated = trio.run(fill)
    assert held <= estimated * 1.1, (held, estimated)


# --- S20 -----------------------------------------------------------------------------------------


async def test_s20_150_concurrent_slow_runs_all_get_their_first_event() -> None:
    limits = Limits(max_streams=150, max_runs_per_client=150, max_queued=0)
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=limits) as served:
            runs = []
            for _ in range(150):
                runs.append(await served.start())
            await served.loopback.wait_for_requests(150)
            deltas = [await first_delta(served, run["run_id"]) for run in runs]
            open_upstream = served.loopback.open_connections
            for run in runs:
                await served.client.delete(f"/v1/runs/{run['run_id']}", headers=act(run))
    assert open_upstream == 150  # every run streaming at once, none waiting for a connection
    assert all(delta.delta == "Hello" for delta in deltas)


async def first_delta(served: Served, run_id: str) -> AnswerDelta:
    """The run's first answer fragment, once its log has it (following the hub)."""
    with served.hub.subscribe(run_id) as sub:
        async for entry in sub:
            if isinstance(entry.event, AnswerDelta):
                return entry.event
    raise AssertionError("the run ended without an answer fragment")


# --- S21 -----------------------------------------------------------------------------------------


async def start_as(served: Served, client: str) -> httpx.Response:
    """Start a run as client `a`, `b`, ...: each from a loopback address of its own."""
    async with client_at(served.url, f"127.0.0.{ord(client) - ord('a') + 2}") as other:
        return await other.post("/v1/runs", json={"prompt": "Hi"})


async def test_s21_no_client_takes_the_whole_capacity_and_the_rest_queue_then_429() -> None:
    limits = Limits(max_streams=4, max_runs_per_client=2, max_queued=2)
    with trio.fail_after(30):
        async with serving([slow_reply()], limits=limits) as served:
            a = [await start_as(served, "a") for _ in range(3)]
            b = [await start_as(served, "b") for _ in range(2)]
            c = await start_as(served, "c")  # the capacity is taken: it queues
            d = await start_as(served, "d")
            e = await start_as(served, "e")  # past the queue
            metrics = (await served.client.get("/metrics.json")).json()
            queued = c.json()
            await served.wait_for(queued["run_id"], 1)
            first = decode_run_event(served.log(queued["run_id"])[0])
            held = a[0].json()
            await served.client.delete(f"/v1/runs/{held['run_id']}", headers=act(held))
            await first_delta(served, queued["run_id"])  # admitted: started, then its reply
            admitted = [decode_run_event(data) for data in served.log(queued["run_id"])]
            cancel = d.json()
            await served.client.delete(f"/v1/runs/{cancel['run_id']}", headers=act(cancel))
            await served.wait_for(cancel["run_id"])
            cancelled = [decode_run_event(data) for data in served.log(cancel["run_id"])]
    assert [r.status_code for r in a] == [201, 201, 429]
    assert a[2].json()["error"]["type"] == "too_many_runs"
    assert a[2].headers["retry-after"] == "1"
    assert [r.status_code for r in b] == [201, 201]  # a second client still starts runs
    assert (c.status_code, d.status_code, e.status_code) == (201, 201, 429)
    assert e.headers["retry-after"] == "1"
    assert (metrics["runs_active"], metrics["runs_queued"]) == (4, 2)
    assert isinstance(first, StatusEvent)
    assert (first.seq, first.phase) == (1, "queued")
    assert [ev.seq for ev in admitted] == list(range(1, len(admitted) + 1))
    assert isinstance(admitted[1], RunStarted)
    assert texts(admitted) == "Hello"
    assert [kind(ev) for ev in cancelled] == ["status", "run.done"]  # it never reached upstream
    assert isinstance(cancelled[-1], RunDone)
    assert cancelled[-1].status == "cancelled"


async def test_s21_concurrent_starts_never_count_past_the_limit() -> None:
    limits = Limits(max_streams=8, max_queued=0, max_runs_per_client=100)
    with trio.fail_after(60):
        async with serving([slow_reply()], limits=limits) as served:
            statuses: list[int] = []
            peak = 0

            async def start() -> None:
                started = await served.client.post("/v1/runs", json={"prompt": "Hi"})
                statuses.append(started.status_code)

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, upstream_streams(served))
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as outer:
                outer.start_soon(watch)
                async with trio.open_nursery() as nursery:
                    for _ in range(60):
                        nursery.start_soon(start)
                outer.cancel_scope.cancel()
            metrics = (await served.client.get("/metrics.json")).json()
    assert statuses.count(201) == 8
    assert statuses.count(429) == 52
    assert peak <= 8
    assert metrics["runs_active"] == 8


def upstream_streams(served: Served) -> int:
    """The upstream streams open right now, as the provider counts them."""
    return served.loopback.open_connections


# --- S22, S23 ------------------------------------------------------------------------------------


async def test_s22_content_length_with_transfer_encoding_is_400_and_closes() -> None:
    smuggled = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    with trio.fail_after(10):
        async with serving() as served:
            answer = await raw_exchange(served.url, smuggled)
            runs = served.hub.statistics()["runs"]
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert answer.count(b"HTTP/1.1") == 1  # nothing after it on that connection is answered
    assert b"connection: close" in answer.lower()
    assert runs == 0


@pytest.mark.parametrize("pieces", [1, 7, 200], ids=["one-write", "seven-writes", "200-writes"])
async def test_s23_the_head_limit_holds_however_the_head_arrives(pieces: int) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    fits = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 15_000 + b"\r\n\r\n"
    with trio.fail_after(10):
        async with serving() as served:
            answers = []
            for head in (big, fits):
                async with await connect(served.url) as stream:
                    size = -(-len(head) // pieces)
                    for i in range(0, len(head), size):
                        await stream.send_all(head[i : i + size])
                    answers.append(await read_head(stream))
    assert answers[0].startswith(b"HTTP/1.1 431 ")
    assert answers[1].startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "head",
    [
        b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n",
        b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"HEAD /healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n",
    ],
    ids=["too-large", "length-and-chunked", "version"],
)
async def test_a_head_refused_before_its_route_is_answered_without_a_body(
    head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # the refusal comes before routing, which knows the method: h11 refuses a body after a
    # HEAD's head, and the connection used to fail there (an error logged, no clean close)
    with trio.fail_after(10):
        async with serving() as served:
            answer = await raw_exchange(served.url, head)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.1 (400|431|505) ", status), answer[:100]
    assert b"connection: close" in status
    assert body == b""
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


# --- S24 -----------------------------------------------------------------------------------------


async def test_s24_bodies_in_1_byte_chunks_cost_bounded_work() -> None:
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = b"1\r\n \r\n" * 4096
    with trio.fail_after(60):
        async with serving() as served:
            answers: list[bytes] = []
            answered = trio.Event()

            async def upload() -> None:
                while True:
                    async with await connect(served.url) as stream:
                        try:
                            await stream.send_all(head)
                            while True:
                                await stream.send_all(chunks)
                        except trio.BrokenResourceError:  # refused and closed
                            answers.append(await read_all(stream))
                            answered.set()

            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(upload)
                await trio.sleep(0.5)  # the uploads are under way
                latencies = await health_latencies(served.client, 40)
                await answered.wait()  # and each is refused in the end
                nursery.cancel_scope.cancel()
            runs = served.hub.statistics()["runs"]
    assert statistics.median(latencies) < 0.050, latencies
    assert answers
    assert all(a.startswith(b"HTTP/1.1 400 ") or a == b"" for a in answers)
    assert any(a.startswith(b"HTTP/1.1 400 ") for a in answers)
    assert runs == 0


# --- S25 -----------------------------------------------------------------------------------------


async def test_s25_a_client_that_half_closes_after_its_request_gets_its_whole_stream() -> None:
    words = [f"w{n} " for n in range(40)]
    script = [text_reply(words, chunk_delay=0.01, headers_delay=0.2)]
    with trio.fail_after(20):
        async with serving(script) as served:
            run = await served.start()
            async with await connect(served.url) as stream:
                path = path_of(run["events_url"])
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await stream.send_eof()
                sse = await read_all(stream)
            async with await connect(served.url) as stream:
                await stream.send_all(mmsp_request())
                await stream.send_eof()
                mmsp = await read_all(stream)
    events = events_of(sse)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert kind(events[-1]) == "run.done"
    assert texts(events) == "".join(words)
    assert sse.endswith(b"0\r\n\r\n")  # the chunked body ended properly
    assert mmsp.startswith(b"HTTP/1.1 200 ")
    assert b"data: [DONE]\n\n" in mmsp
    assert mmsp.count(b'"text":"w') >= len(words)


async def test_s25_a_client_that_closes_after_reading_all_it_was_sent_is_let_go_at_once() -> None:
    """Its end of stream alone could be a half-close; the reset its kernel sends back to the
    server's probe says it closed. That reset comes after the end of stream, so a read does not
    raise it: the server must see it all the same, with no heartbeat due for an hour."""
    script = [text_reply([f"w{n} " for n in range(5)], stall_after=3)]  # then silence
    with trio.fail_after(20):
        async with serving(script, limits=Limits(heartbeat=3600)) as served:
            run = await served.start()
            while not any(b'"delta":"w1 "' in e for e in served.log(run["run_id"])):  # noqa: ASYNC110
                await trio.sleep(0.01)  # (the log offers no event) the run has given all it will
            last = f"{run['run_id']}:{len(served.log(run['run_id']))}".encode()
            async with await connect(served.url) as stream:
                path = path_of(run["events_url"])
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                seen = b""
                while b"id: " + last + b"\n" not in seen:  # every event there is, then close
                    seen += await stream.receive_some()
            while (await served.client.get("/metrics.json")).json()["subscribers"]:  # noqa: ASYNC110
                await trio.sleep(0.01)  # (no event says a subscriber went)
    assert seen.startswith(b"HTTP/1.1 200 ")


def mmsp_request() -> bytes:
    """A raw `POST /v1/stream` (MMSP), head and body."""
    body = msgspec.json.encode(mmsp_body())
    return (
        b"POST /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


async def queued(served: Served, n: int) -> None:
    """Until `n` runs or streams wait for a slot."""
    while (await served.client.get("/metrics.json")).json()["runs_queued"] != n:  # noqa: ASYNC110
        await trio.sleep(0.01)  # (no event says a stream was queued or left the queue)


async def test_s25_a_client_that_leaves_the_queue_never_costs_a_provider_request() -> None:
    """No response has begun while a stream waits for a slot, so no SSE comment can probe the
    connection: a `100 Continue` does, and the reset that answers it takes the stream out of
    the queue before it is ever sent upstream."""
    script = [text_reply([f"w{n} " for n in range(5)], stall_after=3)]  # holds its slot
    limits = Limits(max_streams=1, heartbeat=3600)
    with trio.fail_after(20):
        async with serving(script, limits=limits) as served:
            await served.start()  # the one slot, held
            async with await connect(served.url) as stream:
                await stream.send_all(mmsp_request())
                await queued(served, 1)
            await queued(served, 0)  # the client that closed is out of the queue
            requests = len(served.loopback.requests)
    assert requests == 1  # the run's: the stream that left never reached the provider


async def test_s25_a_client_that_half_closes_in_the_queue_gets_its_whole_stream() -> None:
    words = [f"w{n} " for n in range(5)]
    script = [text_reply(words, stall_after=3), text_reply(words)]  # the run's, the stream's
    limits = Limits(max_streams=1, heartbeat=3600)
    with trio.fail_after(20):
        async with serving(script, limits=limits) as served:
            run = await served.start()  # the one slot, held until the run is cancelled
            async with await connect(served.url) as stream:
                await stream.send_all(mmsp_request())
                await queued(served, 1)
                await stream.send_eof()
                answer = b""
                while b"\r\n\r\n" not in answer:  # the probe's answer, while still queued
                    answer += await stream.receive_some()
                cancelled = await served.client.delete(
                    f"/v1/runs/{run['run_id']}", headers=act(run)
                )
                answer += await read_all(stream)
    assert cancelled.status_code == 202
    interim, _, final = answer.partition(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue"  # the probe: it half-closed, so read on
    assert final.startswith(b"HTTP/1.1 200 ")
    assert b"data: [DONE]\n\n" in final
    assert final.count(b'"text":"w') >= 5


# --- S26 -----------------------------------------------------------------------------------------


async def test_s26_error_bodies_that_echo_input_are_json_and_not_sniffed() -> None:
    echo = b'{"prompt": <script>alert(1)</script>'
    with trio.fail_after(10):
        async with serving() as served:
            bad = await served.client.post(
                "/v1/runs", content=echo, headers={"content-type": "application/json"}
            )
            mmsp = await served.client.post(
                "/v1/stream", content=echo, headers={"content-type": "application/json"}
            )
            unknown = await served.client.get("/nope<script>")
    for answer in (bad, mmsp, unknown):
        assert answer.status_code in (400, 404)
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["x-content-type-options"] == "nosniff"
        answer.json()  # JSON whatever it echoes


def test_s26_documentation_and_reprs_never_render_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-environment-secret-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    provider = chat_provider("http://127.0.0.1:9", api_key=key)
    config = ServerConfig(provider=provider, api_key=Secret("server-secret-0123456789"))
    plain: Any = pydoc.plaintext  # type: ignore[attr-defined]  # pydoc's own, not in its stubs
    rendered = [
        repr(config),
        repr(provider),
        pydoc.render_doc(config, renderer=plain),
        pydoc.render_doc(ServerConfig, renderer=plain),
        pydoc.render_doc(Limits, renderer=plain),
    ]
    for text in rendered:
        assert key not in text
        assert "server-secret-0123456789" not in text


# --- request lines and headers h11 lets through --------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /healthz HTTP/1.2\r\nHost: 127.0.0.1\r\n\r\n", 505),
        (b"GET /healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 505),
        (b"GET /healthz HTTP/1.1\r\nHost: evil@127.0.0.1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n", 400),
        (
            b"GET /v1/runs/ab/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: not-sixteen-bytes\r\n\r\n",
            400,
        ),
        # methods are case-sensitive: a proxy in front that refuses DELETE passes `delete` on
        (b"get /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"dElEtE /v1/runs/ab HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"BREW /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        # RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing
        (
            b"POST /v1/runs HTTP/1.0\r\nContent-Type: application/json\r\n"
            b'Transfer-Encoding: chunked\r\n\r\nf\r\n{"prompt":"hi"}\r\n0\r\n\r\n',
            400,
        ),
        # lines h11 reads one way and a proxy in front may read another (RFC 9112 §2.2, §5.2)
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n b\r\n\r\n", 400),
        (
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-A: a\r\n\tTransfer-Encoding: chunked\r\nContent-Length: 15\r\n\r\n"
            b'{"prompt":"hi"}',
            400,
        ),
        (b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\nX-B: b\r\n\r\n", 400),
    ],
    ids=[
        "http-1.2",
        "http-2.0",
        "host-with-userinfo",
        "two-hosts",
        "short-websocket-key",
        "lower-case-get",
        "mixed-case-delete",
        "unknown-method",
        "http-1.0-chunked",
        "obs-fold",
        "obs-fold-hiding-transfer-encoding",
        "bare-lf",
        "bare-lf-in-one-line",
    ],
)
async def test_request_lines_and_headers_http_forbids_are_refused(
    request_bytes: bytes, status: int
) -> None:
    with trio.fail_after(10):
        async with serving() as served:
            answer = await raw_exchange(served.url, request_bytes)
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    assert answer.count(b"\r\n\r\n") == 1  # one response, then closed


def test_s17_the_connection_cap_stays_under_the_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = Limits()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1000, hard))
        low = connection_cap(limits)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert low == 1000 - limits.max_streams - 64  # room for upstream and the rest
    assert connection_cap(Limits(max_connections=100)) == 100  # under the limit: as configured
