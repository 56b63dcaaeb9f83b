"""The targets table: every target judged from the latest figures of each benchmark (a section
of `bench/out/results.json` each), and its Markdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .firstbyte_report import firstbyte_targets
from .report import LABELS, MEMORY_TARGETS, _f, _ours, _series, _workers_speedup

__all__ = ["Target", "judge_targets", "targets_markdown"]


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


def _at_most(name: str, bound: float, ratios: dict[str, float]) -> Target:
    """A ratio target: the worst of `ratios` (per stream) at most `bound`."""
    goal = f"≤ {bound:g}×"
    if not ratios:
        return Target(name, goal, "not measured", None, "–")
    worst = max(ratios, key=ratios.__getitem__)
    v = ratios[worst]
    return Target(
        name,
        goal,
        f"{v:.2f}× (worst: {worst})",
        v <= bound,
        f"{bound / v:.2f}× the goal" if v <= bound else f"over by {v / bound:.2f}×",
        ", ".join(f"{s}: {r:.2f}×" for s, r in sorted(ratios.items())),
    )


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


def judge_targets(results: dict[str, Any]) -> list[Target]:
    """Every target, judged from the latest figures of each benchmark."""
    out: list[Target] = []
    tp = results.get("pipeline")
    table = _series(tp) if tp else {}
    # the full pipeline (default and hops mode) against the limit loop at the largest size
    ratios: dict[str, float] = {}
    hops: dict[str, float] = {}
    if table:
        top = max(s["events"] for s in tp["streams"]) if tp and tp["streams"] else 0
        for st in tp["streams"] if tp else []:
            if st["events"] != top:
                continue
            ours = table.get(("pipeline", st["name"]), {}).get("us_per_event")
            limit = table.get(("limit", st["name"]), {}).get("us_per_event")
            hop = table.get(("pipeline-hops", st["name"]), {}).get("us_per_event")
            if ours and limit:
                ratios[st["name"]] = ours / limit
            if ours and hop:
                hops[st["name"]] = hop / ours
    for bound in (3.0, 2.0):
        name = f"run_turn µs/event ÷ limit loop's, largest streams, within {bound:g}×"
        out.append(_at_most(name, bound, ratios))
    name = "hops mode: run_turn µs/event ÷ the default mode's, largest streams"
    if hops:
        worst = max(hops, key=hops.__getitem__)
        detail = ", ".join(f"{s}: {r:.2f}×" for s, r in sorted(hops.items()))
        out.append(
            Target(name, "reported", f"{hops[worst]:.2f}× (worst: {worst})", None, "–", detail)
        )
    else:
        out.append(Target(name, "reported", "not measured", None, "–"))
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
                    "≤ 40 µs",
                    f"{v:.0f} µs (worst: {worst})",
                    v <= 40,
                    f"{40 - v:.0f} µs to spare" if v <= 40 else f"over by {v - 40:.0f} µs",
                    ", ".join(f"{k}: {x:.0f} µs" for k, x in extra.items()),
                )
            )
    else:
        out.append(Target(name, "≤ 40 µs", "not measured", None, "–"))
    for target in firstbyte_targets(results.get("firstbyte"), Target):
        if "warm" in target.name and target.met is not None:
            # reported: a warm turn's first byte is a few µs of trio's against rillet's
            # scheduling of a whole turn; the gateway's CPU per chunk is the target now
            target.goal, target.met, target.margin = "reported", None, "–"
        out.append(target)
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
    # workers: saturated deliveries/s with 2 worker processes against 1
    workers = (results.get("workers") or {}).get("result") or {}
    speedup = _workers_speedup(workers) if workers else None
    name = "serve --workers 2: saturated deliveries/s ÷ 1 worker's"
    # reported: two workers cannot be saturated honestly on two cores that also run the load;
    # the gateway's "two workers within 10 % of one worker's CPU per chunk" is the target
    if speedup is not None:
        out.append(Target(name, "reported", f"{speedup:.2f}×", None, "–"))
        paced = [p for p in workers["phases"] if p["phase"].startswith("paced")]
        for p in paced:
            if p["workers"] == 2:
                out.append(
                    Target(
                        f"serve --workers 2: p99 delay, {p['subscribers']:,} subscribers at "
                        f"{p['phase'].removeprefix('paced ')}",
                        "< 50 ms",
                        f"{p['p99_ms']:.1f} ms",
                        p["p99_ms"] < 50,
                        f"{50 - p['p99_ms']:.1f} ms to spare"
                        if p["p99_ms"] < 50
                        else f"over by {p['p99_ms'] - 50:.1f} ms",
                    )
                )
    else:
        out.append(Target(name, "reported", "not measured", None, "–"))
    out += _gateway_targets(results.get("gateway"))
    out.append(_telemetry_target(results.get("telemetry")))
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
    # core: the sans-I/O decode in one task against the limit loop, µs/event divided
    core = results.get("core")
    name = "core decode µs/event ÷ limit loop's, every stream"
    rows = {}
    if core and core.get("results"):
        rows = {r["kind"]: 1 / r["ratio"] for r in core["results"] if r.get("ratio")}
    out.append(_at_most(name, 1.3, rows))
    return out


def _telemetry_target(section: dict[str, Any] | None) -> Target:
    """Tracing off costs a turn nothing: the OpenTelemetry API imported with no provider
    configured, against a process that never imported it (bench/telemetry.py)."""
    name = "turn with OpenTelemetry off ÷ without it (median µs/turn)"
    if not section:
        return Target(name, "≤ 1.05", "not measured", None, "–")
    v = section["off_over_bare"]
    margin = f"{(1.05 - v) * 100:.0f} points to spare" if v <= 1.05 else f"over by {v - 1:.0%}"
    return Target(name, "≤ 1.05", f"{v:.2f}", v <= 1.05, margin)


def _gateway_targets(section: dict[str, Any] | None) -> list[Target]:
    """The gateway's targets (bench/gateway.py): rillet's CPU per chunk against LiteLLM's proxy
    and the bare pass-through, the added latency at K = 500, two workers against one, and
    the benchmark's own length."""
    rows = {(r["gateway"], r["k"]): r for r in (section or {}).get("rows", []) if "error" not in r}

    def ratio_target(name: str, goal: float, ratios: dict[str, float]) -> Target:
        if not ratios:
            return Target(name, f"≤ {goal:g}×", "not measured", None, "–")
        worst = max(ratios, key=ratios.__getitem__)
        v = ratios[worst]
        margin = f"{goal / v:.2f}× the goal" if v <= goal else f"over by {v / goal:.2f}×"
        detail = ", ".join(f"{k}: {x:.2f}×" for k, x in ratios.items())
        return Target(name, f"≤ {goal:g}×", f"{v:.2f}× (worst: {worst})", v <= goal, margin, detail)

    def cpu(gateway: str, k: int) -> float | None:
        row = rows.get((gateway, k))
        return row["cpu_us_per_chunk"] if row else None

    out = []
    ours, theirs = cpu("rillet", 10), cpu("litellm", 10)
    name = "gateway, K=10: rillet's server CPU per chunk ÷ LiteLLM proxy's"
    out.append(ratio_target(name, 0.1, {"K=10": ours / theirs} if ours and theirs else {}))
    ratios = {}
    for (gateway, k), row in sorted(rows.items(), key=lambda item: item[0][1]):
        bare = cpu("passthrough", k)
        if gateway == "rillet" and bare:
            ratios[f"K={k}"] = row["cpu_us_per_chunk"] / bare
    name = "gateway: rillet's server CPU per chunk ÷ the bare trio pass-through's"
    out.append(ratio_target(name, 2.0, ratios))
    for key, goal, what in (
        ("added_ttft_p99_ms", 50.0, "added p99 time to first token"),
        ("added_gap_p99_ms", 20.0, "added p99 gap between chunks"),
    ):
        name = f"gateway, K=500: rillet's {what}"
        row = rows.get(("rillet", 500))
        if row is None:
            fell = [r for r in (section or {}).get("rows", []) if r["gateway"] == "rillet"]
            why = next((r["error"] for r in fell if r["k"] == 500 and "error" in r), None)
            out.append(Target(name, f"≤ {goal:g} ms", why or "not measured", None, "–"))
            continue
        v = row[key]
        margin = f"{goal - v:.1f} ms to spare" if v <= goal else f"over by {v - goal:.1f} ms"
        out.append(Target(name, f"≤ {goal:g} ms", f"{v:.1f} ms", v <= goal, margin))
    ratios = {}
    for (gateway, k), row in rows.items():
        one = cpu("rillet", k)
        if gateway == "rillet-w2" and one:
            ratios[f"K={k}"] = row["cpu_us_per_chunk"] / one
    name = "gateway: two workers' server CPU per chunk ÷ one worker's"
    out.append(ratio_target(name, 1.1, dict(sorted(ratios.items()))))
    seconds = (section or {}).get("seconds")
    name = "gateway benchmark's length"
    if seconds is None:
        out.append(Target(name, "≤ 10 min", "not measured", None, "–"))
    else:
        minutes = seconds / 60
        margin = (
            f"{10 - minutes:.1f} min to spare"
            if minutes <= 10
            else f"over by {minutes - 10:.1f} min"
        )
        out.append(Target(name, "≤ 10 min", f"{minutes:.1f} min", minutes <= 10, margin))
    return out


def targets_markdown(targets: list[Target], results: dict[str, Any]) -> str:
    """The targets table."""
    when = {
        k: results[k].get("machine", {}).get("at", "?")
        for k in ("core", "pipeline", "peers", "ttfd", "firstbyte", "turns", "memory", "gateway")
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
