"""The Markdown section and targets of `python -m bench firstbyte` (`bench/firstbyte.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

__all__ = ["FIRSTBYTE_GOAL", "firstbyte_markdown", "firstbyte_targets"]


def _where(section: dict[str, Any]) -> str:
    m = section.get("machine", {})
    load = m.get("load_average")
    load_s = f", load average {load[0]}" if load else ""
    return f"{m.get('at', '?')}; Python {m.get('python', '?')}, {m.get('cpus', '?')} CPUs{load_s}"


FIRSTBYTE_GOAL = 1.5
"""rillet's call-to-first-byte median may be at most this many times trio alone's."""
_FIRSTBYTE_LABELS = {
    "trio": "trio alone",
    "run_turn": "rillet run_turn",
    "open_turn": "rillet open_turn",
}


def firstbyte_markdown(section: dict[str, Any]) -> str:
    """Call to first request byte, rillet against trio alone."""
    by = {(r["contestant"], r["case"]): r for r in section["results"]}
    stamps = (
        "the kernel's receive timestamp"
        if section.get("kernel_stamps", True)
        else "the server's clock right after its read (no kernel timestamps here: an upper bound)"
    )
    lines = [
        "## Call to first request byte",
        "",
        f"`python -m bench firstbyte` — wall µs from calling `run_turn` (entering `open_turn`) to "
        f"the first byte of its request ({section.get('request_bytes', '?')} bytes, OpenAI Chat) "
        f"arriving at a server on 127.0.0.1 in its own process ({stamps}), against trio alone "
        "opening a TCP stream and sending the same bytes; median (p10–p90) of "
        f"{section['rounds']} interleaved rounds ({_where(section)}). Cold: a new connection "
        "(a new httpx client given to the turn); warm: the second turn on that client, whose "
        "pool holds the connection (trio alone: a send on its open stream). Target: ≤ "
        f"{FIRSTBYTE_GOAL:g}× trio alone.",
        "",
        "| case | trio alone | rillet run_turn | rillet open_turn | run_turn ÷ trio "
        "| open_turn ÷ trio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    cases = list(dict.fromkeys(r["case"] for r in section["results"]))
    for case in cases:
        cells = []
        for c in ("trio", "run_turn", "open_turn"):
            r = by.get((c, case))
            if r is None:
                cells.append("–")
            elif r.get("error"):
                cells.append("invalid")
            else:
                cells.append(f"{r['median_us']:.0f} ({r['p10_us']:.0f}–{r['p90_us']:.0f})")
        for c in ("run_turn", "open_turn"):
            v = section.get("ratios", {}).get(f"{c}/{case}")
            cells.append(f"{v:.2f}×" if v is not None else "–")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    errors = [
        f"- {_FIRSTBYTE_LABELS.get(r['contestant'], r['contestant'])}, {r['case']}: {r['error']}"
        for r in section["results"]
        if r.get("error")
    ]
    if errors:
        lines += ["", "Invalid rows:", *errors]
    lines += [
        "",
        "`cold, own client` (no target): `run_turn` given no client, so it makes and closes its "
        "own, the making included.",
    ]
    return "\n".join(lines)


def firstbyte_targets(section: dict[str, Any] | None, target: Callable[..., T]) -> list[T]:
    """The call-to-first-byte targets, cold and warm (the worse of `run_turn` and `open_turn`
    each), as `targets.Target`s (passed in: `targets` imports this module)."""
    out = []
    for case in ("cold", "warm"):
        name = f"call to first request byte, {case}: rillet ÷ trio alone"
        goal = f"≤ {FIRSTBYTE_GOAL:g}×"
        ratios = {
            c: v
            for c in ("run_turn", "open_turn")
            if (v := (section or {}).get("ratios", {}).get(f"{c}/{case}")) is not None
        }
        if not ratios:
            out.append(target(name, goal, "not measured", None, "–"))
            continue
        worst = max(ratios, key=ratios.__getitem__)
        v = ratios[worst]
        met = v <= FIRSTBYTE_GOAL
        margin = (
            f"{FIRSTBYTE_GOAL / v:.2f}× the goal" if met else f"over by {v / FIRSTBYTE_GOAL:.2f}×"
        )
        detail = ", ".join(f"{c}: {x:.2f}×" for c, x in ratios.items())
        out.append(target(name, goal, f"{v:.2f}× (worst: {worst})", met, margin, detail))
    return out
