"""Workers: deliveries per second with 1 and 2 server processes on one port (`serve` with
`workers`, SO_REUSEPORT, runs shared through a real `redis-server`).

`python -m bench.workers [--workers 1,2] [--runs 8] [--per-run 250] [--events 1000]
[--paced 1000] [--rate 50]` prints a Markdown table; `run_workers(...)` returns the figures.

Processes, on loopback only: `redis-server` (no persistence), a provider (an OpenAI Chat
stream of `events` text fragments `w<k> `, which starts when told and sends frame k at
`t0 + k/rate`, or everything at once for the saturation phase), the supervisor (this process:
it only starts runs and the others) with its 1 or 2 worker processes, and the subscribers (one
process, `--client`: plain sockets and epoll). Two phases per worker count:

- saturation: `runs` runs, started on the workers in turn (each worker decodes and appends
  its share), `per_run` subscribers each (half WebSocket, half SSE; each on a connection of
  its own, so the kernel spreads them over the workers), every fragment sent at once: the
  servers deliver as fast as they can; `rounds` rounds, 1 and 2 workers interleaved, the
  median reported. deliveries/s = events received by all
  subscribers / (last `run.done` received - the provider's start). No subscriber can be
  dropped: a run's events (≈ `events`) stay within the hub's 1,024-event allowance.
- paced: one run, `paced` WS + `paced` SSE subscribers, `rate` events/s on the provider's fixed
  schedule: delay = the arrival of the read that brought an event minus the time the
  provider's schedule sent it (`t0 + k/rate`; both processes read the same monotonic clock),
  so it spans provider, worker, Redis, the worker serving the subscriber and the kernel. The
  arrival is the kernel's receive timestamp of the read (`SO_TIMESTAMPNS`, the last segment's
  for a read of several, taken on loopback inside the worker's `send`), not the moment this
  one process got round to that socket among 2,000 ready ones: a subscriber of its own would
  have read it then. Where the kernel gives no stamp, it is the `recv` (the table says so).

The load generator is kept cheap, since it shares the two cores with what it measures: one
`recv_into` per readable socket into one buffer, events counted with `bytes.count` of the
`{"type":"` that opens every event's JSON (SSE `data:` lines and WebSocket text frames alike;
the last 8 bytes of the previous read are kept so a split marker still counts once), `run.done`
found with `in`; no frame is parsed. The paced phase times only the first event of each read
(`bytes.find` of `"delta":"w`, its number parsed): the oldest event in a read, so its delay is
the read's largest. CPU is user+system time of each process over the phase (the workers' from
`/proc/<pid>/stat`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import math
import os
import resource
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio
from rillet._core._dialect import Provider
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig
from rillet.transports.server._workers import supervise
from rillet.transports.testing import openai_text_stream

from .fanout_load import SO_TIMESTAMPNS, kernel_arrival, raise_fd_limit
from .procstat import machine_busy, process_cpu, rank
from .redis_hub import local_redis

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["WorkersPhase", "WorkersResult", "run_phase", "run_workers"]

_ROOT = Path(__file__).resolve().parent.parent
_MARK = b'{"type":"'
_DONE = b'"type":"run.done"'
_DELTA = b'"delta":"w'
_SPARE_FDS = 128


@attrs.define
class WorkersPhase:
    """One phase with one worker count."""

    workers: int
    phase: str
    subscribers: int
    events: int  # events each subscriber should get (the run's log)
    delivered: int
    complete: int  # subscribers that got `run.done`
    seconds: float
    deliveries_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu: float  # share of one core, the workers together
    client_cpu: float
    spread: list[int]  # runs started on each worker (saturation) or subscribers seen
    rounds: list[float] = attrs.field(factory=list)  # deliveries/s of each round
    fewest: int = 0  # the fewest and most events a subscriber that finished got
    most: int = 0
    kernel_stamps: bool = False  # paced: arrivals are the kernel's receive timestamps
    machine_cpu: float = math.nan  # every process on the machine, as a share of one core


@attrs.define
class WorkersResult:
    """Both phases for every worker count, and what the machine was."""

    phases: list[WorkersPhase]
    cpus: int
    load: float
    note: str = ""

    def speedup(self) -> float | None:
        """Saturated deliveries/s with the most workers over those with one."""
        sat = {p.workers: p.deliveries_per_s for p in self.phases if p.phase == "saturation"}
        if 1 not in sat or len(sat) < 2 or not sat[1]:
            return None
        return sat[max(sat)] / sat[1]

    def markdown(self) -> str:
        """The section: how it measures, and the table (`report.workers_markdown`)."""
        from .report import workers_markdown

        return workers_markdown(attrs.asdict(self))


# --- the provider (a process of its own) ----------------------------------------------------------


def _frames(events: int) -> tuple[list[bytes], int]:
    """The stream's SSE frames, and the index of the frame carrying fragment 0."""
    stream = openai_text_stream([f"w{k} " for k in range(events)])
    frames = [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]
    first = next(i for i, f in enumerate(frames) if b'"w0 "' in f)
    return frames, first


async def _provide(events: int) -> None:
    """Serve every request the stream once told `go <t0> <rate>` on stdin (rate 0: all at
    once); print the port first."""
    frames, _ = _frames(events)
    go = trio.Event()
    schedule: list[float] = []

    async def read_go() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        line = b""
        while b"\n" not in line:
            data = await stdin.receive_some(256)
            if not data:
                return
            line += data
        t0, rate = line.split()[1:3]
        schedule.extend((float(t0), float(rate)))
        go.set()

    async def reply(conn: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            data = await conn.receive_some(65536)
            if not data:
                return
            request += data
        await go.wait()
        t0, rate = schedule
        await conn.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        if not rate:
            await trio.sleep(max(0.0, t0 - time.monotonic()))
            body = b"".join(frames)
            await conn.send_all(b"%x\r\n%s\r\n" % (len(body), body))
        else:
            for index, frame in enumerate(frames):
                await trio.sleep(max(0.0, t0 + index / rate - time.monotonic()))
                await conn.send_all(b"%x\r\n%s\r\n" % (len(frame), frame))
        await conn.send_all(b"0\r\n\r\n")
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_go)
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, reply, 0, host="127.0.0.1")
        )
        print(f"PORT {listeners[0].socket.getsockname()[1]}", flush=True)


# --- the subscribers (a process of its own) -------------------------------------------------------


def _request(spec: dict[str, Any], run: dict[str, str], kind: str, n: int) -> bytes:
    """A subscription's request head, each subscriber a session of its own (every
    subscriber here is one client, 127.0.0.1: the limits give that client room for all)."""
    host = f"{spec['host']}:{spec['port']}"
    common = f"Host: {host}\r\nX-Rillet-Session: s{n}\r\n"
    if kind == "sse":
        return (
            f"GET /v1/runs/{run['run_id']}/events?token={run['token']} HTTP/1.1\r\n{common}"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /v1/runs/{run['run_id']}/ws?token={run['token']} HTTP/1.1\r\n{common}"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _client(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe, say `ready`, read `go <t0>` on stdin, count events to every `run.done`."""
    raise_fd_limit(len(spec["subs"]) + _SPARE_FDS)
    socks: dict[int, socket.socket] = {}
    tails: dict[int, bytes] = {}
    pending: list[bytes] = []
    for n, (run_index, kind) in enumerate(spec["subs"]):
        sock = socket.create_connection((spec["host"], spec["port"]))
        sock.sendall(_request(spec, spec["runs"][run_index], kind, n))
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed during the handshake")
            head += data
        status = head.split(b" ", 2)[1]
        if status not in (b"200", b"101"):
            raise ConnectionError(f"subscription refused: {head[:200]!r}")
        pending.append(head.partition(b"\r\n\r\n")[2])
        sock.setblocking(False)
        socks[sock.fileno()] = sock
    print("ready", flush=True)
    _, t0_text, rate_text, offset_text = sys.stdin.readline().split()
    t0, rate, offset = float(t0_text), float(rate_text), int(offset_text)
    # paced: a read's arrival is the kernel's stamp of it (the socket's, not when this one
    # process got round to it among 2,000), on the monotonic clock the schedule is on
    stamped = bool(rate) and _stamp_arrivals(socks.values())
    realtime = time.time_ns() - time.monotonic_ns()  # CLOCK_REALTIME - CLOCK_MONOTONIC
    # CPU from the provider's start to the last `run.done`, the window `seconds` measures:
    # this process's, the workers' and the whole machine's
    time.sleep(max(0.0, t0 - time.monotonic()))
    window = time.monotonic()
    cpu = _cpu()
    servers = sum(process_cpu(pid) for pid in spec["pids"])
    busy = machine_busy()
    poller = select.epoll()
    delivered = 0
    done = 0
    delays: list[float] = []
    counts: dict[int, int] = {}  # events each subscriber got
    finished_counts: list[int] = []
    for fd, rest in zip(list(socks), pending, strict=True):
        counts[fd] = rest.count(_MARK)
        delivered += counts[fd]
        tails[fd] = rest[-8:]
        poller.register(fd, select.EPOLLIN)
    buffer = bytearray(262144)
    view = memoryview(buffer)
    deadline = time.monotonic() + spec["timeout"]
    last = time.monotonic()
    while socks and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.5):
            sock = socks[fd]
            arrival = 0
            try:
                if stamped:
                    size, ancillary, _, _ = sock.recvmsg_into([buffer], 64)
                    arrival = kernel_arrival(ancillary)
                else:
                    size = sock.recv_into(buffer)
            except BlockingIOError:
                continue
            except OSError:
                size = 0
            now = (arrival - realtime) / 1e9 if arrival else time.monotonic()
            chunk = tails[fd] + bytes(view[:size])
            count = chunk.count(_MARK)
            delivered += count
            counts[fd] += count
            if count and rate:
                at = chunk.find(_DELTA)
                end = chunk.find(b" ", at + 10) if at >= 0 else -1
                if end > 0 and chunk[at + 10 : end].isdigit():
                    k = int(chunk[at + 10 : end])
                    delays.append(now - (t0 + (k + offset) / rate))
            tails[fd] = chunk[-8:]
            finished = _DONE in chunk
            if finished or not size:
                done += finished
                finished_counts.append(counts[fd] if finished else -1)
                last = now
                poller.unregister(fd)
                sock.close()
                del socks[fd]
    cpu = _cpu() - cpu
    servers = sum(process_cpu(pid) for pid in spec["pids"]) - servers
    busy = machine_busy() - busy
    window = time.monotonic() - window
    for sock in socks.values():
        sock.close()
    delays.sort()
    return {
        "kernel_stamps": stamped,
        "delivered": delivered,
        "done": done,
        "seconds": last - t0,
        "cpu": cpu / window,  # shares of one core
        "server_cpu": servers / window,
        "machine_cpu": busy / window,
        "p50": rank(delays, 0.50),
        "p99": rank(delays, 0.99),
        "max": delays[-1] if delays else math.nan,
        "fewest": min(finished_counts, default=0),  # -1: one ended without `run.done`
        "most": max(finished_counts, default=0),
    }


def _stamp_arrivals(socks: Iterable[socket.socket]) -> bool:
    """Have the kernel stamp every read's arrival on these sockets; False if it cannot."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


# --- the orchestration (this process, the supervisor) --------------------------------------------


async def _line(stream: trio.abc.ReceiveStream) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        data = await stream.receive_some(4096)
        if not data:
            raise RuntimeError("a bench process ended before it answered")
        line += data
    return line


async def _open(args: list[str]) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.workers", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=_ROOT,
    )


async def run_phase(
    redis: str,
    workers: int,
    phase: str,
    runs: int,
    subs: list[tuple[int, str]],
    events: int,
    rate: float,
) -> WorkersPhase:
    """One phase: a provider of `events` fragments, `workers` worker processes on the Redis at
    `redis`, `runs` runs, and a subscriber for each `(run index, "ws" or "sse")` of `subs`;
    `rate` events/s on the provider's schedule, 0 for all at once."""
    provider_process = await _open(["--provider", str(events)])
    client_process: trio.Process | None = None
    try:
        assert provider_process.stdout is not None
        assert provider_process.stdin is not None
        port = int((await _line(provider_process.stdout)).split()[1])
        provider = Provider(OpenAIChatDialect(), f"http://127.0.0.1:{port}/v1", "bench-model")
        total = len(subs)
        config = ServerConfig(
            provider=provider,
            port=0,
            redis_url=redis,
            workers=workers,
            limits=Limits(
                max_subscribers_per_run=total + 10,
                max_subscribers_per_client=total + 10,
                max_connections=total + 256,
                max_runs_per_client=runs + 10,
            ),
        )
        async with trio.open_nursery() as nursery:
            url = await nursery.start(supervise, config)
            pids = _worker_pids()
            # the runs dealt out over the workers in turn, so each decodes and appends its share
            started = [await _start_on(url, i % workers) for i in range(runs)]
            spec = {
                "host": "127.0.0.1",
                "port": int(url.rsplit(":", 1)[1]),
                "runs": started,
                "subs": subs,
                "timeout": (events / rate if rate else 0) + 240,
                "pids": pids,
            }
            client_process = await _open(["--client"])
            assert client_process.stdin is not None
            assert client_process.stdout is not None
            await client_process.stdin.send_all(json.dumps(spec).encode() + b"\n")
            with trio.fail_after(300):
                assert (await _line(client_process.stdout)).strip() == b"ready"
            spread = await _spread(url, workers, "runs_started" if rate == 0 else "subscribers")
            _, offset = _frames(events)
            t0 = time.monotonic() + 0.2
            go = f"go {t0} {rate} {offset}\n".encode()
            await provider_process.stdin.send_all(go)
            await client_process.stdin.send_all(go)
            out = b""
            while True:
                data = await client_process.stdout.receive_some(65536)
                if not data:
                    break
                out += data
            await client_process.wait()
            nursery.cancel_scope.cancel()
        found = json.loads(out)
        seconds = found["seconds"]
        return WorkersPhase(
            workers=workers,
            phase=phase,
            subscribers=total,
            events=round(found["delivered"] / max(1, found["done"])),
            delivered=found["delivered"],
            complete=found["done"],
            seconds=round(seconds, 3),
            deliveries_per_s=found["delivered"] / seconds if seconds > 0 else math.nan,
            p50_ms=found["p50"] * 1000,
            p99_ms=found["p99"] * 1000,
            max_ms=found["max"] * 1000,
            server_cpu=found["server_cpu"],
            client_cpu=found["cpu"],
            spread=spread,
            fewest=found["fewest"],
            most=found["most"],
            kernel_stamps=found["kernel_stamps"],
            machine_cpu=found["machine_cpu"],
        )
    finally:
        with trio.CancelScope(shield=True):
            for process in (provider_process, client_process):
                if process is not None and process.returncode is None:
                    process.kill()
                    await process.wait()


async def _start_on(url: str, worker: int) -> dict[str, Any]:
    """A run started on `worker`: connections are opened until one reaches it (its
    `/metrics.json` says so), and the run is started on that connection."""
    for _ in range(400):
        async with httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=1)
        ) as http:
            if (await http.get("/metrics.json")).json()["worker"] == worker:
                started: dict[str, Any] = (
                    await http.post("/v1/runs", json={"prompt": "go"})
                ).json()
                return started
    raise RuntimeError(f"no connection reached worker {worker}")


def _worker_pids() -> list[int]:
    """This process's children that are workers."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            mine = int(stat.rsplit(")", 1)[1].split()[1]) == me
            if mine and b"worker_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


async def _spread(url: str, workers: int, counter: str) -> list[int]:
    """`counter` of each worker's `/metrics.json` (asked on fresh connections until each
    worker answered; bounded)."""
    seen: dict[int, int] = {}
    for _ in range(200):
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            metrics = (await http.get("/metrics.json")).json()
        seen[metrics["worker"]] = metrics[counter]
        if len(seen) == workers:
            break
    return [seen.get(i, -1) for i in range(workers)]


def run_workers(
    workers: tuple[int, ...] = (1, 2),
    *,
    runs: int = 8,
    per_run: int = 250,
    events: int = 1000,
    paced: int = 1000,
    paced_events: int = 500,
    rate: float = 50.0,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> WorkersResult:
    """Both phases for each worker count (see the module's doc); the saturation phase
    `rounds` times, interleaved, its median round reported."""
    load = os.getloadavg()[0]
    limit = raise_fd_limit(2 * max(runs * per_run, 2 * paced) + _SPARE_FDS)
    note = ""
    if limit < 2 * max(runs * per_run, 2 * paced) + _SPARE_FDS:
        scale = (limit - _SPARE_FDS) / (2 * max(runs * per_run, 2 * paced))
        per_run, paced = max(2, int(per_run * scale)), max(1, int(paced * scale))
        note = f"Scaled down to fit the fd limit ({limit})."
    saturated = [(r, "ws" if i % 2 else "sse") for r in range(runs) for i in range(per_run)]
    at_pace = [(0, "ws")] * paced + [(0, "sse")] * paced
    phases = []
    with local_redis() as redis:
        tries: dict[int, list[WorkersPhase]] = {n: [] for n in workers}
        for r in range(rounds):  # interleaved, so that a busy moment of the machine hits both
            for n in workers:
                if progress:
                    progress(
                        f"workers: {n} worker(s), saturation round {r + 1}/{rounds} "
                        f"({len(saturated):,} subscribers)"
                    )
                tries[n].append(
                    trio.run(run_phase, redis, n, "saturation", runs, saturated, events, 0.0)
                )
        for n in workers:
            ordered = sorted(tries[n], key=lambda p: p.deliveries_per_s)
            median = ordered[len(ordered) // 2]
            median.rounds = [round(p.deliveries_per_s) for p in tries[n]]
            phases.append(median)
            if progress:
                progress(f"workers: {n} worker(s), paced ({len(at_pace):,} at {rate:g}/s)")
            phases.append(
                trio.run(run_phase, redis, n, f"paced {rate:g}/s", 1, at_pace, paced_events, rate)
            )
    return WorkersResult(phases, os.cpu_count() or 0, load, note)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table (or be the provider or the subscribers)."""
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--runs", type=int, default=8, help="saturation: runs")
    parser.add_argument("--per-run", type=int, default=250, help="saturation: subscribers a run")
    parser.add_argument("--events", type=int, default=1000, help="saturation: events a run")
    parser.add_argument("--paced", type=int, default=1000, help="paced: WS and SSE subscribers")
    parser.add_argument("--paced-events", type=int, default=500, help="paced: events")
    parser.add_argument("--rate", type=float, default=50.0, help="paced: events/s")
    parser.add_argument("--rounds", type=int, default=3, help="saturation: rounds (median)")
    parser.add_argument("--provider", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.provider:
        trio.run(_provide, args.provider)
        return
    if args.client:
        json.dump(_client(json.loads(sys.stdin.readline())), sys.stdout)
        return
    result = run_workers(
        tuple(int(n) for n in args.workers.split(",")),
        runs=args.runs,
        per_run=args.per_run,
        events=args.events,
        paced=args.paced,
        paced_events=args.paced_events,
        rate=args.rate,
        rounds=args.rounds,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(result.markdown())


if __name__ == "__main__":
    main()
