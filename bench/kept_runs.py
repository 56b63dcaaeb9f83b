"""What a kept run costs a server: `python -m bench.kept_runs [traced|rss]`.

A server keeps every run's log after its end (`MemoryRunLog`), up to `max_total_bytes` (256
MiB) of its estimate of what they hold (`run_cost`, `entry_cost` in `rillet._hub._hub`).
This measures what they really hold, two ways, with runs of `--events` text fragments of
`--chars` characters each started through `POST /v1/runs` against the loopback provider:

- traced: the server in this process; the bytes tracemalloc sees the server keep for `--runs`
  finished runs (what the loopback provider and the client keep left out), against the hub's
  estimate for the same runs, per run, per event and per byte of the events' JSON;
- rss: `rillet serve` in a process of its own, filled with runs until its cap has been passed
  several times over (it then forgets the oldest finished runs), so the growth of its resident
  memory (`VmRSS`) from before the first run to its plateau is what the cap lets kept runs
  take, malloc's and pymalloc's overhead and the fragmentation of a real server included.

Figures go to stdout as JSON (`bench/RESULTS.md` has the last run's, by hand).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import socket
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import trio
from rillet._hub._hub import Hub, MemoryRunLog
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

__all__ = ["main"]

_WARM = 20  # runs before the first figure: imports, pools and caches settle


def _reply(events: int, chars: int) -> Reply:
    words = [("x" * (chars - 1) + " ") for _ in range(events)]
    return Reply(chunks=(openai_text_stream(words),))


async def _fill(client: httpx.AsyncClient, runs: int, parallel: int = 8) -> None:
    """Start `runs` runs, `parallel` at a time, each read to its `run.done` over SSE."""
    pending = iter(range(runs))

    async def one_by_one() -> None:
        for _ in pending:
            started = (await client.post("/v1/runs", json={"prompt": "Hi"})).json()
            path = started["events_url"].split("://", 1)[1].partition("/")[2]
            async with client.stream("GET", "/" + path) as events:
                async for _ in events.aiter_raw():
                    pass

    async with trio.open_nursery() as nursery:
        for _ in range(parallel):
            nursery.start_soon(one_by_one)


async def traced(runs: int, events: int, chars: int) -> dict[str, Any]:
    """The server in this process: what tracemalloc sees it keep for `runs` finished runs."""
    hub = Hub()
    reply = _reply(events, chars)
    async with open_loopback_provider([reply] * (runs + _WARM)) as loopback:
        config = ServerConfig(provider=_provider(loopback.url), port=0)
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status: serve(config, hub=hub, task_status=task_status)
            )
            async with httpx.AsyncClient(base_url=url, timeout=None) as client:
                await _fill(client, _WARM)
                gc.collect()
                tracemalloc.start()
                before = tracemalloc.take_snapshot()
                estimate_before = hub.log.total_bytes
                await _fill(client, runs)
                await trio.sleep(0.5)  # the last connections' tasks end
                gc.collect()
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                estimate = hub.log.total_bytes - estimate_before
                kept = hub.log.runs()[-runs:]
                json_bytes = sum(len(e.data) for r in kept for e in hub.log.get(r).entries)
                n_events = sum(len(hub.log.get(r).entries) for r in kept)
            nursery.cancel_scope.cancel()
    server_only = [
        tracemalloc.Filter(False, "*/transports/testing/*"),
        tracemalloc.Filter(False, "*/httpx/*"),
        tracemalloc.Filter(False, "*/httpcore/*"),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    grown = after.filter_traces(server_only).compare_to(
        before.filter_traces(server_only), "filename"
    )
    held = sum(stat.size_diff for stat in grown)
    return {
        "mode": "traced",
        "runs": runs,
        "events_per_run": n_events / runs,
        "json_bytes_per_run": json_bytes / runs,
        "traced_per_run": held / runs,
        "estimate_per_run": estimate / runs,
        "traced_over_estimate": held / estimate,
    }


def _provider(url: str) -> Any:
    from rillet._core._dialect import Provider
    from rillet.providers._openai_chat._dialect import OpenAIChatDialect

    return Provider(dialect=OpenAIChatDialect(), base_url=f"{url}/v1", model="gpt-4o-mini")


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) * 1024


async def rss(runs: int, events: int, chars: int) -> dict[str, Any]:
    """`rillet serve` in its own process: its resident memory before and after `runs` runs."""
    reply = _reply(events, chars)
    port = _free_port()
    async with open_loopback_provider([reply] * (runs + _WARM)) as loopback:
        argv = [sys.executable, "-m", "rillet", "serve", "--port", str(port), "--provider"]
        argv += [f"{loopback.url}/v1", "--model", "gpt-4o-mini", "--api-key", "sk-bench"]
        argv += ["--log-level", "warning"]
        process = await trio.lowlevel.open_process(argv)
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=None
            ) as client:
                await _until_up(client)
                await _fill(client, _WARM)
                base = _rss(process.pid)
                samples = []
                step = max(runs // 10, 1)
                for _ in range(0, runs, step):
                    await _fill(client, step)
                    samples.append(_rss(process.pid) - base)
                kept = (await client.get("/metrics.json")).json()["runs_kept"]
        finally:
            process.terminate()
            await process.wait()
    return {
        "mode": "rss",
        "runs": runs,
        "events_per_run": events,
        "chars_per_event": chars,
        "runs_kept": kept,
        "rss_growth_mib": [round(s / 2**20, 1) for s in samples],
        "plateau_mib": round(max(samples) / 2**20, 1),
        "cap_mib": MemoryRunLog().max_total_bytes // 2**20,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _until_up(client: httpx.AsyncClient) -> None:
    with trio.fail_after(30):
        while True:
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    """Run one measurement and print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.kept_runs", description=__doc__)
    parser.add_argument("mode", choices=["traced", "rss"])
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--events", type=int, default=500, help="text fragments a run")
    parser.add_argument("--chars", type=int, default=100, help="characters a fragment")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.mode == "traced":
        figures = trio.run(traced, args.runs or 200, args.events, args.chars)
    else:
        figures = trio.run(rss, args.runs or 2000, args.events, args.chars)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
