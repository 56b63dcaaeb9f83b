"""`rillet bench` from a checkout, wherever it is called: its own options and help, and
output that fits a terminal (RESULTS.md keeps the markdown as it is)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from bench.report import for_terminal

if TYPE_CHECKING:
    import subprocess

ROOT = Path(__file__).resolve().parent.parent.parent


async def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["COLUMNS"] = "100"
    cmd = [sys.executable, "-m", "rillet", "bench", *args]
    return await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, check=False, env=env, cwd=cwd
    )


async def test_help_lists_the_benchmarks_options_from_anywhere(tmp_path: Path) -> None:
    done = await _bench("--help", cwd=tmp_path)  # not the checkout: it finds it anyway
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert text.startswith("usage: rillet bench")
    for option in ("--quick", "--rounds", "--no-write", "gateway"):
        assert option in text


async def test_a_quick_run_prints_lines_that_fit_a_terminal(tmp_path: Path) -> None:
    done = await _bench(
        "core",
        "--quick",
        "--fragments",
        "300",
        "--rounds",
        "1",
        "--no-write",
        "--no-charts",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "## Core decode in one task" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_wide_table_is_shown_one_block_per_row_and_prose_is_wrapped() -> None:
    wide = "x" * 60
    markdown = "\n".join(
        [
            "## A section",
            "words " * 40,
            "| name | note |",
            "|---|---|",
            f"| first | {wide} {wide} |",
            "",
            "| a | b |",
            "|---|---|",
            "| 1 | 2 |",
        ]
    )
    shown = for_terminal(markdown, 80)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "  name: first" in lines
    assert any(line.startswith("  note: xxx") for line in lines)
    assert "| 1 | 2 |" in lines  # a table that fits stays a table
