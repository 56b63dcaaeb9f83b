"""PNG charts of the latest figures in results.json, saved under bench/charts/ for people to look
at: throughput per contestant, rillet against the limit, time to first delta, concurrent
turns, fan-out delay percentiles when the fan-out benchmark has run, and the gateway's CPU per
chunk and added latency by the number of streams.

Needs matplotlib (`pip install -e '.[bench]'`); without it the charts are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .report import LABELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["CHARTS", "draw_charts"]

CHARTS = Path(__file__).resolve().parent / "charts"

_LIMIT = "#8c8c8c"
_RILLET = "#1f6fb4"
_PEER = "#e07b39"
_COLOURS = {
    "limit": _LIMIT,
    "limit-httpx": "#a9a9a9",
    "limit-sync": "#c4c4c4",
    "core": "#5aa0dc",
    "pipeline": _RILLET,
    "pipeline-hops": "#3b7dc4",
    "jsonl": "#163f6b",
    "pipeline-16k": "#9cc3e6",
}


def _colour(name: str) -> str:
    return _COLOURS.get(name, _PEER)


def _fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M/s"
    if x >= 1e3:
        return f"{x / 1e3:.0f} k/s"
    return f"{x:.0f} /s"


def _throughput(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    tp = results.get("peers")
    if not tp:
        return None
    rows: dict[str, list[dict[str, Any]]] = {}
    for s in tp["series"]:
        # the diagnostic reads the bytes in other reads: not a contestant on the same reads;
        # rillet's rounds in the peers' process are the ratios' denominators, not bars
        if (
            s.get("events_per_s")
            and s["contestant"] not in ("pipeline-16k", "pipeline-hops")
            and not s["contestant"].startswith("pipeline:")
        ):
            rows.setdefault(s["stream"], []).append(s)
    # every stream a peer ran on, at its largest size, and the smallest OpenAI one (LiteLLM)
    peer_streams = {s["stream"] for s in tp["series"] if s["side"] == "peers"}
    top = max((st["events"] for st in tp["streams"]), default=0)
    low = min((st["events"] for st in tp["streams"]), default=0)
    chosen = [
        st["name"]
        for st in tp["streams"]
        if st["name"] in peer_streams and st["name"] in rows and st["events"] == top
    ]
    small = f"openai-chat@{low}"
    if small in rows and small not in chosen and low != top:
        chosen.append(small)
    if not chosen:
        chosen = [st["name"] for st in tp["streams"] if st["events"] == top and st["name"] in rows]
    if not chosen:
        return None
    cols = 2 if len(chosen) > 1 else 1
    nrows = (len(chosen) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(7.2 * cols, 3.3 * nrows), squeeze=False)
    for ax in axes.flat[len(chosen) :]:
        ax.set_visible(False)
    for ax, stream in zip(axes.flat, chosen, strict=False):
        series = sorted(rows[stream], key=lambda s: s["events_per_s"])
        names = [LABELS.get(s["contestant"], s["contestant"]) for s in series]
        values = [s["events_per_s"] for s in series]
        bars = ax.barh(names, values, color=[_colour(s["contestant"]) for s in series])
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 3, max(values) * 6)
        for bar, v in zip(bars, values, strict=True):
            ax.text(
                v * 1.08, bar.get_y() + bar.get_height() / 2, _fmt_rate(v), va="center", fontsize=8
            )
        ax.set_title(stream, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xlabel("fragment events per CPU second (log)", fontsize=8)
    fig.suptitle("Throughput on the same bytes: the limit (grey), rillet (blue), peers (orange)")
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pipeline(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    tp = results.get("pipeline")
    if not tp:
        return None
    table = {(s["contestant"], s["stream"]): s for s in tp["series"]}
    top = max((st["events"] for st in tp["streams"]), default=0)
    streams = [st["name"] for st in tp["streams"] if st["events"] == top]
    names = [
        n
        for n in (
            "limit",
            "limit-httpx",
            "core",
            "pipeline",
            "pipeline-hops",
            "jsonl",
            "pipeline-16k",
        )
        if any((n, s) in table for s in streams)
    ]
    if not streams or not names:
        return None
    fig, ax = plt.subplots(figsize=(11, 4.6))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(streams))]
        ys = [table.get((n, s), {}).get("us_per_event") or 0.0 for s in streams]
        ax.bar(xs, ys, width, label=LABELS[n], color=_colour(n))
    ax.set_xticks(range(len(streams)))
    ax.set_xticklabels(streams, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("CPU µs per fragment event (lower is better)")
    ax.set_title(f"rillet against the limit loop, {top:,}-event streams")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "pipeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ttfd(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    ttfd = results.get("ttfd")
    if not ttfd:
        return None
    by = {(r["contestant"], r["kind"]): r for r in ttfd["results"] if not r.get("error")}
    kinds = list(dict.fromkeys(r["kind"] for r in ttfd["results"]))
    names = ["limit-httpx", "pipeline", "jsonl"]
    fig, ax = plt.subplots(figsize=(10, 4.4))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        xs = [j + (i - 1) * width for j in range(len(kinds))]
        med = [by.get((n, k), {}).get("median_us", 0.0) for k in kinds]
        lo = [m - by.get((n, k), {}).get("p10_us", m) for m, k in zip(med, kinds, strict=True)]
        hi = [by.get((n, k), {}).get("p90_us", m) - m for m, k in zip(med, kinds, strict=True)]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=LABELS[n], color=_colour(n))
    for j, k in enumerate(kinds):
        base = by.get(("limit-httpx", k), {}).get("median_us")
        if base is not None:
            ax.hlines(base + 40, j - 0.45, j + 0.45, colors="#c0392b", linestyles="dashed")
    ax.plot([], [], color="#c0392b", linestyle="dashed", label="target: limit + 40 µs")
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels(kinds, fontsize=9)
    ax.set_ylabel("µs, median with p10–p90")
    ax.set_title("Time from the first delta's bytes to a sink")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "ttfd.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax: Axes, labels: list[str], values: list[float], goal: float, unit: str) -> None:
    bars = ax.bar(labels, values, color=_RILLET)
    _label(ax, bars, values)
    ax.axhline(goal, color="#c0392b", linestyle="dashed", label=f"target {goal:g} {unit}")
    ax.set_ylim(0, max([*values, goal]) * 2.5)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def _label(ax: Axes, bars: Any, values: list[float]) -> None:
    for bar, v in zip(bars, values, strict=True):
        ax.text(
            bar.get_x() + bar.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8
        )


def _turns(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    turns = results.get("turns")
    if not turns:
        return None
    modes = [m for m in ("paced", "burst") if turns.get(m) and not turns[m].get("error")]
    if not modes:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels, values = [], []
    for m in modes:
        r = turns[m]
        for key, name in (("lag_p50_ms", "p50"), ("lag_p99_ms", "p99"), ("lag_max_ms", "max")):
            labels.append(f"{m}\n{name}")
            values.append(r[key])
    _bars(axes[0], labels, values, 50, "ms")
    axes[0].set_yscale("symlog", linthresh=10)
    axes[0].set_ylabel("event-loop lag, ms (10 ms ticker)")
    n = turns[modes[0]]["turns"]
    axes[0].set_title(f"{n:,} concurrent turns: loop lag")
    _bars(axes[1], modes, [turns[m]["kib_per_turn"] for m in modes], 100, "KiB")
    axes[1].set_ylabel("peak RSS per turn, KiB")
    axes[1].set_title("memory per turn")
    fig.tight_layout()
    path = out / "turns.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fanout(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    phases = (results.get("fanout") or {}).get("result", {})
    phases = phases.get("phases") if isinstance(phases, dict) else None
    if not phases:
        return None
    keys = [("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(phases)
    top = 1.0
    for i, p in enumerate(phases):
        xs = [j + (i - (len(phases) - 1) / 2) * width for j in range(len(keys))]
        ys = [float(p.get(k) or 0.0) for k, _ in keys]
        label = f"{p.get('label', i)} ({p.get('n_ws', 0) + p.get('n_sse', 0):,} subscribers)"
        bars = ax.bar(xs, ys, width, label=label, color=[_RILLET, _PEER][i % 2])
        _label(ax, bars, ys)
        top = max(top, *ys)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([n for _, n in keys])
    ax.set_ylabel("delay from hub append to subscriber recv, ms")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(0, top * 8)
    ax.set_title("Fan-out delay percentiles")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "fanout.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_GATEWAY_COLOURS = {
    "passthrough": _LIMIT,
    "rillet": _RILLET,
    "rillet-w2": "#5aa0dc",
    "litellm": _PEER,
}


def _gateway(results: dict[str, Any], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    rows = [r for r in (results.get("gateway") or {}).get("rows", []) if "error" not in r]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for gateway, colour in _GATEWAY_COLOURS.items():
        mine = sorted((r for r in rows if r["gateway"] == gateway), key=lambda r: r["k"])
        if not mine:
            continue
        ks = [r["k"] for r in mine]
        axes[0].plot(ks, [r["cpu_us_per_chunk"] for r in mine], "o-", color=colour, label=gateway)
        added = [max(r["added_ttft_p99_ms"], 0.1) for r in mine]
        axes[1].plot(ks, added, "o-", color=colour, label=gateway)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams (K), 50 chunks/s each")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("gateway CPU per chunk, µs")
    axes[0].set_title("Server CPU per chunk")
    axes[1].axhline(50, color="#c00000", linewidth=0.8, linestyle="--")
    axes[1].set_ylabel("added p99 time to first token, ms")
    axes[1].set_title("Added p99 TTFT (target: 50 ms)")
    fig.tight_layout()
    path = out / "gateway.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_charts(results: dict[str, Any], out: Path = CHARTS) -> list[Path] | str:
    """Draw every chart the figures allow; the paths written, or why none were."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for draw in (_throughput, _pipeline, _ttfd, _turns, _fanout, _gateway):
        path = draw(results, out)
        if path is not None:
            paths.append(path)
    return paths
