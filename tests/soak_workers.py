"""The chaos soak against several worker processes: `python -m tests.soak --workers 2`.

Its own `redis-server` (append-only file, `appendfsync always`, in a temporary directory), the
server as `rillet serve --workers 2 --redis ...` runs it (`serve` supervising two worker
processes on one port, with the soak's short deadlines, which the command line does not take,
and a 3 s lease in place of 9 s, `ServerConfig.hub_options`), and the fault-injecting loopback
provider in a process of its own, running the in-process soak's fault plans: each turn's plan is
drawn from the seed and the turn's number, so the provider's process and the soak's draw the
same one.

On top of the provider's faults, two of the deployment's:

- SIGKILL to a worker at random times (one every `--kill-every` seconds on average, never two
  within 4 s, never a worker killed three times within a minute: five deaths within a minute
  stop the supervisor), whatever it is doing: the runs it drove are taken over by a server
  once their lease has run out (`status` `taken_over`, `attempt.reset`, the whole new attempt,
  `completed`), its readers' connections break and they resume on whichever worker the kernel
  gives them, and a `POST /v1/runs` it was answering is sent again.
- A Redis crash (one fault in eight; SIGKILL, then the same server started again on the same
  files 1 s later):
  runs cut by the outage end `run.done` (`error`, `log_unavailable`) by design once Redis is
  back, or are taken over when their lease ran out meanwhile; readers get 503 or a close while
  it is down and resume after. The logs survive the restart only because Redis persists every
  write before answering it (`appendfsync always`): without persistence a restart forgets
  every run's log, and the end the design promises has nothing to follow.

Checks, as in the in-process soak: every subscriber reassembled its run's log (read straight
from Redis) exactly, every completed run's text after its last `attempt.reset` is the
provider's, exactly one `run.done` per run, last, with a code its faults allow (`completed`;
the code of its last fault for a plan meant to fail; `log_unavailable` where an outage met
the run; never `server_lost`, as a killed worker's runs are taken over); and nothing left
behind: each worker's subscribers and client connections back to 0 (`/metrics.json`), its
open files no more than after the warm-up (the provider connections it pools aside), its
resident set reported. A `POST /v1/runs` cut by a kill may have started a run whose id the
soak never learned: that run is not checked, and its provider requests share the turn's plan.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import coredis
import h11
import httpx
import msgspec
import trio
from rillet._core._runevents import RunDone, RunEvent, StatusEvent, decode_run_event
from rillet._hub import _redis_layout as layout
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import RecordedRequest, Reply, open_loopback_provider

from .load._support import child_provider
from .load.test_load import Subscriber, sse_subscriber, ws_subscriber
from .soak import POLICY, Plan, check, followers, make_plan, soak_limits, soak_provider
from .soak import Tally as SoakTally

LEASE = 3.0  # seconds: a killed worker's runs are taken over 3-4 s later
HUB_OPTIONS = {"lease": LEASE, "lease_interval": 1.0, "block": 1.0}
# the codes of a plan meant to fail: past its rate-limit budget, or past its transport budget
# with a rescue that fails too (the code of its last fault: a break, a 5xx, an unreadable stream)
RATE_LIMITED = {"rate_limited"}
FAILED = {"connection_failed", "provider_error", "provider_unavailable", "protocol_error"}
OUTAGE = 1.0  # seconds Redis is down


def log_to(path: str) -> None:
    """Log warnings and errors to `path`, not the terminal (each worker calls it first)."""
    logging.basicConfig(filename=path, level=logging.WARNING, force=True)


def plan_for(seed: int, turn: int) -> Plan:
    """The turn's plan, the same in the provider's process and the soak's."""
    return make_plan(turn, random.Random(f"{seed}:{turn}"))


def expected(plan: Plan, *, fresh: bool) -> set[str]:
    """The codes the plan's faults allow its run to end with, when no outage met it; with
    `fresh`, a plan meant to fail may complete (the run's later attempts begin where other
    requests spent the plan's faults)."""
    failing = FAILED if plan.rescue_fails else RATE_LIMITED if plan.faults == ["429"] * 6 else None
    if failing is None:
        return {"completed"}
    return failing | {"completed"} if fresh else failing


# --- the provider's process -----------------------------------------------------------------------


async def provider_main(seed: int) -> None:
    """Serve the plans' replies until standard input closes; `GET /soak/plan/<turn>` answers
    what the turn's plan injected so far."""
    plans: dict[int, Plan] = {}

    def script(request: RecordedRequest, n: int) -> Reply:
        if request.path.startswith("/soak/plan/"):
            turn = int(request.path.rsplit("/", 1)[1])
            plan = plans.get(turn) or plan_for(seed, turn)
            body = {"attempts": plan.attempts, "rescued": plan.rescued}
            return Reply(chunks=(msgspec.json.encode(body),), content_type="application/json")
        body = msgspec.json.decode(request.body)
        turn = int(str(body["messages"][-1]["content"]).split()[-1])
        plan = plans.setdefault(turn, plan_for(seed, turn))
        return plan.reply(bool(body.get("stream")))

    async with open_loopback_provider(script) as provider:
        print(f"PORT {provider.url.rsplit(':', 1)[1]}", flush=True)
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        while await stdin.receive_some(1024):
            pass


# --- Redis ----------------------------------------------------------------------------------------


@attrs.define
class Redis:
    """A `redis-server` on a loopback port that persists every write before answering it, and
    can crash and come back on the same files."""

    directory: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (`make deps` installs it)")
        if not self.port:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self.port = sock.getsockname()[1]
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)]
        args += ["--loglevel", "warning"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        """A crash: SIGKILL, no shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


# --- the soak's side ------------------------------------------------------------------------------


@attrs.define
class Tally(SoakTally):
    """What the soak saw: the in-process soak's figures and the deployment's faults."""

    broken: int = 0  # subscriptions cut by a kill or refused by an outage
    reposts: int = 0  # `POST /v1/runs` sent again
    kills: int = 0
    restarts: int = 0
    taken_over: int = 0
    workers: list[str] = attrs.field(factory=list)  # per worker: files and memory


@attrs.define
class Chaos:
    """When the deployment's faults happened (trio time)."""

    kills: list[float] = attrs.field(factory=list)
    outages: list[tuple[float, float]] = attrs.field(factory=list)

    def met(self, start: float, end: float) -> set[str]:
        """What a run that lived from `start` to `end` met: `kill`, `outage`."""
        met = set()
        if any(start <= t <= end for t in self.kills):
            met.add("kill")
        if any(a <= end and start <= b for a, b in self.outages):
            met.add("outage")
        return met


_BROKEN = (OSError, trio.BrokenResourceError, h11.ProtocolError, AssertionError)


async def subscribe(run: dict[str, Any], kind: str, rng: random.Random, tally: Tally) -> Subscriber:
    """Read a run, leaving after a random number of events and resuming, until `run.done`; a
    connection that breaks (a worker killed) or is refused (Redis down) is resumed too."""
    sub = Subscriber(kind)
    while not (sub.data and isinstance(decode_run_event(sub.data[-1]), RunDone)):
        limit = rng.choice([None, rng.randint(1, 8), rng.randint(1, 40)])
        if sub.segments > 30:
            limit = None
        # ids are `<run_id>:<seq>`: what was read decides where to resume, however it ended
        last = f"{run['run_id']}:{len(sub.data)}" if sub.data else None
        read = len(sub.data)
        try:  # (the helpers assert a 200 or a 101: a 503 while Redis is down fails them)
            if kind == "sse":
                await sse_subscriber(run["events_url"], sub, last_event_id=last, limit=limit)
            else:
                await ws_subscriber(run["ws_url"], sub, after=len(sub.data), limit=limit)
        except _BROKEN:
            tally.broken += 1
            await trio.sleep(0.2)
        if len(sub.data) == read:  # closed at once (1013 while Redis is down): not so fast
            await trio.sleep(0.1)
    return sub


async def start_run(url: str, turn: int, tally: Tally) -> tuple[dict[str, Any] | None, bool]:
    """`POST /v1/runs` on a connection of its own (so the kernel spreads runs over the
    workers), sent again while a kill cuts it or an outage refuses it (for a minute): the run,
    and whether a send was cut (a run the soak never learned of may share the turn's plan)."""
    cut = False
    for _ in range(240):
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                reply = await client.post("/v1/runs", json={"prompt": f"soak {turn}"})
        except httpx.TransportError:
            reply = None
            cut = True
        if reply is not None and reply.status_code == 201:
            run: dict[str, Any] = reply.json()
            return run, cut
        if reply is not None and reply.status_code != 503:
            tally.mismatch(turn, f"POST /v1/runs answered {reply.status_code}")
            return None, cut
        tally.reposts += 1
        await trio.sleep(0.25)
    tally.mismatch(turn, "POST /v1/runs refused for a minute")
    return None, cut


async def read_log(redis: coredis.Redis[bytes], run_id: str) -> list[RunEvent]:
    """The run's log as Redis keeps it (asked again while Redis is down)."""
    for _ in range(100):
        try:
            reply = await redis.xrange(layout.keys(run_id)[1], "-", "+")
        except (coredis.exceptions.RedisError, OSError):
            await trio.sleep(0.2)
            continue
        return [layout.entry(item.identifier, item.field_values).event for item in reply]
    raise RuntimeError("Redis did not answer for 20 s")


async def one_turn(
    url: str,
    provider: str,
    redis: coredis.Redis[bytes],
    plan: Plan,
    chaos: Chaos,
    tally: Tally,
    rng: random.Random,
) -> None:
    start = trio.current_time()
    run, cut = await start_run(url, plan.turn, tally)
    if run is None:
        return
    subs = await followers(rng, lambda kind: subscribe(run, kind, rng, tally))
    if subs is None:
        tally.mismatch(plan.turn, "a subscriber never got run.done (hang)")
        return
    met = chaos.met(start, trio.current_time())
    events = await read_log(redis, run["run_id"])
    async with httpx.AsyncClient(base_url=provider) as client:
        injected = (await client.get(f"/soak/plan/{plan.turn}")).json()
    plan.attempts, plan.rescued = injected["attempts"], injected["rescued"]
    tally.turns += 1
    tally.faults.update(plan.faults[: plan.attempts])
    tally.faults.update(f"({m})" for m in met)
    tally.subscribers += len(subs)
    tally.resumes += sum(sub.segments - 1 for sub in subs)
    tally.events += len(events)
    taken = any(isinstance(e, StatusEvent) and e.phase == "taken_over" for e in events)
    tally.taken_over += taken
    mismatches = len(tally.mismatches)
    check(plan, events, subs, tally, run["run_id"])  # the in-process soak's checks
    if len(tally.mismatches) > mismatches or not isinstance(events[-1], RunDone):
        return
    code = events[-1].code
    # a kill allows no more (its runs are taken over); a run the soak never learned of (a cut
    # POST) may have spent the plan's faults, as a run taken over may
    allowed = expected(plan, fresh=taken or cut)
    if "outage" in met:
        allowed |= {"log_unavailable"}
    if code not in allowed:
        tally.mismatch(plan.turn, f"ended {code}, which {sorted(met) or 'no fault'} allows not")


# --- the workers: who they are, killing them, what they hold -------------------------------------


async def metrics(url: str, worker: int | None = None) -> dict[str, Any]:
    """`/metrics.json` of `worker` (fresh connections until one reaches it), or of whichever
    worker the first connection reaches."""
    for _ in range(400):
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                found: dict[str, Any] = (await client.get("/metrics.json")).json()
        except httpx.TransportError:
            await trio.sleep(0.05)
            continue
        if worker is None or found["worker"] == worker:
            return found
    raise RuntimeError(f"no connection reached worker {worker}")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def resident(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def chaos_loop(
    url: str, redis: Redis, chaos: Chaos, tally: Tally, rng: random.Random, every: float
) -> None:
    """Kill a worker now and then, and crash Redis once in eight faults (the first one
    early enough that even a short soak meets it), until cancelled."""
    deaths: dict[int, list[float]] = {0: [], 1: []}
    count = 0
    while True:
        await trio.sleep(rng.uniform(0.5, 1.5) * every)
        count += 1
        if count % 8 == 2:
            now = trio.current_time()
            redis.kill()
            await trio.sleep(OUTAGE)
            redis.start()
            # the hubs' pooled connections break and they end the cut runs within a second
            chaos.outages.append((now, trio.current_time() + 3.0))
            tally.restarts += 1
            await trio.sleep(4)  # a worker killed now could not start while Redis is down
            continue
        now = trio.current_time()
        candidates = [w for w, ts in deaths.items() if sum(now - t < 60 for t in ts) < 2]
        if not candidates:
            continue
        worker = rng.choice(candidates)
        try:
            found = await metrics(url, worker)
        except RuntimeError:  # not serving again yet: another time
            continue
        os.kill(found["pid"], signal.SIGKILL)
        chaos.kills.append(trio.current_time())
        deaths[worker].append(trio.current_time())
        tally.kills += 1
        await trio.sleep(4)  # never two within 4 s


async def settle(url: str, workers: int) -> dict[int, dict[str, Any]]:
    """Wait (up to 30 s) until no worker has a subscriber or a client connection but the
    probe's; each worker's metrics then."""
    found: dict[int, dict[str, Any]] = {}
    with trio.move_on_after(30):
        while True:
            found = {w: await metrics(url, w) for w in range(workers)}
            if all(m["subscribers"] == 0 and m["connections"] <= 1 for m in found.values()):
                break
            await trio.sleep(0.2)
    return found


async def soak(
    turns: int,
    seconds: float,
    concurrency: int,
    seed: int,
    workers: int,
    every: float,
    *,
    least: tuple[int, int] = (0, 0),
) -> Tally:
    """Run the soak: a warm-up without the deployment's faults, a baseline of what each worker
    holds, then `turns` turns in all (fewer if `seconds` pass first; more while fewer than
    `least` kills and Redis restarts have come), then every check. The workers log their
    warnings and errors to a file in the temporary directory, named for the seed."""
    rng = random.Random(seed)
    tally = Tally()
    chaos = Chaos()
    directory = Path(tempfile.mkdtemp(prefix="rillet-soak-redis-"))
    log = Path(tempfile.gettempdir()) / f"rillet-soak-workers-{seed}.log"
    redis = Redis(directory)
    redis.start()
    try:
        async with (
            child_provider("tests.soak_workers", "--provider", "--seed", str(seed)) as provider_url,
            coredis.Redis.from_url(redis.url, stream_timeout=5, connect_timeout=5) as client,
            trio.open_nursery() as nursery,
        ):
            config = ServerConfig(
                provider=soak_provider(provider_url),
                port=0,
                policy=POLICY,
                limits=soak_limits(2 * concurrency),  # one worker takes the other's runs over
                redis_url=redis.url,
                workers=workers,
                hub_options=HUB_OPTIONS,
            )
            setup = functools.partial(log_to, str(log))
            url = await nursery.start(
                lambda task_status: serve(config, worker_setup=setup, task_status=task_status)
            )
            deadline = trio.current_time() + seconds
            started = 0
            goal = (0, 0)
            limiter = trio.Semaphore(concurrency)

            async def batch(count: int) -> None:
                nonlocal started

                async def run_one(plan: Plan) -> None:
                    try:
                        rng_turn = random.Random(rng.random())
                        await one_turn(url, provider_url, client, plan, chaos, tally, rng_turn)
                    finally:
                        limiter.release()

                last = started + count

                def more() -> bool:
                    if trio.current_time() > deadline:
                        return False
                    short = tally.kills < goal[0] or tally.restarts < goal[1]
                    return started < last or short

                async with trio.open_nursery() as turns_nursery:
                    while more():
                        await limiter.acquire()
                        started += 1
                        turns_nursery.start_soon(run_one, plan_for(seed, started))
                        if started % 100 == 0:
                            print(f"  {started} turns started, {tally.turns} done", file=sys.stderr)

            await batch(min(30, turns // 2))  # warm up: every first-time path, then the baseline
            base = await settle(url, workers)
            base_files = {w: open_files(m["pid"]) for w, m in base.items()}
            base_rss = {w: resident(m["pid"]) for w, m in base.items()}
            goal = least  # (the warm-up has no chaos to wait for)
            async with trio.open_nursery() as chaotic:
                chaotic.start_soon(chaos_loop, url, redis, chaos, tally, rng, every)
                await batch(turns - started)
                chaotic.cancel_scope.cancel()
            end = await settle(url, workers)
            pooled = pooled_connections(provider_url)
            for w, m in end.items():
                pid, files = m["pid"], open_files(m["pid"])
                again = "" if pid == base[w]["pid"] else ", started again"
                tally.workers.append(
                    f"worker {w} (pid {pid}{again}): {files} open files (after the warm-up "
                    f"{base_files[w]}), resident {resident(pid) / 2**20:.0f} MiB (after the "
                    f"warm-up {base_rss[w] / 2**20:.0f})"
                )
                for what in ("subscribers", "connections"):
                    if m[what] > (what == "connections"):
                        tally.leaks.append(f"worker {w}: {m[what]} {what} left")
                if files > base_files[w] + pooled:
                    tally.leaks.append(
                        f"worker {w}: {files} open files, {base_files[w]} after the warm-up "
                        f"(and {pooled} pooled provider connections)"
                    )
            nursery.cancel_scope.cancel()
    finally:
        redis.kill()
        shutil.rmtree(directory, ignore_errors=True)
    return tally


def pooled_connections(provider_url: str) -> int:
    """The provider's open connections (the workers' idle pooled ones), counted from this
    side: established TCP connections to its port."""
    port = int(provider_url.rsplit(":", 1)[1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            count += 1
    return count


def summary(tally: Tally, elapsed: float, workers: int) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(tally.faults.items()))
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(tally.outcomes.items()))
    lines = [
        f"soak --workers {workers}: {tally.turns} turns in {elapsed:.0f} s, {tally.events} events",
        f"worker kills: {tally.kills}, Redis restarts: {tally.restarts}, runs taken over: "
        f"{tally.taken_over}, POST /v1/runs sent again: {tally.reposts}",
        "faults met (a run may meet several; (kill) and (outage): runs alive when they came): "
        + (faults or "none"),
        f"outcomes: {outcomes}",
        f"subscribers: {tally.subscribers}, resumes: {tally.resumes} "
        f"({tally.broken} broken or refused)",
        *tally.workers,
        f"mismatches: {len(tally.mismatches)}",
        *(f"  {m}" for m in tally.mismatches[:10]),
        f"leaks: {len(tally.leaks)}",
        *(f"  {m}" for m in tally.leaks),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace, seed: int) -> tuple[str, bool]:
    """Run the soak with `--workers`: its summary, and whether it failed."""
    log = Path(tempfile.gettempdir()) / f"rillet-soak-workers-{seed}.log"
    print(f"soak: the servers' warnings and errors go to {log}", file=sys.stderr)
    log_to(str(log))
    start = time.perf_counter()
    tally = trio.run(
        soak, args.turns, args.seconds, args.concurrency, seed, args.workers, args.kill_every
    )
    text = summary(tally, time.perf_counter() - start, args.workers)
    return text, bool(tally.mismatches or tally.leaks)


if __name__ == "__main__":  # the provider's process
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", action="store_true", required=True)
    parser.add_argument("--seed", type=int, required=True)
    trio.run(provider_main, parser.parse_args().seed)
