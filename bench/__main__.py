"""`python -m bench [core]`: run the benchmarks and record their figures in bench/RESULTS.md."""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from .core import run_core

RESULTS = Path(__file__).parent / "RESULTS.md"


def _progress(line: str) -> None:
    print(f"\r\x1b[K{line}", end="", file=sys.stderr, flush=True)


def replace_section(name: str, body: str) -> None:
    """Replace (or append) the section between `<!-- name -->` markers in RESULTS.md."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = RESULTS.read_text("utf-8") if RESULTS.exists() else "# Benchmark results\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text, "utf-8")


def core(args: argparse.Namespace) -> None:
    """Core decode throughput per dialect against the limit loop."""
    results = run_core(args.fragments, args.rounds, args.dialect or None, _progress)
    print(file=sys.stderr)
    lines = [
        "## Core decode in one task (issue: core, dialects)",
        "",
        f"`python -m bench core` — {args.fragments:,} text fragments per stream, network-sized",
        f"reads, median of {args.rounds} interleaved rounds; Python {platform.python_version()},",
        f"{platform.machine()}. Ratio = rillet's events/s ÷ the limit loop's (target ≥ 0.50).",
        "",
        "| dialect | limit µs/event | rillet µs/event | limit events/s | rillet events/s | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.dialect} | {r.limit_us_per_event:.2f} | {r.rillet_us_per_event:.2f} | "
            f"{r.limit_events_per_s:,.0f} | {r.rillet_events_per_s:,.0f} | {r.ratio:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        replace_section("core", table)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the chosen benchmark."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("core", help=core.__doc__)
    p.add_argument("--fragments", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dialect", action="append", help="only this dialect (repeatable)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    p.set_defaults(func=core)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["core", *(argv or [])])
    args.func(args)


if __name__ == "__main__":
    main()
