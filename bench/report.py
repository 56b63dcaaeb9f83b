"""What a run leaves behind: bench/out/results.json (every figure, merged run over run, one
section per benchmark) and the Markdown sections of bench/RESULTS.md, with the targets judged
from the figures of the same run."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import textwrap
from pathlib import Path
from typing import Any

from .firstbyte_report import FIRSTBYTE_GOAL, firstbyte_markdown

__all__ = [
    "FIRSTBYTE_GOAL",
    "OUT",
    "RESULTS",
    "RESULTS_JSON",
    "core_markdown",
    "firstbyte_markdown",
    "load_results",
    "machine",
    "memory_markdown",
    "peers_markdown",
    "pipeline_markdown",
    "replace_section",
    "save_results",
    "ttfd_markdown",
    "turns_markdown",
]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
OUT = HERE / "out"
RESULTS_JSON = OUT / "results.json"

LABELS = {
    "limit": "limit loop",
    "limit-httpx": "limit loop via httpx",
    "limit-sync": "limit loop via sync httpx (peers' process)",
    "core": "rillet core (one task)",
    "pipeline": "rillet run_turn",
    "jsonl": "rillet open_turn + JSONL sink",
    "pipeline-hops": "rillet run_turn, hops mode",
    "pipeline-16k": "rillet run_turn, 16 KiB reads",
    "openai-iter": "OpenAI SDK iterator",
    "openai-helper": "OpenAI SDK stream helper",
    "anthropic-iter": "Anthropic SDK iterator",
    "anthropic-helper": "Anthropic SDK stream helper",
    "litellm": "LiteLLM",
    "mmsp": "MMSP 0.5.6",
}


def replace_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section between `<!-- name -->` markers in RESULTS.md."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = path.read_text("utf-8") if path.exists() else "# Benchmark results\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, "utf-8")


def load_results(path: Path = RESULTS_JSON) -> dict[str, Any]:
    """The figures of earlier runs (each benchmark keeps its latest section)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data


def save_results(data: dict[str, Any], path: Path = RESULTS_JSON) -> None:
    """Write results.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str), "utf-8")


def machine() -> dict[str, Any]:
    """Where and when: what a reader needs to weigh the figures."""
    return {
        "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _f(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _where(section: dict[str, Any]) -> str:
    m = section.get("machine", {})
    load = m.get("load_average")
    load_s = f", load average {load[0]}" if load else ""
    return f"{m.get('at', '?')}; Python {m.get('python', '?')}, {m.get('cpus', '?')} CPUs{load_s}"


# --- core -----------------------------------------------------------------------------------------


def core_markdown(section: dict[str, Any]) -> str:
    """The core-decode table."""
    lines = [
        "## Core decode in one task",
        "",
        f"`python -m bench core` — {section['fragments']:,} fragment events per stream, "
        "network-sized reads that cut events and UTF-8 characters; median CPU time of "
        f"{section['rounds']} interleaved rounds ({_where(section)}). Ratio = rillet's "
        "events/s ÷ the limit loop's (target: rillet's µs/event within 1.3× the limit's, a "
        "ratio ≥ 0.77).",
        "",
        "| stream | limit µs/event | rillet µs/event | limit events/s | rillet events/s | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in section["results"]:
        lines.append(
            f"| {r['kind']} | {r['limit_us_per_event']:.2f} | {r['rillet_us_per_event']:.2f} | "
            f"{r['limit_events_per_s']:,.0f} | {r['rillet_events_per_s']:,.0f} | "
            f"{r['ratio']:.2f} |"
        )
    return "\n".join(lines)


# --- throughput -----------------------------------------------------------------------------------


def _series(section: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(s["contestant"], s["stream"]): s for s in section.get("series", [])}


def _cell(s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    if s.get("unavailable"):
        return "not available"
    if s.get("error"):
        return "invalid"
    return _f(s.get("us_per_event"), 2 if (s.get("us_per_event") or 0) < 10 else 1)


def pipeline_markdown(section: dict[str, Any]) -> str:
    """rillet's contestants against the limit loops, per stream."""
    table = _series(section)
    names = ["limit", "limit-httpx", "core", "pipeline", "pipeline-hops", "jsonl", "pipeline-16k"]
    lines = [
        "## rillet against the limit",
        "",
        f"`python -m bench pipeline` — CPU µs per fragment event, median of {section['rounds']} "
        f"interleaved rounds ({_where(section)}). Every contestant reads the same bytes through "
        "an in-memory httpx transport (the limit and core loops take the reads directly) and "
        "must assemble the same reply. The last three columns divide by the limit loop, and hops "
        'mode (every actor on its own task, `Policy(graph="hops")`) by the default. The \'16 KiB '
        "reads' column (a diagnostic) feeds `run_turn` the same bytes in 16 KiB reads: the "
        "difference from `run_turn` is what rillet pays per read rather than per event.",
        "",
        "| stream | " + " | ".join(LABELS[n] for n in names) + " | run_turn ÷ limit "
        "| JSONL ÷ limit | hops ÷ run_turn |",
        "|---|" + "---:|" * (len(names) + 3),
    ]
    errors = []
    for st in section["streams"]:
        cells = [_cell(table.get((n, st["name"]))) for n in names]
        limit = table.get(("limit", st["name"]), {}).get("us_per_event")
        ratios = []
        for n in ("pipeline", "jsonl"):
            us = table.get((n, st["name"]), {}).get("us_per_event")
            ratios.append(f"{us / limit:.1f}×" if us and limit else "–")
        ours = table.get(("pipeline", st["name"]), {}).get("us_per_event")
        hop = table.get(("pipeline-hops", st["name"]), {}).get("us_per_event")
        ratios.append(f"{hop / ours:.2f}×" if hop and ours else "–")
        lines.append(f"| {st['name']} | " + " | ".join(cells + ratios) + " |")
        for n in names:
            s = table.get((n, st["name"]))
            if s and s.get("error"):
                errors.append(f"- {LABELS[n]} on {st['name']}: {s['error']}")
    if errors:
        lines += ["", "Invalid rows:", *errors]
    return "\n".join(lines)


_FAMILIES = {
    "OpenAI Chat Completions streams": (
        "openai-chat",
        ["pipeline", "limit-sync", "openai-iter", "openai-helper", "litellm", "mmsp"],
    ),
    "Anthropic Messages streams": (
        "anthropic",
        ["pipeline", "limit-sync", "anthropic-iter", "anthropic-helper", "mmsp"],
    ),
}


def _ours(table: dict[tuple[str, str], dict[str, Any]], peer: str, stream: str) -> float | None:
    """rillet's run_turn µs/event to divide `peer`'s by: the rounds run in the peers' process
    alongside that peer when there are any, else (older runs) those of rillet's process."""
    paired = table.get((f"pipeline:{peer}", stream), {}).get("us_per_event")
    if paired:
        return float(paired)
    if any(c.startswith("pipeline:") for c, _ in table):
        return None  # paired rounds were run, but not for this one: no cross-process ratio
    mine = table.get(("pipeline", stream), {}).get("us_per_event")
    return float(mine) if mine else None


def peers_markdown(section: dict[str, Any]) -> str:
    """The peers against rillet's full pipeline, per stream."""
    table = _series(section)
    versions = section.get("peer_versions") or {}
    vs = ", ".join(f"{k} {v}" for k, v in versions.items() if k != "python")
    lines = [
        "## rillet against what users would pick instead",
        "",
        f"`python -m bench peers` — CPU µs per fragment event, median of "
        f"{section['peer_rounds']} rounds interleaved with rillet's ({_where(section)}). "
        f"Peers run in their own virtualenv ({vs or 'versions unknown'}), one process a round, "
        "on the same bytes through an in-memory httpx transport, each timed from the request to "
        "its assembled final reply (text, thinking, tool arguments; checked against the "
        "stream's). In brackets: how many times rillet's `run_turn` (full actor pipeline) is "
        "faster, both timed in the peers' process, rillet's round right before or after that "
        "peer's on the same stream (alternating by round). The rillet column is its run_turn in "
        "its own process. The limit column is the same limit loop run in the peers' process: "
        "the floor there, as the limit loop is in rillet's.",
    ]
    unavailable = {}
    errors = []
    for title, (prefix, names) in _FAMILIES.items():
        streams = [s for s in section["streams"] if s["kind"].startswith(prefix)]
        if not streams:
            continue
        lines += [
            "",
            f"### {title}",
            "",
            "| stream | " + " | ".join(LABELS[n] for n in names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        for st in streams:
            cells = []
            for n in names:
                s = table.get((n, st["name"]))
                cell = _cell(s)
                us = s.get("us_per_event") if s else None
                if s and s.get("unavailable"):
                    unavailable[n] = s["unavailable"]
                if s and s.get("error"):
                    errors.append(f"- {LABELS[n]} on {st['name']}: {s['error']}")
                ours = _ours(table, n, st["name"])
                if not n.startswith(("pipeline", "limit")) and us and ours:
                    cell += f" ({us / ours:.1f}×)"
                cells.append(cell)
            lines.append(f"| {st['name']} | " + " | ".join(cells) + " |")
    notes = [f"- {LABELS.get(n, n)}: not available — {why}" for n, why in unavailable.items()]
    notes += errors
    notes += [f"- {n}" for n in section.get("peer_notes", [])]
    if "litellm" not in unavailable:
        notes.append(
            "- LiteLLM runs the 1,000-event streams only: at a few ms an event, a 20,000-event "
            "stream would take about a minute a round."
        )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


# --- time to first delta --------------------------------------------------------------------------


def ttfd_markdown(section: dict[str, Any]) -> str:
    """Time to first delta, rillet against the limit."""
    by = {(r["contestant"], r["kind"]): r for r in section["results"]}
    kinds = list(dict.fromkeys(r["kind"] for r in section["results"]))
    lines = [
        "## Time to first delta",
        "",
        f"`python -m bench ttfd` — wall µs from the transport handing over the read that holds "
        f"the first text fragment to that fragment reaching a sink; median (p10–p90) of "
        f"{section['iterations']} turns per contestant, interleaved ({_where(section)}). "
        "Target: rillet within 40 µs of the limit loop. `+4k`: a 4 KB first read holding the "
        "first fragment and a dozen or more frames after it (the limit loop decodes it all "
        "before it stamps).",
        "",
        "| stream | limit loop via httpx | rillet run_turn | rillet open_turn + JSONL | "
        "run_turn − limit | JSONL − limit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        cells = []
        for c in ("limit-httpx", "pipeline", "jsonl"):
            r = by.get((c, kind))
            if r is None or r.get("error"):
                cells.append("invalid" if r else "–")
            else:
                cells.append(f"{r['median_us']:.0f} ({r['p10_us']:.0f}–{r['p90_us']:.0f})")
        base = by.get(("limit-httpx", kind), {}).get("median_us")
        for c in ("pipeline", "jsonl"):
            m = by.get((c, kind), {}).get("median_us")
            cells.append(f"{m - base:.0f}" if m is not None and base is not None else "–")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- concurrent turns -----------------------------------------------------------------------------


def turns_markdown(section: dict[str, Any]) -> str:
    """1,000 concurrent turns."""
    lines = [
        "## Concurrent turns in one process",
        "",
        f"`python -m bench turns` — `run_turn` (full pipeline) many times at once, one shared "
        f"httpx client on an in-memory transport, OpenAI Chat text streams; each mode in a fresh "
        f"process ({_where(section)}). Loop lag: how late a 10 ms ticker wakes. Memory: peak "
        "resident memory minus the resident memory before the turns start, per turn. "
        "`paced`: reads arrive one per turn per period, spread evenly, turns start over the "
        "first second (the realistic load: every turn is in flight at once); `burst`: every "
        "turn starts at once and reads as fast as the CPU allows (saturation).",
        "",
        "| mode | turns | events/turn | offered events/s | events/s (wall) | CPU µs/event "
        "| lag p50 ms | lag p99 ms | lag max ms | KiB/turn | replies ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in ("paced", "burst"):
        r = section.get(mode)
        if not r:
            continue
        if r.get("error"):
            lines.append(f"| {mode} | failed: {r['error']} |||||||||")
            continue
        offered = r.get("offered_events_per_s")
        lines.append(
            f"| {mode} | {r['turns']:,} | {r['events_per_turn']} | "
            f"{_f(offered, 0) if offered else 'as fast as possible'} | "
            f"{r['events_per_s_wall']:,.0f} | {r['cpu_us_per_event']:.1f} | "
            f"{r['lag_p50_ms']:.1f} | {r['lag_p99_ms']:.1f} | {r['lag_max_ms']:.1f} | "
            f"{r['kib_per_turn']:.1f} | {r['ok']:,}/{r['turns']:,} |"
        )
    return "\n".join(lines)


def workers_markdown(section: dict[str, Any]) -> str:
    """bench/workers.py's section: 1 and 2 server processes on one port."""

    def ms(value: float) -> str:
        return "–" if value is None or math.isnan(value) else f"{value:.1f}"

    paced = [p for p in section["phases"] if p["phase"] != "saturation"]
    stamped = bool(paced) and all(p.get("kernel_stamps") for p in paced)
    arrival = (
        "the kernel's receive timestamp of the read (`SO_TIMESTAMPNS`)"
        if stamped
        else "`recv` (no kernel timestamps here)"
    )
    rows = [
        "## Workers",
        "",
        "`python -m bench workers` (bench/workers.py): `serve` with 1 and 2 worker processes on",
        "one port (SO_REUSEPORT), runs shared through a local `redis-server`; the subscribers",
        "in one process of plain sockets and epoll that counts events with `bytes.count` and",
        "parses nothing else. Saturation: every run's fragments sent at once, deliveries/s =",
        "events received / (last `run.done` - provider start). Paced: one run at the stream's",
        f"rate, delay = {arrival} - the provider's scheduled send of that event (one monotonic",
        "clock), the first event of each read timed (the read's oldest). CPU as a share of one",
        "core, from the provider's start to the last `run.done` (sampled by the subscribers'",
        f"process); the machine has {section['cpus']} (load average {section['load']:.1f} before).",
        "",
        "| workers | phase | subscribers | events each | deliveries/s | complete | p50 ms "
        "| p99 ms | max ms | server CPU | deliveries per server core-s | client CPU | spread "
        "| rounds (deliveries/s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for p in section["phases"]:
        rows.append(
            f"| {p['workers']} | {p['phase']} | {p['subscribers']:,} | {p['events']:,} | "
            f"{p['deliveries_per_s']:,.0f} | {p['complete']:,}/{p['subscribers']:,} | "
            f"{ms(p['p50_ms'])} | {ms(p['p99_ms'])} | {ms(p['max_ms'])} | "
            f"{p['server_cpu']:.0%} | {_per_core(p)} | {p['client_cpu']:.0%} | "
            f"{' / '.join(map(str, p['spread']))} | "
            f"{', '.join(f'{r:,}' for r in p.get('rounds') or []) or '–'} |"
        )
    speedup = _workers_speedup(section)
    rows += [
        "",
        "Spread: the runs each worker started (saturation: dealt out in turn), the subscribers",
        "each served (paced: where the kernel put them). Saturation runs interleaved rounds of",
        "1 and 2 workers; the row is the median round. Deliveries per server core-second",
        "divide deliveries/s by the workers' CPU share: the cost of a delivery, whatever else",
        "the machine ran.",
    ]
    if speedup is not None:
        rows.append(f"Saturated deliveries/s, 2 workers ÷ 1: {speedup:.2f}× (target ≥ 1.7×).")
    rows += _workers_ceiling(section)
    if section.get("note"):
        rows.append(section["note"])
    return "\n".join(rows)


def _workers_ceiling(section: dict[str, Any]) -> list[str]:
    """What the machine left the workers: every process's CPU in each saturated run, and the
    most the speedup could be at one worker's cost per delivery."""
    sat = {p["workers"]: p for p in section["phases"] if p["phase"] == "saturation"}
    if (
        1 not in sat
        or len(sat) < 2
        or any(math.isnan(p.get("machine_cpu", math.nan)) for p in sat.values())
    ):
        return []
    one, most = sat[1], sat[max(sat)]
    cpus = section["cpus"]
    others = most["machine_cpu"] - most["server_cpu"]
    ceiling = (
        one["deliveries_per_s"] / one["server_cpu"] * (cpus - others) / one["deliveries_per_s"]
    )
    used = ", ".join(
        f"{n} worker{'s' if n > 1 else ''} {p['machine_cpu']:.0%} "
        f"(the workers {p['server_cpu']:.0%})"
        for n, p in sorted(sat.items())
    )
    return [
        f"Every process on the machine, saturated: {used} of the {cpus * 100}% its {cpus} cores "
        f"have. With {max(sat)} workers the other processes (subscribers, Redis, the provider) "
        f"used {others:.0%}: at one worker's cost per delivery, what was left allows at most "
        f"{ceiling:.2f}× one worker's deliveries/s on this machine.",
    ]


def _per_core(phase: dict[str, Any]) -> str:
    """Deliveries per second of the workers' CPU time: what a core buys, whatever else ran."""
    cpu = phase["server_cpu"]
    return "–" if not cpu or math.isnan(cpu) else f"{phase['deliveries_per_s'] / cpu:,.0f}"


def _workers_speedup(section: dict[str, Any]) -> float | None:
    """Saturated deliveries/s with the most workers ÷ with one."""
    sat = {
        p["workers"]: p["deliveries_per_s"]
        for p in section.get("phases") or []
        if p["phase"] == "saturation"
    }
    if 1 not in sat or len(sat) < 2 or not sat[1]:
        return None
    return float(sat[max(sat)] / sat[1])


# --- memory per turn ------------------------------------------------------------------------------

MEMORY_TARGETS = {False: 32.0, True: 120.0}
"""KiB a finished 500-event turn may keep, without its history and with it (the default)."""


def memory_markdown(section: dict[str, Any]) -> str:
    """Memory per turn: retained, peak in flight, RSS growth."""
    rows = section.get("rows", [])
    turns = rows[0]["turns"] if rows else 0
    events = rows[0]["events"] if rows else 0
    lines = [
        "## Memory per turn",
        "",
        f"`python -m bench memory` — {turns:,} turns of {events:,} text fragment events each, "
        "run at once through `open_turn` (the full pipeline) over one shared httpx client on an "
        "in-memory transport; each read after a body's first waits one scheduler round, so "
        "every turn is in flight at once. Each turn's `Turn` handle (and its `TurnResult`) is "
        "held until all have ended. Every figure comes from a fresh process after a warm-up "
        f"({_where(section)}). **Retained**: tracemalloc's traced bytes once every turn has "
        "ended and a full collection ran, less those before the turns, ÷ turns: what a finished "
        "turn keeps (the targets judge this). **Peak in flight**: tracemalloc's peak while the "
        "turns run, less the bytes before, ÷ turns (it includes, per turn, the request and "
        "response objects, the tasks, and the text's transient copies as the last lane closes). "
        "**RSS growth**: in its own process without tracemalloc, peak resident memory while "
        "the turns run less that before, ÷ turns (a cross-check). The answer text of these "
        "streams is about 5,600 characters with emoji: 22 KiB as one Python string.",
        "",
        "| stream | history | retained KiB/turn | peak in flight KiB/turn | RSS growth KiB/turn "
        "| replies ok |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['kind']} | {_history(r)} | failed: {r['error']} ||||")
            continue
        lines.append(
            f"| {r['kind']} | {_history(r)} | {_f(r.get('retained_kib_per_turn'))} | "
            f"{_f(r.get('peak_kib_per_turn'))} | {_f(r.get('rss_kib_per_turn'))} | "
            f"{r.get('ok', 0):,}/{r['turns']:,} |"
        )
    return "\n".join(lines)


def _history(row: dict[str, Any]) -> str:
    return "kept (default)" if row["history"] else "`history=False`"


def for_terminal(markdown: str, width: int = 100) -> str:
    """A section as a terminal shows it within `width` columns: prose wrapped, and a table
    whose rows are wider than that shown as one block per row (`column: value` lines), so no
    line runs past the edge. RESULTS.md keeps the markdown as it is."""
    out: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            table = []
            while i < len(lines) and lines[i].startswith("|"):
                table.append(lines[i])
                i += 1
            out.extend(_table_for_terminal(table, width))
            continue
        if len(line) > width and not line.startswith(("```", "    ")):
            indent = " " * (len(line) - len(line.lstrip(" -*")))
            out.extend(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _table_for_terminal(table: list[str], width: int) -> list[str]:
    if all(len(row) <= width for row in table) or len(table) < 2:
        return table
    header = _cells(table[0])
    rows = [_cells(row) for row in table[2:]]  # past the |---| line
    out: list[str] = []
    for cells in rows:
        out.append("")
        for name, value in zip(header, cells, strict=False):
            label = f"  {name}: " if name else "  "
            wrapped = textwrap.wrap(value, max(20, width - len(label))) or [""]
            out.append(label + wrapped[0])
            out.extend(" " * len(label) + more for more in wrapped[1:])
    return out
