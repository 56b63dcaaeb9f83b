"""The chaos soak: hundreds of turns through the real server against the fault-injecting loopback
provider, faults drawn at random from the reliability catalogue, subscribers that disconnect and
resume at random.

    python -m tests.soak [--turns N] [--seconds S] [--concurrency C] [--seed X]
    python -m tests.soak --workers 2 [--kill-every S] [...]

With `--workers` the server is several worker processes sharing a `redis-server`, and workers
are killed and Redis restarted on top of the provider's faults (tests/soak_workers.py says
how); without it, everything runs in this process, as follows.

Each turn (a run started with `POST /v1/runs`) gets a plan: zero to four faults, one per
attempt, then the whole reply. Faults: a dropped connection (orderly or reset), a stall after the
headers or before them (short deadlines make them cost a second), pings while stalled, 429 / 503
/ 529 with `retry-after-ms`, 500 and 502, a malformed frame, a stream cut before its terminal
event, HTML instead of a stream, an oversized frame, an in-stream server error or rate limit. A
turn whose faults outlast a budget ends RateLimited or is rescued by the non-streaming request
(which answers the same text).

Each run has one to three subscribers, SSE or WebSocket, each reading a random number of events,
leaving, and resuming from its last event (`Last-Event-ID` / `?after=`) until `run.done`.

At the end every subscriber must have reassembled its run's log exactly (every event once, in
order), every completed run's text (honouring `attempt.reset`) must equal the provider's text,
every run must have exactly one `run.done`, and nothing may be left behind: tasks, sockets, file
descriptors, subscribers, and memory back to its baseline (within a tolerance). A one-screen
summary is printed; the exit status is 1 on any mismatch or leak.
"""

from __future__ import annotations

import argparse
import collections
import gc
import hashlib
import random
import sys
import time
from typing import TYPE_CHECKING

import attrs
import httpx
import msgspec
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet._core._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    decode_run_event,
)
from rillet._hub._hub import Hub, MemoryRunLog
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    openai_text_body,
    openai_text_stream,
    sse,
    status_reply,
)

from .load._support import open_fds, rss, tasks
from .load.test_load import Subscriber, sse_subscriber, ws_subscriber

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

FAULTS = (
    "drop",
    "reset",
    "stall",
    "stall-headers",
    "stall-pinging",
    "429",
    "503",
    "529",
    "500",
    "502",
    "malformed",
    "truncated",
    "html",
    "oversized",
    "in-stream-error",
    "in-stream-rate-limit",
)
POLICY = Policy(
    initial_event_timeout=1.0,
    per_event_timeout=1.0,
    total_timeout=20.0,
    backoff_base=0.02,
    backoff_max=0.5,
    retry_after_default=0.2,
)
RETENTION = 5.0  # seconds a finished run's log is kept: the soak's memory comes back after it


def fragments(turn: int, count: int) -> list[str]:
    """The provider's text for a turn, in fragments (some multi-byte, some that look like SSE)."""
    extras = ["é ", "👋 ", "x\n\ndata: y ", "世界 "]
    return [f"t{turn}w{i} " if i % 7 else extras[(turn + i) % len(extras)] for i in range(count)]


def frames_of(data: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]


@attrs.define
class Plan:
    """One turn: its text, the faults of its first attempts, what was injected."""

    turn: int
    pieces: list[str]
    faults: list[str]
    rng: random.Random
    rescue_fails: bool = False  # the non-streaming rescue fails too
    attempts: int = 0
    rescued: int = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def reply(self, stream: bool) -> Reply:
        """The reply to this turn's next request."""
        if not stream:
            self.rescued += 1
            if self.rescue_fails:
                return status_reply(500)
            return Reply(
                chunks=(openai_text_body(self.text, completion_id=f"soak-{self.turn}"),),
                content_type="application/json",
            )
        self.attempts += 1
        if self.attempts <= len(self.faults):
            return self.fault(self.faults[self.attempts - 1])
        return Reply(chunks=tuple(self.frames()))

    def frames(self) -> list[bytes]:
        data = openai_text_stream(self.pieces, completion_id=f"soak-{self.turn}")
        return frames_of(data)

    def fault(self, kind: str) -> Reply:
        frames = self.frames()
        rng = self.rng
        cut = rng.randint(1, len(frames) - 3)  # somewhere among the deltas
        wait = str(rng.randint(20, 300))
        if kind in ("drop", "reset"):
            size = len(b"".join(frames[:cut])) + rng.randint(0, 40)
            return Reply(
                chunks=tuple(frames), drop_after_bytes=size, drop_with_reset=kind == "reset"
            )
        if kind == "stall":
            return Reply(chunks=tuple(frames), stall_after=cut)
        if kind == "stall-pinging":
            return Reply(chunks=tuple(frames), stall_after=cut, ping_every=0.3)
        if kind == "stall-headers":
            return Reply(stall_headers=True)
        if kind in ("429", "503", "529"):
            return status_reply(int(kind), retry_after_ms=wait)
        if kind in ("500", "502"):
            return status_reply(int(kind))
        if kind == "malformed":
            return Reply(chunks=(*frames[:cut], b'data: {"choices": [\n\n', *frames[cut:]))
        if kind == "truncated":
            return Reply(chunks=tuple(frames[:cut]))
        if kind == "html":
            return Reply(chunks=(b"<html>502 Bad Gateway</html>",), content_type="text/html")
        if kind == "oversized":
            line = b"data: " + b"x" * 70_000 + b"\n\n"
            return Reply(chunks=(*frames[:cut], line[:40_000], line[40_000:], *frames[cut:]))
        error = "server_error" if kind == "in-stream-error" else "rate_limit_exceeded"
        chunk = sse({"error": {"message": "soak", "type": error, "code": None}})
        return Reply(chunks=(*frames[:cut], chunk))


@attrs.define
class Tally:
    """What the soak saw."""

    turns: int = 0
    faults: collections.Counter[str] = attrs.field(factory=collections.Counter)
    outcomes: collections.Counter[str] = attrs.field(factory=collections.Counter)
    subscribers: int = 0
    resumes: int = 0
    rescues: int = 0
    events: int = 0
    mismatches: list[str] = attrs.field(factory=list)
    leaks: list[str] = attrs.field(factory=list)
    pooled: int = 0
    blocks: int = 0
    base_blocks: int = 0
    rss_growth: int = 0

    def mismatch(self, turn: int, what: str) -> None:
        self.mismatches.append(f"turn {turn}: {what}")


def rebuild(events: list[RunEvent]) -> str:
    """The answer text as a subscriber builds it: deltas appended, cleared at a reset."""
    text: list[str] = []
    for event in events:
        if isinstance(event, AttemptResetEvent):
            text.clear()
        elif isinstance(event, AnswerDelta):
            text.append(event.delta)
    return "".join(text)


async def subscribe(url_sse: str, url_ws: str, kind: str, rng: random.Random) -> Subscriber:
    """Read a run, leaving after a random number of events and resuming, until `run.done`."""
    sub = Subscriber(kind)
    last: str | None = None
    while not (sub.data and isinstance(decode_run_event(sub.data[-1]), RunDone)):
        limit = rng.choice([None, rng.randint(1, 8), rng.randint(1, 40)])
        if sub.segments > 30:
            limit = None
        if kind == "sse":
            last = await sse_subscriber(url_sse, sub, last_event_id=last, limit=limit)
        else:
            await ws_subscriber(url_ws, sub, after=len(sub.data), limit=limit)
    return sub


async def followers(
    rng: random.Random, read: Callable[[str], Awaitable[Subscriber]]
) -> list[Subscriber] | None:
    """One to three subscribers of a run, SSE or WebSocket (`read(kind)` follows it to its
    end), some joining late; None when one of them is not done within two minutes."""
    kinds = [rng.choice(["sse", "ws"]) for _ in range(rng.randint(1, 3))]
    subs: list[Subscriber] = []

    async def follow(kind: str) -> None:
        if rng.random() < 0.3:
            await trio.sleep(rng.uniform(0, 1.0))  # some join late
        subs.append(await read(kind))

    with trio.move_on_after(120) as scope:
        async with trio.open_nursery() as nursery:
            for kind in kinds:
                nursery.start_soon(follow, kind)
    return None if scope.cancelled_caught else subs


async def one_turn(
    client: httpx.AsyncClient, hub: Hub, plan: Plan, tally: Tally, rng: random.Random
) -> None:
    reply = await client.post("/v1/runs", json={"prompt": f"soak {plan.turn}"})
    if reply.status_code != 201:
        tally.mismatch(plan.turn, f"POST /v1/runs answered {reply.status_code}")
        return
    run = reply.json()
    subs = await followers(rng, lambda kind: subscribe(run["events_url"], run["ws_url"], kind, rng))
    if subs is None:
        tally.mismatch(plan.turn, "a subscriber never got run.done (hang)")
        return
    log = [entry.data for entry in hub.log.get(run["run_id"]).entries]
    events = [decode_run_event(data) for data in log]
    tally.turns += 1
    tally.faults.update(plan.faults[: plan.attempts])
    tally.rescues += plan.rescued
    tally.subscribers += len(subs)
    tally.resumes += sum(sub.segments - 1 for sub in subs)
    tally.events += len(events)
    check(plan, events, subs, tally, run["run_id"])


def check(
    plan: Plan, events: list[RunEvent], subs: list[Subscriber], tally: Tally, run_id: str
) -> None:
    """Everything a turn owes: a gapless log with one run.done last, every subscriber given
    every event once, the provider's text exactly once when the run completed."""
    turn = plan.turn
    if [e.seq for e in events] != list(range(1, len(events) + 1)):
        tally.mismatch(turn, "the log has a gap")
    dones = [e for e in events if isinstance(e, RunDone)]
    if len(dones) != 1 or events[-1] is not dones[0]:
        tally.mismatch(turn, f"{len(dones)} run.done, or not last")
        return
    done = dones[0]
    tally.outcomes[f"{done.status}/{done.code}"] += 1
    log = [msgspec.json.encode(e) for e in events]
    for sub in subs:
        got = [decode_run_event(d) for d in sub.data]
        if [msgspec.json.encode(e) for e in got] != log:
            tally.mismatch(turn, f"a {sub.kind} subscriber did not get the log exactly")
            continue
        if done.status == "completed" and rebuild(got) != plan.text:
            tally.mismatch(turn, f"a {sub.kind} subscriber rebuilt another text")
    if done.status != "completed" and not plan.text.startswith(rebuild(events)):
        tally.mismatch(turn, "a failed run's partial text is not the provider's")
    if done.status == "completed":
        if rebuild(events) != plan.text:
            tally.mismatch(turn, "the run's text is not the provider's")
        answers = [e for e in events if isinstance(e, AnswerDone)]
        digest = hashlib.sha256(plan.text.encode()).hexdigest()
        if len(answers) != 1 or answers[0].sha256 != digest:
            tally.mismatch(turn, "answer.done missing or wrong")
    del run_id


TRANSPORT_FAULTS = ("drop", "reset", "500", "502", "malformed", "truncated", "html", "oversized")


def make_plan(turn: int, rng: random.Random) -> Plan:
    """Mostly zero to four random faults, then the reply; one turn in twelve is hopeless:
    rate limited past its budget, or failing past the transport budget with a rescue that
    fails too."""
    count = rng.randint(4, 40)
    pieces = fragments(turn, count)
    dice = rng.random()
    if dice < 1 / 24:
        return Plan(turn, pieces, ["429"] * 6, random.Random(rng.random()))
    if dice < 1 / 12:
        faults = [rng.choice(TRANSPORT_FAULTS) for _ in range(4)]
        return Plan(turn, pieces, faults, random.Random(rng.random()), rescue_fails=True)
    faults = [rng.choice(FAULTS) for _ in range(rng.choice([0, 0, 1, 1, 2, 2, 3, 4]))]
    return Plan(turn, pieces, faults, random.Random(rng.random()))


def soak_provider(url: str) -> Provider:
    """The stand-in provider at `url`, as the server uses it."""
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{url}/v1",
        model="soak-model",
        api_key=Secret("sk-soak-0123456789"),
    )


def soak_limits(runs: int) -> Limits:
    """Limits that admit `runs` runs at once (and a few more), all from one client."""
    return Limits(
        max_subscribers_per_client=10_000,
        max_active_runs=runs + 10,
        max_streams=runs + 10,
        max_runs_per_client=runs + 10,
    )


WARM_UP = 60  # turns run (and counted) before the baseline is taken


async def soak(turns: int, seconds: float, concurrency: int, seed: int) -> Tally:
    """Run the soak: `WARM_UP` turns, a baseline of what the process holds, then turns until
    `turns` or `seconds`, then everything checked against the baseline."""
    rng = random.Random(seed)
    tally = Tally()
    plans: dict[int, Plan] = {}

    def script(request: RecordedRequest, n: int) -> Reply:
        body = msgspec.json.decode(request.body)
        text = body["messages"][-1]["content"]
        turn = int(str(text).split()[-1])
        return plans[turn].reply(bool(body.get("stream")))

    hub = Hub(log=MemoryRunLog(retention=RETENTION))
    provider_server = LoopbackProvider(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider_server.serve)
        limits = soak_limits(concurrency)  # every run streams at once, from one client
        config = ServerConfig(
            provider=soak_provider(provider_server.url), port=0, policy=POLICY, limits=limits
        )
        url = await nursery.start(
            lambda task_status: serve(config, hub=hub, task_status=task_status)
        )
        started = 0
        limiter = trio.Semaphore(concurrency)

        async def batch(count: int, deadline: float) -> None:
            nonlocal started
            client = httpx.AsyncClient(base_url=url, timeout=None)

            async def run_one(turn: int) -> None:
                try:
                    await one_turn(client, hub, plans[turn], tally, random.Random(rng.random()))
                finally:
                    limiter.release()
                    del plans[turn]

            async with client, trio.open_nursery() as turns_nursery:
                last = started + count
                while started < last and trio.current_time() < deadline:
                    await limiter.acquire()
                    started += 1
                    plans[started] = make_plan(started, rng)
                    turns_nursery.start_soon(run_one, started)
                    if started % 100 == 0:
                        print(f"  {started} turns started, {tally.turns} done", file=sys.stderr)

        async def settle() -> None:
            """Until every client has gone and every run's log is forgotten."""
            with trio.move_on_after(10):
                while True:
                    async with httpx.AsyncClient(base_url=url) as probe:
                        metrics = (await probe.get("/metrics.json")).json()
                    if not hub.statistics()["subscribers"] and metrics["connections"] <= 1:
                        break
                    await trio.sleep(0.05)
            await trio.sleep(RETENTION + 0.5)
            hub.create(f"sweep-{started}")  # creating a run sweeps the expired ones
            provider_server.requests.clear()  # the stand-in provider records every request
            for _ in range(3):
                gc.collect()
                await trio.sleep(0.1)

        # warm up (every first-time path: imports, caches, pools), then take the baseline
        await batch(min(WARM_UP, turns), trio.current_time() + seconds)
        await settle()
        base_pooled = provider_server.open_connections
        base_tasks, base_fds, base_rss = tasks(), open_fds(), rss()
        base_blocks = sys.getallocatedblocks()
        await batch(turns - started, trio.current_time() + seconds)
        await settle()
        # the server's HTTP client keeps idle connections to the provider (its pool, at most
        # one per concurrent turn): each is one provider task and two descriptors, not a leak
        pooled = provider_server.open_connections - base_pooled
        tally.pooled = provider_server.open_connections
        if tally.pooled > concurrency:
            tally.leaks.append(f"{tally.pooled} pooled provider connections (> {concurrency})")
        left = {
            "subscribers": hub.statistics()["subscribers"],
            "runs kept": sum(not r.startswith("sweep-") for r in hub.log.runs()),
            "tasks": tasks() - base_tasks - pooled,
            "fds": open_fds() - base_fds - 2 * pooled,
        }
        for what, count in left.items():
            if count > 0:  # (a pooled connection may close while this is counted)
                tally.leaks.append(f"{count} {what} left")
        # memory: the interpreter's live allocations back to the baseline, within 10 % (the
        # server forgets its runs' tokens once a minute, so up to a minute's worth remain);
        # the resident set is reported (the allocator keeps freed arenas)
        blocks = sys.getallocatedblocks() - base_blocks
        if blocks > 0.10 * base_blocks:
            tally.leaks.append(f"{blocks} more live allocations than at the baseline")
        tally.blocks = blocks
        tally.base_blocks = base_blocks
        tally.rss_growth = rss() - base_rss
        nursery.cancel_scope.cancel()
    return tally


def summary(tally: Tally, elapsed: float) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(tally.faults.items()) if not k.startswith("("))
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(tally.outcomes.items()))
    lines = [
        f"soak: {tally.turns} turns in {elapsed:.0f} s, {tally.events} events",
        f"faults injected ({sum(tally.faults.values())}): " + (faults or "none"),
        f"outcomes: {outcomes}; rescue requests: {tally.rescues}",
        f"subscribers: {tally.subscribers}, resumes: {tally.resumes}",
        f"memory: {tally.blocks:+} live allocations against the baseline's {tally.base_blocks}, "
        "resident set "
        f"{tally.rss_growth / 2**20:+.1f} MiB; idle pooled provider connections: {tally.pooled}",
        f"mismatches: {len(tally.mismatches)}",
        *(f"  {m}" for m in tally.mismatches[:10]),
        f"leaks: {len(tally.leaks)}",
        *(f"  {m}" for m in tally.leaks),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--turns", type=int, default=400, help="turns to run (default 400)")
    parser.add_argument("--seconds", type=float, default=180.0, help="stop starting turns after")
    parser.add_argument("--concurrency", type=int, default=20, help="turns at once")
    parser.add_argument("--seed", type=int, default=None, help="the random seed")
    parser.add_argument(
        "--no-record", action="store_true", help="do not write the summary to bench/RESULTS.md"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: in this process)"
    )
    parser.add_argument(
        "--kill-every", type=float, default=15.0, help="with --workers: seconds between faults"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: seed {seed}", file=sys.stderr)
    if args.workers is not None:
        return workers_main(args, seed)
    start = time.perf_counter()
    tally = trio.run(soak, args.turns, args.seconds, args.concurrency, seed)
    text = summary(tally, time.perf_counter() - start)
    print(text)
    failed = bool(tally.mismatches or tally.leaks)
    if not args.no_record:  # the last run's summary, with every other figure of the project
        from bench.report import replace_section

        verdict = "FAILED" if failed else "passed"
        replace_section(
            "soak",
            "## Chaos soak\n\n"
            f"`make soak` (`python -m tests.soak --seed {seed}` reruns it), "
            f"{time.strftime('%Y-%m-%d %H:%M')} UTC: {verdict}.\n\n```\n{text}\n```",
        )
    return 1 if failed else 0


def workers_main(args: argparse.Namespace, seed: int) -> int:
    """The soak against `args.workers` worker processes (tests/soak_workers.py)."""
    from .soak_workers import run

    text, failed = run(args, seed)
    print(text)
    if not args.no_record:
        from bench.report import replace_section

        verdict = "FAILED" if failed else "passed"
        command = (
            f"python -m tests.soak --workers {args.workers} --turns {args.turns} "
            f"--concurrency {args.concurrency} --kill-every {args.kill_every:g} --seed {seed}"
        )
        replace_section(
            "soak-workers",
            "## Chaos soak against worker processes\n\n"
            f"`{command}`, {time.strftime('%Y-%m-%d %H:%M')} UTC: {verdict}.\n\n```\n{text}\n```",
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
