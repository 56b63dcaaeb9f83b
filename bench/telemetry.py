"""What OpenTelemetry costs a turn: nothing when no provider is configured.

Each configuration runs in a fresh child process (`python -m bench.telemetry --mode ...`, which
prints JSON), one turn after another (`run_turn`, the full pipeline, on an in-memory transport
answering an OpenAI Chat text stream), and reports the median wall time of a turn:

- `bare`: OpenTelemetry is not imported at all (rillet without the `otel` extra).
- `off`: the OpenTelemetry API is imported, no provider configured (its default no-op ones):
  the extra installed and unused. A turn asks once whether a provider is set, and does no
  telemetry work after that.
- `on`: the SDK's tracer and meter providers, set globally, spans going to a processor that
  drops them: what tracing itself costs.

The modes run interleaved for several rounds; the ratios `off / bare` and `on / bare` are of
medians measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

__all__ = ["MODES", "main", "run_telemetry", "telemetry_markdown"]

MODES = ("bare", "off", "on")
HERE = Path(__file__).parent


def _configure(mode: str) -> None:
    if mode == "bare":
        return
    import opentelemetry.metrics
    import opentelemetry.trace

    if mode == "on":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

        tracers = TracerProvider()
        tracers.add_span_processor(SpanProcessor())  # the base class drops every span
        opentelemetry.trace.set_tracer_provider(tracers)
        opentelemetry.metrics.set_meter_provider(MeterProvider())


async def _turns(turns: int, events: int) -> list[float]:
    from rillet import run_turn

    from .contestants import http_client, provider_for, request
    from .wire import build_stream

    stream = build_stream("openai-chat", events)
    provider = provider_for(stream.dialect)
    req = request()
    times: list[float] = []
    async with http_client(stream) as client:
        for _ in range(20):  # warm-up
            await run_turn(req, provider, client=client)
        for _ in range(turns):
            start = time.perf_counter()
            result = await run_turn(req, provider, client=client)
            times.append(time.perf_counter() - start)
            assert result.ok, result.error
    return times


def _child(mode: str, turns: int, events: int) -> dict[str, Any]:
    _configure(mode)
    loaded = "opentelemetry.trace" in sys.modules
    times = trio.run(_turns, turns, events)
    return {
        "mode": mode,
        "otel_imported": loaded,
        "turns": turns,
        "events": events,
        "median_us": statistics.median(times) * 1e6,
    }


def run_telemetry(
    rounds: int = 5, turns: int = 300, events: int = 100, progress: Any = None
) -> dict[str, Any]:
    """Every mode `rounds` times, interleaved, each in a fresh process: per-mode medians of
    the rounds' median µs per turn, and the ratios to `bare`."""
    found: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in MODES:
            if progress is not None:
                progress(f"telemetry: round {r + 1}/{rounds}, {mode}")
            cmd = [sys.executable, "-m", "bench.telemetry", "--mode", mode]
            cmd += ["--turns", str(turns), "--events", str(events)]
            done = subprocess.run(
                cmd, cwd=HERE.parent, capture_output=True, text=True, timeout=600, check=True
            )
            line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("{"))
            found[mode].append(json.loads(line)["median_us"])
    medians = {mode: statistics.median(values) for mode, values in found.items()}
    return {
        "rounds": rounds,
        "turns": turns,
        "events": events,
        "median_us": medians,
        "per_round_us": found,
        "off_over_bare": medians["off"] / medians["bare"],
        "on_over_bare": medians["on"] / medians["bare"],
    }


def telemetry_markdown(section: dict[str, Any]) -> str:
    """The section of RESULTS.md."""
    m = section["median_us"]
    return "\n".join(
        [
            "## OpenTelemetry's cost per turn",
            "",
            f"`python -m bench telemetry` — one turn after another (`run_turn`, "
            f"{section['events']} fragment events of an OpenAI Chat stream, in-memory "
            f"transport), {section['turns']} turns per process, {section['rounds']} interleaved "
            "rounds, each mode in a fresh process; medians of the rounds' median µs per turn. "
            "`bare`: OpenTelemetry not imported; `off`: its API imported, no provider "
            "configured; `on`: the SDK's providers, spans dropped.",
            "",
            "| mode | µs/turn | ÷ bare |",
            "|---|---:|---:|",
            f"| bare | {m['bare']:.0f} | 1.00 |",
            f"| off | {m['off']:.0f} | {section['off_over_bare']:.2f} |",
            f"| on | {m['on']:.0f} | {section['on_over_bare']:.2f} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.telemetry --mode MODE`: one configuration, its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--events", type=int, default=100)
    args = parser.parse_args(argv)
    print(json.dumps(_child(args.mode, args.turns, args.events)))


if __name__ == "__main__":
    main()
