"""What a run leaves behind: bench/out/results.json (every figure, merged run over run, one
section per benchmark) and the Markdown sections of bench/RESULTS.md, with the targets judged
from the figures of the same run."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OUT",
    "RESULTS",
    "RESULTS_JSON",
    "Target",
    "core_markdown",
    "judge_targets",
    "load_results",
    "machine",
    "memory_markdown",
    "peers_markdown",
    "pipeline_markdown",
    "replace_section",
    "save_results",
    "targets_markdown",
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
        "events/s ÷ the limit loop's (target ≥ 0.50).",
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
    names = ["limit", "limit-httpx", "core", "pipeline", "jsonl", "pipeline-16k"]
    lines = [
        "## rillet against the limit",
        "",
        f"`python -m bench pipeline` — CPU µs per fragment event, median of {section['rounds']} "
        f"interleaved rounds ({_where(section)}). Every contestant reads the same bytes through "
        "an in-memory httpx transport (the limit and core loops take the reads directly) and "
        "must assemble the same reply. The last two columns divide by the limit loop. The '16 KiB "
        "reads' column (a diagnostic) feeds `run_turn` the same bytes in 16 KiB reads: the "
        "difference from `run_turn` is what rillet pays per read rather than per event.",
        "",
        "| stream | " + " | ".join(LABELS[n] for n in names) + " | run_turn ÷ limit "
        "| JSONL ÷ limit |",
        "|---|" + "---:|" * (len(names) + 2),
    ]
    errors = []
    for st in section["streams"]:
        cells = [_cell(table.get((n, st["name"]))) for n in names]
        limit = table.get(("limit", st["name"]), {}).get("us_per_event")
        ratios = []
        for n in ("pipeline", "jsonl"):
            us = table.get((n, st["name"]), {}).get("us_per_event")
            ratios.append(f"{us / limit:.1f}×" if us and limit else "–")
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
        "Target: rillet within 150 µs of the limit loop. `+4k`: a 4 KB first read holding the "
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


def _memory_targets(section: dict[str, Any] | None) -> list[Target]:
    out = []
    for history, goal in MEMORY_TARGETS.items():
        label = "kept" if history else "history=False"
        name = f"memory a finished turn keeps, 500 events, {label}"
        rows = [
            r
            for r in (section or {}).get("rows", [])
            if r["history"] is history and r.get("retained_kib_per_turn") is not None
        ]
        if not rows:
            out.append(Target(name, f"≤ {goal:g} KiB", "not measured", None, "–"))
            continue
        worst = max(rows, key=lambda r: r["retained_kib_per_turn"])
        v = worst["retained_kib_per_turn"]
        out.append(
            Target(
                name,
                f"≤ {goal:g} KiB",
                f"{v:.1f} KiB (worst: {worst['kind']})",
                v <= goal,
                f"{goal - v:.1f} KiB to spare" if v <= goal else f"over by {v - goal:.1f} KiB",
                ", ".join(
                    f"{r['kind']}: {r['retained_kib_per_turn']:.1f} KiB retained, "
                    f"{_f(r.get('peak_kib_per_turn'))} KiB peak in flight"
                    for r in rows
                ),
            )
        )
    return out


# --- targets --------------------------------------------------------------------------------------


@dataclass
class Target:
    """One target judged from measured figures."""

    name: str
    goal: str
    measured: str
    met: bool | None  # None: not measured in this run
    margin: str
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """For results.json."""
        return dict(self.__dict__)


def _largest(table: dict[tuple[str, str], dict[str, Any]], name: str, prefix: str) -> list[str]:
    """The streams of a family at the largest size `name` has a valid figure for."""
    have = [
        s
        for (c, s), row in table.items()
        if c == name and row["kind"].startswith(prefix) and row.get("us_per_event")
    ]
    if not have:
        return []
    top = max(table[(name, s)]["events"] for s in have)
    return sorted(s for s in have if table[(name, s)]["events"] == top)


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


def _peer_target(
    table: dict[tuple[str, str], dict[str, Any]],
    peer: str,
    prefixes: tuple[str, ...],
    at_least: float,
) -> Target:
    name = f"{LABELS['pipeline']} vs {LABELS[peer]}"
    goal = f"≥ {at_least:g}× faster" if at_least > 1 else "faster"
    ratios: dict[str, float] = {}
    for prefix in prefixes:
        for stream in _largest(table, peer, prefix):
            ours = _ours(table, peer, stream)
            if ours:
                ratios[stream] = table[(peer, stream)]["us_per_event"] / ours
    if not ratios:
        why = next(
            (r.get("unavailable") or r.get("error") for (c, _), r in table.items() if c == peer),
            None,
        )
        return Target(name, goal, "not measured", None, "–", why or "")
    worst = min(ratios, key=ratios.__getitem__)
    value = ratios[worst]
    met = value >= at_least if at_least > 1 else value > 1
    margin = f"{value / at_least:.2f}× the goal" if met else f"short by {at_least / value:.2f}×"
    detail = ", ".join(f"{s}: {r:.1f}×" for s, r in sorted(ratios.items()))
    return Target(name, goal, f"{value:.1f}× (worst: {worst})", met, margin, detail)


def judge_targets(results: dict[str, Any]) -> list[Target]:
    """Every target, judged from the latest figures of each benchmark."""
    out: list[Target] = []
    tp = results.get("pipeline")
    table = _series(tp) if tp else {}
    # the full pipeline against the limit loop at the largest size
    ratios = {}
    if table:
        top = max(s["events"] for s in tp["streams"]) if tp and tp["streams"] else 0
        for st in tp["streams"] if tp else []:
            if st["events"] != top:
                continue
            ours = table.get(("pipeline", st["name"]), {}).get("us_per_event")
            limit = table.get(("limit", st["name"]), {}).get("us_per_event")
            if ours and limit:
                ratios[st["name"]] = ours / limit
    name = "run_turn µs/event ÷ limit loop's, largest streams"
    if ratios:
        worst = max(ratios, key=ratios.__getitem__)
        v = ratios[worst]
        out.append(
            Target(
                name,
                "≤ 4×",
                f"{v:.1f}× (worst: {worst})",
                v <= 4,
                f"{4 / v:.2f}× the goal" if v <= 4 else f"over by {v / 4:.2f}×",
                ", ".join(f"{s}: {r:.1f}×" for s, r in sorted(ratios.items())),
            )
        )
    else:
        out.append(Target(name, "≤ 4×", "not measured", None, "–"))
    peers = results.get("peers")
    table = _series(peers) if peers else {}
    openai, anthropic = ("openai-chat",), ("anthropic",)
    out.append(_peer_target(table, "openai-iter", openai, 10))
    out.append(_peer_target(table, "openai-helper", openai, 20))
    out.append(_peer_target(table, "anthropic-iter", anthropic, 2))
    out.append(_peer_target(table, "litellm", openai, 100))
    out.append(_peer_target(table, "mmsp", (*openai, *anthropic), 1))
    # time to first delta
    ttfd = results.get("ttfd")
    name = "time to first delta, run_turn − limit loop"
    if ttfd:
        by = {(r["contestant"], r["kind"]): r for r in ttfd["results"]}
        extra = {}
        for (c, kind), r in by.items():
            base = by.get(("limit-httpx", kind))
            if c == "pipeline" and base and not r.get("error") and not base.get("error"):
                extra[kind] = r["median_us"] - base["median_us"]
        if extra:
            worst = max(extra, key=extra.__getitem__)
            v = extra[worst]
            out.append(
                Target(
                    name,
                    "< 150 µs",
                    f"{v:.0f} µs (worst: {worst})",
                    v < 150,
                    f"{150 - v:.0f} µs to spare" if v < 150 else f"over by {v - 150:.0f} µs",
                    ", ".join(f"{k}: {x:.0f} µs" for k, x in extra.items()),
                )
            )
    else:
        out.append(Target(name, "< 150 µs", "not measured", None, "–"))
    # concurrent turns
    turns = results.get("turns", {})
    paced = turns.get("paced")
    if paced and not paced.get("error"):
        n = paced["turns"]
        v = paced["lag_p99_ms"]
        out.append(
            Target(
                f"{n:,} paced turns: loop lag p99",
                "< 50 ms",
                f"{v:.1f} ms",
                v < 50,
                f"{50 - v:.1f} ms to spare" if v < 50 else f"over by {v - 50:.1f} ms",
            )
        )
        v = paced["kib_per_turn"]
        out.append(
            Target(
                f"{n:,} paced turns: peak memory per turn",
                "< 100 KiB",
                f"{v:.1f} KiB",
                v < 100,
                f"{100 - v:.1f} KiB to spare" if v < 100 else f"over by {v - 100:.1f} KiB",
            )
        )
    else:
        out.append(Target("concurrent turns: loop lag p99", "< 50 ms", "not measured", None, "–"))
        out.append(
            Target("concurrent turns: memory per turn", "< 100 KiB", "not measured", None, "–")
        )
    out += _memory_targets(results.get("memory"))
    # fan-out: the first phase (every subscriber at stream pace)
    fan = (results.get("fanout") or {}).get("result") or {}
    phases = fan.get("phases") or []
    name = "fan-out p99 delay, 50 events/s"
    if phases:
        p = phases[0]
        v = p["p99_ms"]
        subs = p["n_ws"] + p["n_sse"]
        out.append(
            Target(
                f"{name}, {subs:,} subscribers ({p['n_ws']:,} WS + {p['n_sse']:,} SSE)",
                "< 50 ms",
                f"{v:.1f} ms",
                v < 50 and subs >= 1000,
                f"{50 - v:.1f} ms to spare" if v < 50 else f"over by {v - 50:.1f} ms",
            )
        )
    else:
        out.append(Target(name, "< 50 ms", "not measured", None, "–"))
    # the turn's own target: the whole pipeline against the same decode in one task
    name = "run_turn events/s ÷ core decode's (openai-chat, largest)"
    if table_tp := (_series(tp) if tp else {}):
        top = max(s["events"] for s in tp["streams"]) if tp and tp["streams"] else 0
        stream = f"openai-chat@{top}"
        ours = table_tp.get(("pipeline", stream), {}).get("us_per_event")
        core_us = table_tp.get(("core", stream), {}).get("us_per_event")
        if ours and core_us:
            v = core_us / ours
            out.append(
                Target(
                    name,
                    "≥ 0.50",
                    f"{v:.2f}",
                    v >= 0.5,
                    f"{v / 0.5:.2f}× the goal" if v >= 0.5 else f"short by {0.5 / v:.2f}×",
                )
            )
    # core
    core = results.get("core")
    if core and core.get("results"):
        rows = {r["kind"]: r["ratio"] for r in core["results"]}
        worst = min(rows, key=rows.__getitem__)
        v = rows[worst]
        if "openai-chat" in rows:
            oc = rows["openai-chat"]
            out.append(
                Target(
                    "core decode events/s ÷ limit loop's, openai-chat",
                    "≥ 0.50",
                    f"{oc:.2f}",
                    oc >= 0.5,
                    f"{oc / 0.5:.2f}× the goal" if oc >= 0.5 else f"short by {0.5 / oc:.2f}×",
                )
            )
        out.append(
            Target(
                "core decode events/s ÷ limit loop's, every stream",
                "≥ 0.50",
                f"{v:.2f} (worst: {worst})",
                v >= 0.5,
                f"{v / 0.5:.2f}× the goal" if v >= 0.5 else f"short by {0.5 / v:.2f}×",
                ", ".join(f"{k}: {x:.2f}" for k, x in rows.items()),
            )
        )
    else:
        out.append(Target("core decode ÷ limit loop", "≥ 0.50", "not measured", None, "–"))
    return out


def targets_markdown(targets: list[Target], results: dict[str, Any]) -> str:
    """The targets table."""
    when = {
        k: results[k].get("machine", {}).get("at", "?")
        for k in ("core", "pipeline", "peers", "ttfd", "turns", "memory")
        if k in results
    }
    lines = [
        "## Targets",
        "",
        "Judged from the latest figures of each benchmark ("
        + ", ".join(f"{k}: {v}" for k, v in when.items())
        + "); every ratio divides figures measured in the same run.",
        "",
        "| target | goal | measured | met | margin |",
        "|---|---|---|:---:|---|",
    ]
    for t in targets:
        met = "–" if t.met is None else ("yes" if t.met else "**no**")
        lines.append(f"| {t.name} | {t.goal} | {t.measured} | {met} | {t.margin} |")
    details = [f"- {t.name}: {t.detail}" for t in targets if t.detail]
    if details:
        lines += ["", "Per stream:", "", *details]
    return "\n".join(lines)
