"""The gateway: K concurrent streamed completions through `rillet serve`'s
`/v1/chat/completions`, through a bare trio pass-through proxy (the limit for a Python gateway
on trio) and through LiteLLM's proxy, against the upstream alone.

`python -m bench gateway [--quick]`, or `python -m bench.gateway [--ks 10,100] [--repeats 3]`
for the table alone.

Processes, on loopback only, each measured apart:

- the upstream: a paced OpenAI Chat server (`chunks` text fragments `w<k> ` per answer at
  `rate` per second, chunked transfer encoding), one thread on epoll with a heap of due
  chunks and no framework, so it stays light;
- the gateway under test, in a process of its own (fresh for every window, so its peak RSS is
  that window's): `rillet serve`'s server with its limits sized for K, the pass-through, or
  LiteLLM's proxy (from bench/.venv-peers, when it is installed there with its proxy extra);
  "direct" is no gateway at all, the baseline the added latencies are measured against;
- the load client: K connections on one epoll thread, requests spread over `stagger` seconds,
  every read stamped by the kernel (`SO_TIMESTAMPNS`) so the figure is not when this one
  process got round to the socket.

Per gateway and K: the gateway process's CPU time over the window divided by the chunks the
upstream sent (µs per chunk), time to first text fragment and the gap between reads that
carry text (p50 / p99, then added: minus the same figure with no gateway, in the same
repeat), the gateway's peak RSS, streams that failed or came back incomplete, and the CPU of
the upstream and the client (each must stay light, or they set the figures). Windows are
interleaved (each repeat runs every K and every gateway in turn); medians of the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fanout_load import SO_TIMESTAMPNS, kernel_arrival, raise_fd_limit
from .procstat import machine_busy, peak_rss, process_cpu, process_tree, rank
from .redis_hub import local_redis

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "GATEWAYS",
    "answer_chunks",
    "gateway_markdown",
    "largest_k",
    "run_client",
    "run_gateway",
    "spawn_upstream",
    "stop",
]

_ROOT = Path(__file__).resolve().parent.parent
_PEERS_BIN = _ROOT / "bench" / ".venv-peers" / "bin"
GATEWAYS = ("direct", "passthrough", "rillet", "rillet-w2", "litellm")
_TEXT = b'"content":"w'
_REQUEST_BODY = json.dumps(
    {
        "model": "bench-model",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "stream": True,
    }
).encode()


# --- the upstream ---------------------------------------------------------------------------------


def _chunk(payload: bytes) -> bytes:
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def answer_chunks(chunks: int) -> list[bytes]:
    """One answer as HTTP chunks: a role chunk, `chunks` text fragments, the finish chunk with
    usage, `[DONE]`, then the end of the body."""
    head = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m",'
    out = [_chunk(head + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')]
    for k in range(chunks):
        delta = b'"choices":[{"index":0,"delta":{"content":"w%d "}}]}' % k
        out.append(_chunk(head + delta))
    usage = b'"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}' % (
        chunks,
        chunks + 5,
    )
    finish = b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    out.append(_chunk(head + finish + usage + b"}"))
    out.append(_chunk(b"[DONE]") + b"0\r\n\r\n")
    return out


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _request_done(data: bytes) -> bool:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in data[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return len(data) >= end + 4 + length


def serve_upstream(chunks: int, rate: float) -> None:
    """The paced upstream: print `port P`, serve until stdin closes. Each request is answered
    with `answer_chunks(chunks)`, chunk k at the request's arrival + k / rate."""
    raise_fd_limit(4096)
    body = answer_chunks(chunks)
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    listener.setblocking(False)
    print(f"port {listener.getsockname()[1]}", flush=True)
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    with contextlib.suppress(PermissionError):  # stdin a file: serve until killed
        poller.register(sys.stdin.fileno(), select.EPOLLIN)
    socks: dict[int, socket.socket] = {}
    reading: dict[int, bytes] = {}
    due: list[tuple[float, int, int, int]] = []  # (when, fd, generation, next chunk)
    generation: dict[int, int] = {}
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
        for fd, _ in poller.poll(timeout):
            if fd == listener.fileno():
                while True:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    socks[conn.fileno()] = conn
                    reading[conn.fileno()] = b""
                    generation[conn.fileno()] = generation.get(conn.fileno(), 0) + 1
                    poller.register(conn.fileno(), select.EPOLLIN)
            elif fd == sys.stdin.fileno():
                return
            else:
                sock = socks.get(fd)
                if sock is None:
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    poller.unregister(fd)
                    sock.close()
                    del socks[fd]
                    generation[fd] += 1  # its pending chunks are void
                    continue
                reading[fd] += data
                if _request_done(reading[fd]):
                    reading[fd] = b""
                    try:
                        sock.send(_HEAD + body[0])
                    except OSError:
                        continue
                    start = time.monotonic()
                    heapq.heappush(due, (start + 1 / rate, fd, generation[fd], 1))
        now = time.monotonic()
        while due and due[0][0] <= now:
            when, fd, gen, k = heapq.heappop(due)
            sock = socks.get(fd)
            if sock is None or generation[fd] != gen:
                continue
            try:
                sock.send(body[k])  # small, into an idle socket's buffer: whole or an error
            except OSError:
                continue
            if k + 1 < len(body):
                # the tail (finish, usage, [DONE], end) goes at once after the last fragment
                step = 0.0 if k >= chunks else 1 / rate
                heapq.heappush(due, (when + step, fd, gen, k + 1))


# --- the bare trio pass-through -----------------------------------------------------------------


def serve_passthrough(upstream_port: int) -> None:
    """A bare trio proxy: each client connection gets a connection to the upstream, and bytes
    are copied both ways as they come, one read to one write. Prints `port P`."""
    import trio

    async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    async def handle(client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", upstream_port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=4096)
        print(f"port {listeners[0].socket.getsockname()[1]}", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            await trio.to_thread.run_sync(sys.stdin.buffer.read)  # until stdin closes
            nursery.cancel_scope.cancel()

    raise_fd_limit(8192)
    trio.run(main)


# --- rillet serve -------------------------------------------------------------------------------


def serve_rillet(
    upstream_port: int, streams: int, workers: int = 1, redis_url: str | None = None
) -> None:
    """`rillet serve`'s server for the upstream, its limits sized for `streams` at once, in
    `workers` processes (more than one: sharing their runs through `redis_url`, as workers
    must). Prints `port P`; serves until stdin closes."""
    import trio
    from rillet.providers import OpenAIChatDialect, Provider
    from rillet.transports.server import Limits, ServerConfig, serve

    provider = Provider(OpenAIChatDialect(), f"http://127.0.0.1:{upstream_port}/v1", "bench-model")
    room = streams + 16
    config = ServerConfig(
        provider=provider,
        port=0,
        workers=workers,
        redis_url=redis_url,
        limits=Limits(
            max_streams=room,
            max_queued=room,
            max_runs_per_client=room,
            max_active_runs=2 * room,
            max_connections=2 * room + 64,
            max_subscribers_per_client=room,
        ),
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve, config)
            print(f"port {url.rsplit(':', 1)[1]}", flush=True)
            await trio.to_thread.run_sync(sys.stdin.buffer.read)
            nursery.cancel_scope.cancel()

    raise_fd_limit(2 * room + 512)
    import logging

    logging.disable(logging.INFO)  # a log line per request is not what is measured
    trio.run(main)


def litellm_command(upstream_port: int, port: int, config: Path) -> list[str] | None:
    """LiteLLM's proxy from the peers' venv for the upstream, or None when it is not there."""
    binary = _PEERS_BIN / "litellm"
    if not binary.exists():
        return None
    config.write_text(
        "model_list:\n"
        "  - model_name: bench-model\n"
        "    litellm_params:\n"
        "      model: openai/m\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "general_settings:\n"
        "  master_key: sk-bench-master-key-0123456789\n"
    )
    return [str(binary), "--config", str(config), "--port", str(port), "--host", "127.0.0.1"]


# --- the load client ----------------------------------------------------------------------------


def run_client(
    port: int, streams: int, stagger: float, chunks: int, timeout: float
) -> dict[str, Any]:
    """Open `streams` streamed completions against `port`, spread over `stagger` seconds; read
    them all on one epoll thread. Returns the figures (times in seconds)."""
    raise_fd_limit(streams + 256)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\n"
        b"authorization: Bearer sk-bench-master-key-0123456789\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(_REQUEST_BODY), _REQUEST_BODY)
    )
    last_token = b"w%d " % (chunks - 1)
    poller = select.epoll()
    socks: dict[int, socket.socket] = {}
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    previous: dict[int, float] = {}
    tails: dict[int, bytes] = {}
    complete: dict[int, bool] = {}
    status_ok: dict[int, bool] = {}
    gaps: list[float] = []
    realtime = time.time_ns() - time.monotonic_ns()
    buffer = bytearray(262144)
    view = memoryview(buffer)
    start = time.monotonic()
    opened = 0
    ended = 0
    deadline = start + stagger + timeout
    cpu = time.process_time()
    while ended < streams and time.monotonic() < deadline:
        now = time.monotonic()
        while opened < streams and now >= start + stagger * opened / streams:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS is not None:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                sock.connect(("127.0.0.1", port))
                sock.sendall(request)
            except OSError:
                sock.close()
                opened += 1
                ended += 1
                continue
            sock.setblocking(False)
            fd = sock.fileno()
            socks[fd] = sock
            sent[fd] = time.monotonic()
            tails[fd] = b""
            complete[fd] = False
            poller.register(fd, select.EPOLLIN)
            opened += 1
        wait = 0.001 if opened < streams else 0.5
        for fd, _ in poller.poll(wait):
            sock = socks[fd]
            try:
                size, ancillary, _, _ = sock.recvmsg_into([buffer], 64)
            except BlockingIOError:
                continue
            except OSError:
                size, ancillary = 0, []
            stamp = kernel_arrival(ancillary) if ancillary else 0
            at = (stamp - realtime) / 1e9 if stamp else time.monotonic()
            data = tails[fd] + bytes(view[:size])
            if fd not in status_ok and b"\r\n" in data:
                status_ok[fd] = data.startswith(b"HTTP/1.1 200")
            if _TEXT in data:
                if fd not in first:
                    first[fd] = at - sent[fd]
                elif fd in previous:
                    gaps.append(at - previous[fd])
                previous[fd] = at
            if last_token in data:
                complete[fd] = True
            tails[fd] = data[-16:]
            if not size or b"[DONE]" in data:
                poller.unregister(fd)
                sock.close()
                ended += 1
                if not size and not complete[fd]:
                    complete[fd] = False
    for sock in socks.values():
        if sock.fileno() >= 0:
            sock.close()
    ttft = sorted(first.values())
    gaps.sort()
    return {
        "streams": streams,
        "complete": sum(complete.values()),
        "refused": sum(1 for ok in status_ok.values() if not ok),
        "ttft_p50": rank(ttft, 0.5),
        "ttft_p99": rank(ttft, 0.99),
        "gap_p50": rank(gaps, 0.5),
        "gap_p99": rank(gaps, 0.99),
        "client_cpu": time.process_time() - cpu,
        "seconds": time.monotonic() - start,
    }


# --- the orchestration ----------------------------------------------------------------------------


def _spawn(args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        args, cwd=_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("port "):
        proc.kill()
        raise RuntimeError(f"{args[3] if len(args) > 3 else args[0]} did not start")
    return proc, int(line.split()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a process started here: close its stdin (it stops when that closes), kill it if
    it does not within 5 s, and close its pipes."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def spawn_upstream(chunks: int, rate: float) -> tuple[subprocess.Popen[bytes], int]:
    """The paced upstream in a process of its own, and its port; `stop` ends it."""
    me = [sys.executable, "-m", "bench.gateway"]
    return _spawn([*me, "upstream", "--chunks", str(chunks), "--rate", str(rate)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _window(
    gateway: str, upstream: tuple[subprocess.Popen[bytes], int], k: int, spec: dict[str, Any]
) -> dict[str, Any]:
    """One window: a fresh gateway process (none for `direct`), K streams through it."""
    with contextlib.ExitStack() as stack:
        return _window_in(stack, gateway, upstream, k, spec)


def _window_in(
    stack: contextlib.ExitStack,
    gateway: str,
    upstream: tuple[subprocess.Popen[bytes], int],
    k: int,
    spec: dict[str, Any],
) -> dict[str, Any]:
    me = [sys.executable, "-m", "bench.gateway"]
    upstream_proc, upstream_port = upstream
    proc: subprocess.Popen[bytes] | None = None
    port = upstream_port
    if gateway == "passthrough":
        proc, port = _spawn([*me, "passthrough", "--upstream", str(upstream_port)])
    elif gateway == "rillet":
        proc, port = _spawn([*me, "rillet", "--upstream", str(upstream_port), "--k", str(k)])
    elif gateway == "rillet-w2":  # its Redis is ours, outside the gateway's process tree
        if shutil.which("redis-server") is None:
            return {"error": "not available (two workers need redis-server: make deps)"}
        redis_url = stack.enter_context(local_redis())
        args = ["--upstream", str(upstream_port), "--k", str(k), "--workers", "2"]
        proc, port = _spawn([*me, "rillet", *args, "--redis", redis_url])
    elif gateway == "litellm":
        port = _free_port()
        cmd = litellm_command(upstream_port, port, Path(f"/tmp/rillet-bench-litellm-{port}.yaml"))
        if cmd is None:
            return {"error": "not available (bench/.venv-peers has no litellm proxy)"}
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.PIPE,
        )
        if not _wait_for(port, 90):
            proc.kill()
            proc.wait()
            return {"error": "LiteLLM's proxy did not start in 90 s"}
    try:
        pids = process_tree(proc.pid) if proc is not None else []
        server_cpu = sum(process_cpu(p, children=True) for p in pids)
        upstream_cpu = process_cpu(upstream_proc.pid)
        figures = run_client(port, k, spec["stagger"], spec["chunks"], spec["timeout"])
        pids = process_tree(proc.pid) if proc is not None else []
        figures["server_cpu"] = sum(process_cpu(p, children=True) for p in pids) - server_cpu
        figures["upstream_cpu"] = process_cpu(upstream_proc.pid) - upstream_cpu
        figures["peak_rss"] = peak_rss(proc.pid) if proc is not None else 0
        sent_chunks = k * (spec["chunks"] + 3)
        figures["cpu_us_per_chunk"] = figures["server_cpu"] / sent_chunks * 1e6
        return figures
    finally:
        if proc is not None:
            stop(proc)


def run_gateway(
    ks: list[int] | None = None,
    repeats: int = 3,
    gateways: tuple[str, ...] = GATEWAYS,
    chunks: int = 200,
    rate: float = 50.0,
    stagger: float = 0.5,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the windows, interleaved, and return the medians per gateway and K.

    Args:
        ks: the concurrent streams of each window (default 10, 100, 300, 500, 1000).
        repeats: how many times every window runs; the medians are reported.
        gateways: which of `GATEWAYS` to run ("direct" is always run: the baseline).
        chunks: text fragments per answer.
        rate: fragments per second per answer.
        stagger: seconds over which each window's streams start.
        progress: called with a line of progress.
    """
    ks = ks or [10, 100, 300, 500, 1000]
    order = ["direct", *[g for g in gateways if g != "direct"]]
    spec = {"chunks": chunks, "stagger": stagger, "timeout": chunks / rate + 60}
    upstream = spawn_upstream(chunks, rate)
    raw: dict[tuple[str, int], list[dict[str, Any]]] = {}
    busy0 = machine_busy()
    t0 = time.monotonic()
    try:
        for repeat in range(repeats):
            fallen: dict[str, int] = {}  # a gateway that fell behind at K skips larger Ks
            for k in ks:
                # a different order each repeat, so no gateway always runs after another
                turned = order[repeat % len(order) :] + order[: repeat % len(order)]
                for gateway in turned:
                    if gateway in fallen:
                        window = {"error": f"fell behind at K={fallen[gateway]}"}
                    else:
                        if progress:
                            progress(f"gateway: repeat {repeat + 1}/{repeats}, K={k}, {gateway}")
                        window = _window(gateway, upstream, k, spec)
                        if _fell_behind(window):
                            fallen[gateway] = k
                    raw.setdefault((gateway, k), []).append(window)
    finally:
        stop(upstream[0])
    load = (machine_busy() - busy0) / (time.monotonic() - t0)
    rows = [_median_row(gateway, k, raw[(gateway, k)], raw[("direct", k)]) for (gateway, k) in raw]
    return {
        "chunks": chunks,
        "rate": rate,
        "repeats": repeats,
        "seconds": time.monotonic() - t0,
        "machine_load": load,
        "rows": rows,
        "largest_k": largest_k(rows),
    }


_FELL_BEHIND_S = 5.0  # a p99 time to first token past this: the gateway no longer keeps up


def _fell_behind(window: dict[str, Any]) -> bool:
    """Whether a window shows its gateway past what it carries (its p99 first token seconds
    late, or streams lost): larger Ks would only take minutes to say the same."""
    if "error" in window:
        return False
    return bool(window["ttft_p99"] > _FELL_BEHIND_S or window["complete"] < window["streams"])


def _median_row(
    gateway: str, k: int, windows: list[dict[str, Any]], direct: list[dict[str, Any]]
) -> dict[str, Any]:
    good = [w for w in windows if "error" not in w]
    if not good:
        return {"gateway": gateway, "k": k, "error": windows[0]["error"]}

    def med(key: str, rows: list[dict[str, Any]] = good) -> float:
        values = [r[key] for r in rows if not math.isnan(r[key])]
        return statistics.median(values) if values else math.nan

    base = [w for w in direct if "error" not in w]
    row = {
        "gateway": gateway,
        "k": k,
        "cpu_us_per_chunk": med("cpu_us_per_chunk"),
        "server_cores": med("server_cpu") / med("seconds"),
        "ttft_p50_ms": med("ttft_p50") * 1e3,
        "ttft_p99_ms": med("ttft_p99") * 1e3,
        "gap_p99_ms": med("gap_p99") * 1e3,
        "added_ttft_p50_ms": (med("ttft_p50") - med("ttft_p50", base)) * 1e3,
        "added_ttft_p99_ms": (med("ttft_p99") - med("ttft_p99", base)) * 1e3,
        "added_gap_p99_ms": (med("gap_p99") - med("gap_p99", base)) * 1e3,
        "peak_rss_mb": med("peak_rss") / 2**20,
        "incomplete": max(w["streams"] - w["complete"] for w in good),
        "refused": max(w["refused"] for w in good),
        "upstream_cores": med("upstream_cpu") / med("seconds"),
        "client_cores": med("client_cpu") / med("seconds"),
    }
    return row


def largest_k(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Per gateway, the largest K whose added p99 TTFT stayed under 50 ms with every stream
    complete."""
    best: dict[str, int | None] = {}
    for row in sorted(rows, key=lambda r: r["k"]):
        if row["gateway"] == "direct" or "error" in row:
            continue
        best.setdefault(row["gateway"], None)
        if row["added_ttft_p99_ms"] < 50 and not row["incomplete"]:
            best[row["gateway"]] = row["k"]
    return best


def gateway_markdown(section: dict[str, Any]) -> str:
    """The section's table, one row per gateway and K, narrow enough for a terminal."""
    lines = [
        "## Gateway",
        "",
        f"`python -m bench gateway`: {section['chunks']} fragments per answer at "
        f"{section['rate']:.0f}/s, medians of {section['repeats']}; machine load "
        f"{section['machine_load']:.2f} cores of {os.cpu_count()}.",
        "",
        "| gateway | K | µs/chunk | +TTFT p50/p99 ms | +gap p99 ms | RSS MB | bad "
        "| up/client cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(section["rows"], key=lambda r: (r["k"], GATEWAYS.index(r["gateway"]))):
        if "error" in row:
            lines.append(f"| {row['gateway']} | {row['k']} | {row['error']} | | | | | |")
            continue
        if row["gateway"] == "direct":
            ttft = f"({row['ttft_p50_ms']:.1f} / {row['ttft_p99_ms']:.1f})"
            gap = f"({row['gap_p99_ms']:.1f})"
        else:
            ttft = f"{row['added_ttft_p50_ms']:+.1f} / {row['added_ttft_p99_ms']:+.1f}"
            gap = f"{row['added_gap_p99_ms']:+.1f}"
        cpu = "" if row["gateway"] == "direct" else f"{row['cpu_us_per_chunk']:.0f}"
        rss = "" if row["gateway"] == "direct" else f"{row['peak_rss_mb']:.0f}"
        bad = row["incomplete"] + row["refused"]
        cores = f"{row['upstream_cores']:.2f} / {row['client_cores']:.2f}"
        lines.append(
            f"| {row['gateway']} | {row['k']} | {cpu} | {ttft} | {gap} | {rss} | {bad} | {cores} |"
        )
    largest = ", ".join(f"{g} {k if k else '-'}" for g, k in section["largest_k"].items())
    lines += ["", f"Largest K with added p99 TTFT under 50 ms: {largest}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """The processes' entry points, and the table alone."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway")
    parser.add_argument(
        "role", nargs="?", default="table", choices=("table", "upstream", "passthrough", "rillet")
    )
    parser.add_argument("--upstream", type=int, help="the upstream's port")
    parser.add_argument("--k", type=int, default=100, help="rillet: streams at once to allow")
    parser.add_argument("--workers", type=int, default=1, help="rillet: server processes")
    parser.add_argument("--redis", help="rillet: the Redis several workers share")
    parser.add_argument("--chunks", type=int, default=200, help="fragments per answer")
    parser.add_argument("--rate", type=float, default=50.0, help="fragments per second")
    parser.add_argument(
        "--ks", type=lambda s: [int(x) for x in s.split(",")], help="table: streams per window"
    )
    parser.add_argument("--repeats", type=int, default=3, help="table: repeats")
    parser.add_argument(
        "--gateways", default=",".join(GATEWAYS), help="table: comma-separated gateways"
    )
    args = parser.parse_args(argv)
    if args.role == "upstream":
        serve_upstream(args.chunks, args.rate)
    elif args.role == "passthrough":
        serve_passthrough(args.upstream)
    elif args.role == "rillet":
        serve_rillet(args.upstream, args.k, args.workers, args.redis)
    else:
        section = run_gateway(
            args.ks,
            args.repeats,
            tuple(args.gateways.split(",")),
            args.chunks,
            args.rate,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(gateway_markdown(section))
        print(json.dumps(section))


if __name__ == "__main__":
    main()
