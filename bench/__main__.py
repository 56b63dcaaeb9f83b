"""`python -m bench [COMMAND]`, COMMAND one of core, pipeline, peers, ttfd, firstbyte, turns,
memory, fanout, redis, workers, gateway or all: rillet against the limit and against what
users would pick instead, side by side.

- core: each stream kind's sans-I/O decode in one task against the limit loop;
- pipeline: the limit loops, rillet's core, `run_turn` and `open_turn` + JSONL sink on every
  stream kind at every size;
- peers: the OpenAI and Anthropic SDKs, LiteLLM and MMSP (in bench/.venv-peers, which `make
  bench` creates) on the same bytes, interleaved with rillet's `run_turn`;
- ttfd: time from the first delta's bytes to a sink;
- firstbyte: time from calling `run_turn` / `open_turn` to the request's first byte at a server
  on 127.0.0.1, cold and warm, against trio alone sending the same bytes;
- turns: 1,000 concurrent turns (loop lag, memory per turn, throughput);
- memory: 500-event turns, with and without history: what a finished turn keeps, and a turn's
  peak in flight (tracemalloc), with RSS growth as a cross-check;
- fanout, redis: the fan-out and Redis benchmarks of bench/fanout.py and bench/redis_hub.py,
  when those modules are there;
- workers: deliveries/s with 1 and 2 server processes on one port (bench/workers.py);
- gateway: K paced streams through `rillet serve`, a bare trio pass-through and LiteLLM's proxy:
  server CPU per chunk, added latency, peak RSS (bench/gateway.py);
- all (the default): core, pipeline and peers (interleaved), ttfd, firstbyte, turns, memory,
  gateway, and fanout / redis / workers with `--fanout` / `--redis` / `--workers`.

Figures go to bench/out/results.json and the marked sections of bench/RESULTS.md (targets
judged from them), and charts to bench/charts/. A progress line runs on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import json
import shutil
import subprocess
import sys
import time
from typing import Any

import trio

from . import report
from .core import CORE_KINDS, run_core
from .targets import judge_targets, targets_markdown

__all__ = ["main"]

_START = time.monotonic()
_last_plain = 0.0


def _progress(line: str) -> None:
    """The progress line: rewritten in place on a terminal, every few seconds otherwise."""
    global _last_plain
    elapsed = time.monotonic() - _START
    text = f"[{elapsed:5.0f} s] {line}"
    if sys.stderr.isatty():
        print(f"\r\x1b[K{text[:150]}", end="", file=sys.stderr, flush=True)
    elif time.monotonic() - _last_plain >= 5:
        _last_plain = time.monotonic()
        print(text, file=sys.stderr, flush=True)


def _width() -> int:
    """The columns the printed sections may take: the terminal's, at most 100."""
    return min(100, shutil.get_terminal_size((100, 24)).columns)


def _done_line() -> None:
    if sys.stderr.isatty():
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)


class RunState:
    """One invocation: the merged results, and what it writes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results = report.load_results()

    def record(self, key: str, section: dict[str, Any], markdown: dict[str, str]) -> None:
        """Keep a benchmark's figures and sections; print the sections."""
        section["machine"] = {**report.machine(), **section.get("machine", {})}
        self.results[key] = section
        for name, body in markdown.items():
            _done_line()
            print(f"\n{report.for_terminal(body, _width())}\n", flush=True)
            if not self.args.no_write:
                report.replace_section(name, body)
        if not self.args.no_write:
            report.save_results(self.results)

    def finish(self) -> None:
        """Judge the targets, draw the charts."""
        _done_line()
        targets = judge_targets(self.results)
        body = targets_markdown(targets, self.results)
        self.results["targets"] = [t.as_dict() for t in targets]
        print(f"\n{report.for_terminal(body, _width())}\n", flush=True)
        if self.args.no_write:
            return
        report.replace_section("targets", body)
        report.save_results(self.results)
        if not self.args.no_charts:
            from .charts import draw_charts

            charts = draw_charts(self.results)
            if isinstance(charts, str):
                print(f"charts skipped: {charts}", file=sys.stderr)
            else:
                for path in charts:
                    print(f"chart: {path.relative_to(report.HERE.parent)}", file=sys.stderr)


# --- the benchmarks ---------------------------------------------------------------------------


def _core(run: RunState) -> None:
    a = run.args
    fragments = a.fragments or (5_000 if a.quick else 20_000)
    rounds = a.rounds or (3 if a.quick else 7)
    results = run_core(fragments, rounds, a.kind or None, _progress)
    section = {
        "fragments": fragments,
        "rounds": rounds,
        "results": [
            {f: getattr(r, f) for f in r.__struct_fields__}  # a msgspec Struct
            for r in results
        ],
    }
    run.record("core", section, {"core": report.core_markdown({**section, **_now()})})


def _now() -> dict[str, Any]:
    return {"machine": report.machine()}


def _throughput(run: RunState, *, every_kind: bool, peers: bool) -> None:
    """rillet's contestants on every stream kind (or only the peers' kinds), with the peers
    interleaved when asked; recorded as `pipeline` and/or `peers`."""
    from .contestants import RILLET
    from .throughput import PeersPlan, run_throughput
    from .wire import STREAM_KINDS

    a = run.args
    sizes = a.sizes or ([1000] if a.quick else [1000, 20000])
    rounds = a.rounds or (2 if a.quick else 5)
    kinds = a.kind or list(STREAM_KINDS)
    if not every_kind:
        kinds = [k for k in kinds if k.startswith(("openai-chat", "anthropic"))]
    plan = PeersPlan(rounds=a.peer_rounds or (1 if a.quick else 3)) if peers else None
    tp = run_throughput(kinds, sizes, rounds, list(RILLET), plan, _progress)
    section = tp.as_dict()
    if every_kind:
        run.record(
            "pipeline", dict(section), {"pipeline": report.pipeline_markdown({**section, **_now()})}
        )
    if peers:
        run.record("peers", dict(section), {"peers": report.peers_markdown({**section, **_now()})})


def _ttfd(run: RunState) -> None:
    from .latency import TTFD_KINDS, run_ttfd

    a = run.args
    iterations = a.iterations or (40 if a.quick else 200)
    kinds = tuple(k for k in TTFD_KINDS if not a.kind or k in a.kind)
    if a.quick and not a.kind:
        kinds = ("openai-chat", "anthropic", "openai-chat+4k", "anthropic+4k")
    results = run_ttfd(kinds, iterations, _progress)
    section = {"iterations": iterations, "results": [r.as_dict() for r in results]}
    run.record("ttfd", section, {"ttfd": report.ttfd_markdown({**section, **_now()})})


def _firstbyte(run: RunState) -> None:
    from .firstbyte import run_firstbyte

    a = run.args
    rounds = a.iterations or (60 if a.quick else 300)
    section = run_firstbyte(rounds, _progress)
    run.record(
        "firstbyte", section, {"firstbyte": report.firstbyte_markdown({**section, **_now()})}
    )


def _turns(run: RunState) -> None:
    a = run.args
    turns = a.turns or (200 if a.quick else 1000)
    events = a.events or (50 if a.quick else 100)
    section: dict[str, Any] = {}
    for mode in ("paced", "burst"):
        cmd = [
            sys.executable,
            "-m",
            "bench.turns",
            "--mode",
            mode,
            "--turns",
            str(turns),
            "--events",
            str(events),
            "--period",
            str(a.period),
        ]
        start = time.monotonic()
        with subprocess.Popen(
            cmd, cwd=report.HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            while True:
                try:
                    out, err = proc.communicate(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - start
                    _progress(f"turns: {turns:,} {mode} turns ({elapsed:.0f} s)")
                    if elapsed > 900:  # the child has its own watchdog; this is the last resort
                        proc.kill()
        line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
        if proc.returncode != 0 or line is None:
            why = (err.strip().splitlines() or ["no output"])[-1][:200]
            section[mode] = {"error": why}
        else:
            section[mode] = json.loads(line)
    run.record("turns", section, {"turns": report.turns_markdown({**section, **_now()})})


def _memory(run: RunState) -> None:
    from .memory import MEMORY_KINDS

    a = run.args
    turns = a.memory_turns or (100 if a.quick else 200)
    rows: list[dict[str, Any]] = []
    for kind in MEMORY_KINDS:
        for history in (False, True):
            row: dict[str, Any] = {"kind": kind, "history": history, "turns": turns}
            for how in ("trace", "rss"):
                cmd = [sys.executable, "-m", "bench.memory", "--kind", kind, "--how", how]
                cmd += ["--turns", str(turns), "--events", str(a.memory_events)]
                if not history:
                    cmd.append("--no-history")
                _progress(f"memory: {kind}, history={history}, {how} ({turns:,} turns)")
                proc = subprocess.run(
                    cmd, cwd=report.HERE.parent, capture_output=True, text=True, timeout=900
                )
                line = next((x for x in reversed(proc.stdout.splitlines()) if x[:1] == "{"), None)
                if proc.returncode != 0 or line is None:
                    row["error"] = ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:200]
                    break
                figures = json.loads(line)
                figures["ok"] = min(figures["ok"], row.get("ok", figures["ok"]))
                row.update(figures)
            rows.append(row)
    section = {"rows": rows}
    run.record("memory", section, {"memory": report.memory_markdown({**section, **_now()})})


def _external(
    run: RunState,
    key: str,
    module: str,
    function: str,
    quick_kwargs: dict[str, Any],
    full_kwargs: dict[str, Any] | None = None,
) -> None:
    """Run another module's benchmark when it is there; skip it with a note otherwise."""
    name = f"bench.{module}"
    if importlib.util.find_spec(name) is None:
        print(f"{key}: bench/{module}.py is not there, skipped", file=sys.stderr)
        return
    try:
        fn = getattr(importlib.import_module(name), function)
    except (ImportError, AttributeError) as exc:
        print(f"{key}: {name}.{function} cannot be loaded ({exc}), skipped", file=sys.stderr)
        return
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "progress" in params:
        kwargs["progress"] = _progress
    chosen = quick_kwargs if run.args.quick else (full_kwargs or {})
    kwargs.update({k: v for k, v in chosen.items() if k in params})
    _progress(f"{key}: running {name}.{function}")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            if inspect.iscoroutinefunction(fn):  # a trio benchmark
                result = trio.run(functools.partial(fn, **kwargs))
            else:
                result = fn(**kwargs)
    except Exception as exc:  # another module's failure is reported, not fatal
        _done_line()
        print(f"{key}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        run.record(key, {"error": f"{type(exc).__name__}: {exc}"[:300]}, {})
        return
    markdown = ""
    if isinstance(result, str):
        markdown = result
    else:
        for method in ("markdown", "table", "to_markdown"):
            if callable(getattr(result, method, None)):
                markdown = getattr(result, method)()
                break
    markdown = markdown or printed.getvalue()
    data: Any = result
    try:
        import attrs

        if attrs.has(type(result)):
            data = attrs.asdict(result)
    except ImportError:
        pass
    data = json.loads(json.dumps(data, default=str)) if data is not None else None
    title = {"fanout": "## Fan-out", "redis": "## Redis hub", "workers": "## Workers"}[key]
    body = markdown.strip()
    if body and not body.startswith("#"):
        body = f"{title}\n\n`python -m bench {key}`\n\n{body}"
    run.record(key, {"result": data}, {key: body} if body else {})


def _fanout(run: RunState) -> None:
    # 1,000 subscribers, the target's; bench/fanout.py's own default is 1,000 WS + 1,000 SSE
    _external(
        run,
        "fanout",
        "fanout",
        "run_fanout",
        {"n_ws": 100, "n_sse": 100, "events": 100},
        {"n_ws": 500, "n_sse": 500},
    )


def _redis(run: RunState) -> None:
    _external(run, "redis", "redis_hub", "run_redis_bench", {"runs": 20, "events": 50})


def _workers(run: RunState) -> None:
    _external(
        run,
        "workers",
        "workers",
        "run_workers",
        {"runs": 2, "per_run": 200, "events": 500, "paced": 200, "paced_events": 200, "rounds": 1},
    )


def _gateway(run: RunState) -> None:
    from .gateway import gateway_markdown, run_gateway

    a = run.args
    ks = a.gateway_ks or ([10, 100] if a.quick else None)
    section = run_gateway(ks, repeats=a.rounds or (1 if a.quick else 3), progress=_progress)
    run.record("gateway", section, {"gateway": gateway_markdown(section)})


def _telemetry(run: RunState) -> None:
    from .telemetry import run_telemetry, telemetry_markdown

    a = run.args
    section = run_telemetry(rounds=a.rounds or (3 if a.quick else 5), progress=_progress)
    run.record("telemetry", section, {"telemetry": telemetry_markdown(section)})


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> None:
    """Parse the command line (as `prog` names the command) and run the chosen benchmarks."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = (
        "core",
        "pipeline",
        "peers",
        "ttfd",
        "firstbyte",
        "turns",
        "memory",
        "fanout",
        "redis",
        "workers",
        "gateway",
        "telemetry",
        "all",
    )
    parser.add_argument("command", nargs="?", default="all", choices=commands)
    parser.add_argument("--quick", action="store_true", help="a short run (about 2 minutes)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (core 7, pipeline 5)")
    parser.add_argument("--peer-rounds", type=int, help="rounds with the peers (default 3)")
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        help="fragment events per stream, comma-separated (default 1000,20000)",
    )
    parser.add_argument("--kind", action="append", help="only this stream kind (repeatable)")
    parser.add_argument("--fragments", type=int, help="core: events per stream (20000)")
    parser.add_argument(
        "--iterations", type=int, help="ttfd: turns per contestant (200); firstbyte: rounds (300)"
    )
    parser.add_argument("--turns", type=int, help="turns: concurrent turns (1000)")
    parser.add_argument("--events", type=int, help="turns: events per turn (100)")
    parser.add_argument("--period", type=float, default=0.5, help="turns: seconds between reads")
    parser.add_argument("--memory-turns", type=int, help="memory: concurrent turns (200)")
    parser.add_argument(
        "--memory-events", type=int, default=500, help="memory: events per turn (500)"
    )
    parser.add_argument("--fanout", action="store_true", help="all: run the fan-out benchmark")
    parser.add_argument("--redis", action="store_true", help="all: run the Redis benchmark")
    parser.add_argument(
        "--workers", action="store_true", help="all: run the workers benchmark (1 and 2 processes)"
    )
    parser.add_argument(
        "--gateway-ks",
        type=lambda s: [int(x) for x in s.split(",")],
        help="gateway: concurrent streams per window (10,100,300,500,1000)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; write no files")
    parser.add_argument("--no-charts", action="store_true", help="do not redraw the charts")
    args = parser.parse_args(argv)
    if args.kind:
        unknown = [k for k in args.kind if k not in CORE_KINDS]
        if unknown:
            parser.error(f"unknown stream kind(s) {unknown}; known: {', '.join(CORE_KINDS)}")
    run = RunState(args)
    c = args.command
    if c in ("core", "all"):
        _core(run)
    if c in ("pipeline", "peers", "all"):
        _throughput(run, every_kind=c != "peers", peers=c != "pipeline")
    if c in ("ttfd", "all"):
        _ttfd(run)
    if c in ("firstbyte", "all"):
        _firstbyte(run)
    if c in ("turns", "all"):
        _turns(run)
    if c in ("memory", "all"):
        _memory(run)
    if c in ("gateway", "all"):
        _gateway(run)
    if c in ("telemetry", "all"):
        _telemetry(run)
    if c == "fanout" or (c == "all" and args.fanout):
        _fanout(run)
    if c == "redis" or (c == "all" and args.redis):
        _redis(run)
    if c == "workers" or (c == "all" and args.workers):
        _workers(run)
    run.finish()
    print(f"done in {time.monotonic() - _START:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
