"""The Redis run log under load: many concurrent runs, each followed by subscribers spread over
two hub instances (two servers) sharing one Redis.

`python -m bench.redis_hub` starts a `redis-server` of its own on a free loopback port (no
persistence; or pass `--redis URL`), then per run: a model "generates" the run's events at a
fixed rate, and a sink appends whatever has accumulated whenever its previous append is done
(as a turn's sink actor does: batches grow when the log is slower than the model), through one
hub (runs alternate between the two); the run's subscribers, half on each hub, read them all.
Two phases, each run generating at:

- a high rate (`fast` events/s per run, far more than Redis and the hubs take in one process):
  the throughput, appends/s (events written to Redis) and deliveries/s (events handed to
  subscribers) over the phase's wall time;
- an LLM's rate (`rate` events/s per run): the delay at a realistic load.

The delay is from the start of the append that carried an event to its delivery to a
subscriber.

Prints a Markdown table with the Redis version. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import math
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import trio
from rillet._core._runevents import AnswerDelta, RunDone, RunEvent
from rillet._hub._redis import RedisHub, open_redis_hub
from rillet._turn._turn import SinkBatch

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from rillet._hub._hub import Subscription
    from rillet._turn._turn import Sink

__all__ = ["PhaseResult", "RedisBenchResult", "run_redis_bench"]


@attrs.frozen
class PhaseResult:
    """One phase's figures (delays in milliseconds)."""

    name: str
    seconds: float
    appended: int
    delivered: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def appends_per_s(self) -> float:
        return self.appended / self.seconds

    @property
    def deliveries_per_s(self) -> float:
        return self.delivered / self.seconds


@attrs.frozen
class RedisBenchResult:
    """The benchmark's setup and phases."""

    redis_version: str
    runs: int
    subscribers: int
    events: int
    phases: tuple[PhaseResult, ...]

    def table(self) -> str:
        """The figures as a Markdown table, with how they were measured."""
        lines = [
            "## Redis run log: fan-out over two hubs",
            "",
            f"`python -m bench.redis_hub` — Redis {self.redis_version}, Python "
            f"{platform.python_version()}, {platform.machine()}; {self.runs} concurrent runs of "
            f"{self.events} events each, {self.subscribers} subscribers per run split over two "
            "hub instances in one process (one tail per run per hub); appends coalesce what "
            "accumulated meanwhile; delay = append call to a subscriber's delivery.",
            "",
            "| phase | appends/s | deliveries/s | p50 ms | p99 ms | max ms | seconds |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p in self.phases:
            lines.append(
                f"| {p.name} | {p.appends_per_s:,.0f} | {p.deliveries_per_s:,.0f} | "
                f"{p.p50_ms:.2f} | {p.p99_ms:.2f} | {p.max_ms:.2f} | {p.seconds:.2f} |"
            )
        return "\n".join(lines)


def _rank(ordered: Sequence[float], p: float) -> float:
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)] * 1000


def _events(run_id: str, count: int) -> list[RunEvent]:
    text: list[RunEvent] = [
        AnswerDelta(run_id=run_id, seq=n, elapsed_ms=n, delta=f"token {n} ")
        for n in range(1, count)
    ]
    last = RunDone(
        run_id=run_id,
        seq=count,
        elapsed_ms=count,
        status="completed",
        code="completed",
        attempts=1,
        requests=1,
        retryable=False,
    )
    return [*text, last]


async def _phase(
    name: str,
    hubs: tuple[RedisHub, RedisHub],
    *,
    runs: int,
    subscribers: int,
    events: int,
    rate: float,
) -> PhaseResult:
    """One phase: every run produced and read to its `run.done`."""
    appended_at: dict[str, list[float]] = {}
    delays: list[float] = []
    delivered = 0
    sinks: list[tuple[str, Sink, list[RunEvent]]] = []
    subs: list[tuple[str, Subscription]] = []
    for i in range(runs):
        run_id = secrets.token_hex(12)
        sinks.append((run_id, await hubs[i % 2].open_run(run_id), _events(run_id, events)))
        appended_at[run_id] = [0.0] * (events + 1)
        for k in range(subscribers):
            subs.append((run_id, await hubs[k % 2].follow(run_id, buffer=events + 1)))

    async def produce(offset: float, run_id: str, sink: Sink, run: list[RunEvent]) -> None:
        """The run's model generates an event every 1/rate s (runs are spread over that
        interval by `offset`); each append takes every event generated by then."""
        stamps = appended_at[run_id]
        start = trio.current_time() + offset / rate
        sent = 0
        while sent < len(run):
            await trio.sleep_until(start + (sent + 1) / rate)
            generated = min(len(run), int((trio.current_time() - start) * rate))
            chunk = run[sent:generated]
            now = trio.current_time()
            for event in chunk:
                stamps[event.seq] = now
            await sink.deliver(SinkBatch(chunk, ()))
            sent += len(chunk)

    async def consume(run_id: str, sub: Subscription) -> None:
        nonlocal delivered
        stamps = appended_at[run_id]
        with sub:
            while batch_ := await sub.next_batch():
                now = trio.current_time()
                delivered += len(batch_)
                delays.extend(now - stamps[entry.seq] for entry in batch_)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for run_id, sub in subs:
            nursery.start_soon(consume, run_id, sub)
        for i, (run_id, sink, run) in enumerate(sinks):
            nursery.start_soon(produce, i / runs, run_id, sink, run)
    seconds = time.perf_counter() - started
    delays.sort()
    return PhaseResult(
        name=name,
        seconds=seconds,
        appended=runs * events,
        delivered=delivered,
        p50_ms=_rank(delays, 0.50),
        p99_ms=_rank(delays, 0.99),
        max_ms=delays[-1] * 1000 if delays else math.nan,
    )


@contextmanager
def local_redis() -> Iterator[str]:
    """A `redis-server` on a free loopback port, without persistence, for the block."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (make deps installs it), or pass --redis")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", directory, "--loglevel", "warning"]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("redis-server did not start") from None
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.kill()
            process.wait(timeout=10)


async def run_redis_bench(
    url: str | None = None,
    *,
    runs: int = 100,
    subscribers: int = 10,
    events: int = 200,
    fast: float = 2000.0,
    rate: float = 50.0,
) -> RedisBenchResult:
    """Run both phases against the Redis at `url` (None: a `redis-server` of its own)."""
    if url is None:
        with local_redis() as own:
            return await run_redis_bench(
                own, runs=runs, subscribers=subscribers, events=events, fast=fast, rate=rate
            )
    options = {"window": events + 1, "max_connections": 8}
    async with open_redis_hub(url, **options) as a, open_redis_hub(url, **options) as b:
        version = await a.server_version()
        shape = {"runs": runs, "subscribers": subscribers, "events": events}
        saturated = await _phase(f"{fast:g} events/s per run", (a, b), rate=fast, **shape)
        paced = await _phase(f"{rate:g} events/s per run", (a, b), rate=rate, **shape)
    return RedisBenchResult(version, runs, subscribers, events, (saturated, paced))


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.redis_hub`: print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.redis_hub", description=__doc__)
    parser.add_argument("--redis", default=None, help="a Redis URL (default: start one)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--fast", type=float, default=2000.0, help="events/s per run, phase 1")
    parser.add_argument("--rate", type=float, default=50.0, help="events/s per run, phase 2")
    args = parser.parse_args(argv)
    result = trio.run(
        lambda: run_redis_bench(
            args.redis,
            runs=args.runs,
            subscribers=args.subscribers,
            events=args.events,
            fast=args.fast,
            rate=args.rate,
        )
    )
    print(result.table())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
