"""`--prices` and `--max-cost` on the command line, as a user runs them: a subprocess against
the loopback provider. The cost is in the JSON Lines' `usage` event; a run its limit cannot pay
for sends nothing and says why in a line; a limit without prices, or prices that cannot be read,
is a usage error (exit 2) naming what to give."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING

from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream, split

from .test_cli import FRAGMENTS, _rillet, _run_cli

if TYPE_CHECKING:
    from pathlib import Path


def _prices(tmp_path: Path) -> str:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"m": {"input": "2", "output": "8", "cached_input": 0.5}}))
    return str(path)


async def test_the_usage_event_says_what_the_answer_cost(tmp_path: Path) -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS, prompt_tokens=30), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(
            ["run", "hi", "--output", "jsonl", "--prices", _prices(tmp_path)], provider.url
        )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    (usage,) = [e for e in events if e["type"] == "usage"]
    generated = usage["response_tokens"]
    assert Decimal(usage["cost"]) == (30 * Decimal(2) + generated * Decimal(8)) / 10**6


async def test_text_mode_says_the_cost_after_the_answer(tmp_path: Path) -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS, prompt_tokens=30), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--prices", _prices(tmp_path)], provider.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(FRAGMENTS) + "\n"  # the answer alone on stdout
    (line,) = done.stderr.decode().splitlines()
    assert line == f"rillet: cost {(30 * Decimal(2) + len(FRAGMENTS) * Decimal(8)) / 10**6}"


async def test_a_question_the_limit_cannot_pay_for_is_not_sent(tmp_path: Path) -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        question = "why " * 2000
        done = await _run_cli(
            ["run", question, "--prices", _prices(tmp_path), "--max-cost", "0.0001"],
            provider.url,
        )
        assert provider.requests == []
    assert done.returncode == 1
    line = done.stderr.decode()
    assert "spend" in line
    assert "max_cost" in line or "max-cost" in line or "limit" in line


async def test_a_limit_without_prices_or_unreadable_prices_is_a_usage_error(
    tmp_path: Path,
) -> None:
    done = await _rillet("run", "hi", "--max-cost", "1", "--provider", "openai", "--model", "m")
    assert done.returncode == 2
    assert "--prices" in done.stderr.decode()
    bad = tmp_path / "bad.json"
    bad.write_text('{"m": {"input": "two"}}')
    done = await _rillet("run", "hi", "--prices", str(bad), "--provider", "openai")
    assert done.returncode == 2
    assert "per million tokens" in done.stderr.decode()
    done = await _rillet("serve", "--max-cost", "1", "--provider", "openai", "--model", "m")
    assert done.returncode == 2
    assert "--prices" in done.stderr.decode()
