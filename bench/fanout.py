"""Fan-out: one run's events delivered live to many WebSocket and SSE subscribers.

`python -m bench.fanout [--ws N] [--sse N] [--events N] [--rate R]` prints a Markdown table;
`run_fanout(...)` returns the figures.

Set-up, on loopback only, three processes: a provider (`--provider`: an OpenAI Chat stream of
`events` text fragments, one every `1/rate` seconds on a fixed schedule, so its pace does not
depend on the server's load), rillet's server (this process), and the subscribers (`--client`:
plain sockets and epoll, no trio, so their own overhead stays small). A run is started over
HTTP; the client opens `n_ws` WebSocket and `n_sse` SSE subscriptions to it, says when all are
connected, and only then is the provider told to start. Each subscriber reads every event to
`run.done`, and resumes (`?after=` / `Last-Event-ID`) if the server drops it; it gives up
`events/rate + 120` seconds after the start (what it has not read by then counts as missing).

What is measured, and how:

- delay: from the moment the server's hub appended an event (`time.monotonic()` in the server
  process, recorded by a `Hub` subclass) to the moment a subscriber's `recv` returned the bytes
  that completed it (`time.monotonic()` in the client process). Both processes read the same
  system-wide monotonic clock, so the difference is the real end-to-end delay: the server's
  wake-up and write, the kernel, and the client's read. Only events appended after every
  subscriber was connected count (no replays).
- appended/s: the events the server took in from the provider per second (the provider sends
  `rate`): a server busy fanning out reads its provider more slowly.
- deliveries/s: (subscriber, event) pairs received live, over the time from the first of those
  events' append to the last receipt; the offered load is subscribers x rate.
- RSS per subscriber: the server process's peak RSS during the first phase (sampled every
  0.2 s) less its RSS before any subscriber connected, divided by the subscribers. Kernel
  socket buffers are not in RSS.
- the slow subscriber: a second phase repeats the first with one more SSE subscriber that reads
  one event per `10/rate` seconds (10x slower than the stream) through a 4 KiB receive buffer;
  the others' p99 is compared with the first phase's.
- CPU: user+system seconds of the server and client processes from the provider's start to the
  last subscriber's end, as a share of one core.
- server write delay: from the append to the moment the server wrote the event to a
  subscriber's socket (`time.monotonic()`, server side), for the deliveries the hub pushed
  straight to a connection (the share pushed is given; the rest went through their own task),
  counted in 0.1 ms bins so that recording them adds nothing to the RSS measured. The
  end-to-end delay less this is the kernel's and the client's share.
- loop lag: how late a task sleeping 10 ms at a time in the server's trio loop wakes, while the
  run's live events are appended (what every other task of the server waits).

The machine's fd limit bounds the subscribers: the soft limit is raised to the hard one; when
even that is too low, the subscriber counts are scaled down and the table says so.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio
from rillet._core._dialect import Provider
from rillet._core._policy import Policy
from rillet._hub._hub import Entry, Hub, Subscription
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, serve

from .fanout_load import SPARE_FDS, cpu_seconds, provide, raise_fd_limit, subscribe

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FanoutResult", "PhaseResult", "main", "run_fanout"]

_ROOT = Path(__file__).resolve().parent.parent


# --- results ----------------------------------------------------------------------------------


@attrs.frozen
class PhaseResult:
    """One phase: every subscriber following one run to its end."""

    label: str
    n_ws: int
    n_sse: int
    events: int  # run events appended while every subscriber was connected
    deliveries: int  # (subscriber, event) pairs received live
    missing: int  # pairs never received
    duplicates: int  # an event received twice by one subscriber
    resumed: int  # reconnections after the server dropped a subscriber
    unfinished: int  # subscribers that did not reach run.done
    seconds: float
    stream_rate: float  # events/s the server actually appended (the provider sends `rate`)
    deliveries_per_s: float
    offered_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    ws_p99_ms: float | None
    sse_p99_ms: float | None
    server_cpu: float  # share of one core
    client_cpu: float
    rss_per_subscriber_kib: float
    slow_received: int | None  # events the slow subscriber read, if there was one
    write_p50_ms: float = math.nan  # append to the server's write, pushed deliveries
    write_p99_ms: float = math.nan
    pushed: float = 0.0  # share of the live deliveries the hub pushed
    lag_p99_ms: float = math.nan  # the server loop's lateness
    lag_max_ms: float = math.nan


@attrs.frozen
class FanoutResult:
    """Both phases, and what limited the run."""

    phases: list[PhaseResult]
    rate: float
    fd_limit: int
    note: str

    def markdown(self) -> str:
        """The figures as a Markdown table with its notes."""
        lines = [
            "| phase | subscribers (WS + SSE) | events | appended/s | deliveries/s (offered) "
            "| p50 ms | p99 ms | max ms | WS p99 | SSE p99 | missing / dup / resumed "
            "| server CPU | client CPU | server write p50 / p99 ms (pushed) "
            "| loop lag p99 / max ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in self.phases:
            lines.append(
                f"| {p.label} | {p.n_ws + p.n_sse:,} ({p.n_ws:,} + {p.n_sse:,}) | {p.events} "
                f"| {p.stream_rate:.1f} | {p.deliveries_per_s:,.0f} ({p.offered_per_s:,.0f}) "
                f"| {p.p50_ms:.1f} | {p.p99_ms:.1f} | {p.max_ms:.1f} "
                f"| {_ms(p.ws_p99_ms)} | {_ms(p.sse_p99_ms)} "
                f"| {p.missing} / {p.duplicates} / {p.resumed} "
                f"| {p.server_cpu:.0%} | {p.client_cpu:.0%} "
                f"| {p.write_p50_ms:.1f} / {p.write_p99_ms:.1f} ({p.pushed:.0%}) "
                f"| {p.lag_p99_ms:.1f} / {p.lag_max_ms:.1f} |"
            )
        first = self.phases[0]
        lines += [
            "",
            f"The provider streams {self.rate:g} events/s (appended/s: what the server took in). "
            f"Peak server RSS per subscriber: "
            f"{first.rss_per_subscriber_kib:.1f} KiB. Delay = hub append (server) to `recv` "
            "(client), on one monotonic clock.",
        ]
        if len(self.phases) > 1:
            slow = self.phases[1]
            change = slow.p99_ms - first.p99_ms
            lines.append(
                f"One subscriber 10x slower than the stream read {slow.slow_received} events; "
                f"the others' p99 moved by {change:+.1f} ms ({first.p99_ms:.1f} -> "
                f"{slow.p99_ms:.1f})."
            )
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# --- the server side ----------------------------------------------------------------------------


@attrs.define(eq=False)
class _TimedHub(Hub):
    """A hub that notes when each seq was appended (`time.monotonic()`, before the wake-up)."""

    appended_at: dict[int, float] = attrs.field(factory=dict)

    writes: array[int] = attrs.field(factory=lambda: array("q", [0]) * (_WRITE_BINS + 1))

    def append(self, run_id: str, events: Any) -> None:
        now = time.monotonic()
        for event in events:
            self.appended_at[event.seq] = now
        super().append(run_id, events)

    def subscribe(self, run_id: str, after: int = 0, *, buffer: int | None = None) -> Subscription:
        sub = super().subscribe(run_id, after, buffer=buffer)
        if _PUSH is not None:  # a hub that pushes
            sub.__class__ = _TimedSubscription  # the same layout: only `push` is wrapped
            _TimedSubscription.record = (self.appended_at, self.writes)  # one hub at a time
        return sub


class _TimedSubscription(Subscription):
    """A subscription whose `push` writer notes when each batch it took was written."""

    __slots__ = ()
    record: tuple[dict[int, float], array[int]]  # set by the hub: append times, write delays

    @property
    def push(self) -> Callable[[list[Entry]], bool] | None:
        return _PUSH.__get__(self)  # type: ignore[no-any-return]

    @push.setter
    def push(self, writer: Callable[[list[Entry]], bool] | None) -> None:
        if writer is not None:
            writer = functools.partial(_timed_push, writer, *_TimedSubscription.record)
        _PUSH.__set__(self, writer)


_PUSH: Any = Subscription.__dict__.get("push")  # the slot the property above stands in front of


_WRITE_BIN = 0.0001  # write delays are counted in bins of 0.1 ms (fixed memory: RSS is measured)
_WRITE_BINS = 100_000  # up to 10 s; the last bin holds the longer ones


def _timed_push(
    writer: Callable[[list[Entry]], bool],
    appended_at: dict[int, float],
    writes: array[int],
    batch: list[Entry],
) -> bool:
    taken = writer(batch)
    if taken:
        now = time.monotonic()
        for entry in batch:
            at = appended_at.get(entry.seq)
            if at is not None:
                writes[min(int((now - at) / _WRITE_BIN), _WRITE_BINS)] += 1
    return taken


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _phase(
    label: str, n_ws: int, n_sse: int, events: int, rate: float, slow: bool
) -> PhaseResult:
    provider_spec = json.dumps({"events": events, "rate": rate})
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.fanout", "--provider", provider_spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=_ROOT,
    )
    try:
        assert process.stdout is not None
        assert process.stdin is not None
        with trio.fail_after(30):
            url = (await _line(process.stdout)).decode().strip()
        provider = Provider(OpenAIChatDialect(), f"{url}/v1", "bench-model")
        return await _serve_phase(label, n_ws, n_sse, events, rate, slow, provider, process.stdin)
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def _line(stream: trio.abc.ReceiveStream) -> bytes:
    """One line from a pipe (the other side writes nothing more until told to)."""
    line = b""
    while not line.endswith(b"\n"):
        data = await stream.receive_some(4096)
        if not data:
            raise RuntimeError("the process ended before saying anything")
        line += data
    return line


async def _serve_phase(
    label: str,
    n_ws: int,
    n_sse: int,
    events: int,
    rate: float,
    slow: bool,
    provider: Provider,
    go: trio.abc.SendStream,
) -> PhaseResult:
    n = n_ws + n_sse + (1 if slow else 0)
    hub = _TimedHub(max_subscribers_per_run=n + 16)
    limits = Limits(max_subscribers_per_run=n + 16, max_subscribers_per_client=n + 16)
    async with trio.open_nursery() as nursery:
        config = ServerConfig(provider=provider, port=0, limits=limits, policy=Policy())
        url = await nursery.start(functools.partial(serve, config, hub=hub))
        baseline = _rss_kib()
        peak = [baseline]
        nursery.start_soon(_sample_rss, peak)
        async with httpx.AsyncClient(base_url=url) as client:
            started = await client.post("/v1/runs", json={"prompt": "fan out"})
        run = started.json()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "times.bin"
            spec = {
                "host": host,
                "port": int(port),
                "run_id": run["run_id"],
                "token": run["token"],
                "n_ws": n_ws,
                "n_sse": n_sse,
                "slow": slow,
                "rate": rate,
                "seqs": events + 64,
                "timeout": events / rate + 120,
                "out": str(out),
            }
            client_process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "bench.fanout", "--client"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=_ROOT,
            )
            try:
                assert client_process.stdin is not None
                assert client_process.stdout is not None
                await client_process.stdin.send_all(json.dumps(spec).encode())
                await client_process.stdin.aclose()
                await _line(client_process.stdout)  # every subscriber is connected
                cpu_before = cpu_seconds()
                wall_before = time.monotonic()
                lags: list[tuple[float, float]] = []
                await go.send_all(b"go\n")  # the provider starts streaming
                report_bytes = bytearray()
                async with trio.open_nursery() as ticking:
                    ticking.start_soon(_tick, lags)
                    while data := await client_process.stdout.receive_some(65536):
                        report_bytes += data
                    ticking.cancel_scope.cancel()
                wall = time.monotonic() - wall_before
                server_cpu = (cpu_seconds() - cpu_before) / wall
                if await client_process.wait() != 0:
                    raise RuntimeError("the client process failed")
            finally:
                client_process.kill()
            report = json.loads(report_bytes)
            times = array("d")
            times.frombytes(out.read_bytes())
        nursery.cancel_scope.cancel()
    rss_per_subscriber = (peak[0] - baseline) / max(1, n)
    result = _figures(
        label, rate, hub.appended_at, report, times, spec, server_cpu, wall, rss_per_subscriber
    )
    pushed = sum(hub.writes)
    live = [at for at in hub.appended_at.values() if at >= report["ready"]]
    lagged = sorted(lag for at, lag in lags if live and min(live) <= at <= max(live))
    return attrs.evolve(
        result,
        write_p50_ms=_binned_rank(hub.writes, 0.50),
        write_p99_ms=_binned_rank(hub.writes, 0.99),
        pushed=pushed / result.deliveries if result.deliveries else 0.0,
        lag_p99_ms=_rank(lagged, 0.99),
        lag_max_ms=lagged[-1] * 1000 if lagged else math.nan,
    )


async def _tick(lags: list[tuple[float, float]], period: float = 0.010) -> None:
    """Note when, and how late, each 10 ms sleep ends (the server loop's lag)."""
    while True:
        start = time.monotonic()
        await trio.sleep(period)
        end = time.monotonic()
        lags.append((end, max(0.0, end - start - period)))


def _binned_rank(counts: array[int], p: float) -> float:
    """The `p` quantile of binned write delays, in ms (the top of its bin)."""
    total = sum(counts)
    if not total:
        return math.nan
    rank = max(1, math.ceil(p * total))
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return (index + 1) * _WRITE_BIN * 1000
    return math.nan


async def _sample_rss(peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], _rss_kib())
        await trio.sleep(0.2)


def _figures(
    label: str,
    rate: float,
    appended_at: dict[int, float],
    report: dict[str, Any],
    times: array[float],
    spec: dict[str, Any],
    server_cpu: float,
    wall: float,
    rss_per_subscriber: float,
) -> PhaseResult:
    ready = report["ready"]
    live = sorted((seq, at) for seq, at in appended_at.items() if at >= ready)
    width = spec["seqs"]
    delays: dict[str, list[float]] = {"ws": [], "sse": []}
    missing = 0
    last_receipt = 0.0
    for index, client in enumerate(report["clients"]):
        row = times[index * width : (index + 1) * width]
        out = delays[client["kind"]]
        for seq, at in live:
            got = row[seq] if seq < width else math.nan
            if math.isnan(got):
                missing += 1
                continue
            out.append(got - at)
            last_receipt = max(last_receipt, got)
    every = sorted(delays["ws"] + delays["sse"])
    seconds = last_receipt - live[0][1] if live and every else 0.0
    n_ws, n_sse = spec["n_ws"], spec["n_sse"]
    n = n_ws + n_sse
    return PhaseResult(
        label=label,
        n_ws=n_ws,
        n_sse=n_sse,
        events=len(live),
        deliveries=len(every),
        missing=missing,
        duplicates=sum(c["duplicates"] for c in report["clients"]),
        resumed=sum(c["resumes"] for c in report["clients"]),
        unfinished=sum(not c["done"] for c in report["clients"]),
        seconds=seconds,
        stream_rate=(len(live) - 1) / (live[-1][1] - live[0][1]) if len(live) > 1 else 0.0,
        deliveries_per_s=len(every) / seconds if seconds else 0.0,
        offered_per_s=n * rate,
        p50_ms=_rank(every, 0.50),
        p99_ms=_rank(every, 0.99),
        max_ms=every[-1] * 1000 if every else math.nan,
        ws_p99_ms=_rank(sorted(delays["ws"]), 0.99) if delays["ws"] else None,
        sse_p99_ms=_rank(sorted(delays["sse"]), 0.99) if delays["sse"] else None,
        server_cpu=server_cpu,
        client_cpu=report["cpu"] / wall,
        rss_per_subscriber_kib=rss_per_subscriber,
        slow_received=report["slow_received"],
    )


def _rank(ordered: list[float], p: float) -> float:
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)] * 1000


def run_fanout(
    n_ws: int = 1000,
    n_sse: int = 1000,
    events: int = 500,
    rate: float = 50.0,
    *,
    slow_phase: bool = True,
    progress: Callable[[str], None] | None = None,
) -> FanoutResult:
    """Run the fan-out benchmark: a first phase with `n_ws` + `n_sse` subscribers, then (with
    `slow_phase`) the same again plus one subscriber 10x slower than the stream."""
    wanted = n_ws + n_sse + 1 + SPARE_FDS
    limit = raise_fd_limit(wanted)
    note = ""
    if limit < wanted:
        scale = (limit - 1 - SPARE_FDS) / (n_ws + n_sse)
        scaled = max(1, int(n_ws * scale)), max(1, int(n_sse * scale))
        note = (
            f"Scaled down from {n_ws} + {n_sse} subscribers to {scaled[0]} + {scaled[1]}: "
            f"the fd limit is {limit} (hard)."
        )
        n_ws, n_sse = scaled

    def say(line: str) -> None:
        if progress is not None:
            progress(line)

    phases = []
    say(f"fan-out: {n_ws} WS + {n_sse} SSE subscribers, {events} events at {rate:g}/s")
    phases.append(trio.run(_phase, "all at stream pace", n_ws, n_sse, events, rate, False))
    if slow_phase:
        say("fan-out: again, with one subscriber 10x slower than the stream")
        phases.append(
            trio.run(_phase, "plus one 10x-slow subscriber", n_ws, n_sse, events, rate, True)
        )
    return FanoutResult(phases=phases, rate=rate, fd_limit=limit, note=note)


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its Markdown table (or, with --client, be the subscribers)."""
    parser = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__)
    parser.add_argument("--ws", type=int, default=1000, help="WebSocket subscribers")
    parser.add_argument("--sse", type=int, default=1000, help="SSE subscribers")
    parser.add_argument("--events", type=int, default=500, help="text fragments in the run")
    parser.add_argument("--rate", type=float, default=50.0, help="fragments per second")
    parser.add_argument("--no-slow", action="store_true", help="skip the slow-subscriber phase")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.provider:
        trio.run(provide, json.loads(args.provider))
        return
    if args.client:
        json.dump(subscribe(json.load(sys.stdin)), sys.stdout)
        return
    result = run_fanout(
        args.ws,
        args.sse,
        args.events,
        args.rate,
        slow_phase=not args.no_slow,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(result.markdown())


if __name__ == "__main__":
    main()
