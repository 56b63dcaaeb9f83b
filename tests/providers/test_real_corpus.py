"""Real provider streams, recorded by public projects' test suites, replayed through whole turns
(F50-F58).

Every file under `tests/fixtures/real/<dialect>/` is a response a real service sent (where each
came from, and what was re-framed, is in `PROVENANCE.md` beside them). `EXPECTED.json` says
what each recording carries, read from the recording itself: the HTTP status, whether the stream
completes or ends in an error, the answer text, the finish reason, the tool calls, and how many
requests the rules allow (one, except where RELIABILITY.md rule 2 retries a rate limit) and, for
a rate limit, the wait the body names.

Each file is replayed through `run_turn` over `ReplayTransport` with the default `Policy()`
(retries and rescue on, so a failure retried by mistake shows up as extra requests) on the
trio mock clock (backoff costs no time), whole, one byte per read, and for Gemini also with the
`\\r\\n` line ends the service really sends: the result must not depend on how the bytes arrive.

`KNOWN_DEFECTS` lists the recordings rillet does not read right yet, each with the reason. They
are strict xfails: the moment one is fixed its test fails, and the entry must go.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing
from rillet import Outcome, Policy, ToolCallDone, TurnRequest, TurnResult, run_turn, user
from rillet.providers import Provider, dialect_from_name
from rillet.transports.replay import ReplayTransport

if TYPE_CHECKING:
    from collections.abc import Iterable

REAL = Path(__file__).parent.parent / "fixtures" / "real"
EXPECTED: dict[str, dict[str, Any]] = json.loads((REAL / "EXPECTED.json").read_text("utf-8"))
DIALECTS = ("anthropic-messages", "gemini", "ollama-chat", "openai-chat", "openai-responses")

KNOWN_DEFECTS: dict[str, str] = {}
"""Recordings rillet gets wrong today (relative path → why). Empty it as the dialects are fixed."""


class _CrlfReplay(ReplayTransport):
    """The recording with every `\\n` sent as `\\r\\n`, as Gemini sends its events."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._data = self._data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def _variants(rel: str) -> list[tuple[str, type[ReplayTransport], int]]:
    """How a file is fed: whole reads, one byte per read, and CRLF line ends for Gemini."""
    variants: list[tuple[str, type[ReplayTransport], int]] = [
        ("256-byte reads", ReplayTransport, 256),
        ("1-byte reads", ReplayTransport, 1),
    ]
    if rel.startswith("gemini/") and rel.endswith(".sse"):
        variants.append(("CRLF, 5-byte reads", _CrlfReplay, 5))
    return variants


async def _replay(
    rel: str, kind: type[ReplayTransport], chunk_size: int
) -> tuple[TurnResult, int, float]:
    expected = EXPECTED[rel]
    transport = kind(REAL / rel, chunk_size=chunk_size, status=expected["status"])
    provider = Provider(dialect_from_name(rel.split("/")[0]), "http://replay.invalid", "replay")
    start = trio.current_time()
    async with httpx.AsyncClient(transport=transport) as client:
        result = await run_turn(
            TurnRequest(messages=[user("replay")]), provider, client=client, policy=Policy()
        )
    return result, transport.requests, trio.current_time() - start


def _error_name(result: TurnResult) -> str:
    error = result.error
    return type(error).__name__ if error is not None else "no error"


def _check(rel: str, how: str, result: TurnResult, requests: int, elapsed: float) -> None:
    expected = EXPECTED[rel]
    where = f"{rel} ({how})"
    assert requests == expected["requests"], f"{where}: {requests} requests, {_error_name(result)}"
    if expected["expect"] == "completed":
        assert result.outcome is Outcome.COMPLETED, (
            f"{where}: {result.outcome.name}, {result.error!r}"
        )
        assert result.text == expected["text"], where
        assert result.message.finish_reason == expected["finish_reason"], where
        names = [i.name for i in result.message.content_items if isinstance(i, ToolCallDone)]
        assert names == expected.get("tool_calls", []), where
        return
    if expected.get("outcome") == "rate_limited":
        assert result.outcome is Outcome.RATE_LIMITED, f"{where}: {result.outcome.name}"
    else:
        assert result.outcome in (Outcome.FAILED, Outcome.INIT_FAILED), (
            f"{where}: {result.outcome.name}, {result.error!r}"
        )
    if "error" in expected:
        assert _error_name(result) == expected["error"], f"{where}: {result.error!r}"
    if "retry_delay" in expected:
        # F56: the body's RetryInfo hint is the wait before every retry (no header came)
        waited = (requests - 1) * expected["retry_delay"]
        assert elapsed == pytest.approx(waited, abs=1e-6), f"{where}: waited {elapsed} s"


def cases(rels: Iterable[str]) -> list[Any]:
    """One parameter a recording, a known defect a strict xfail (so it cannot stay one once
    fixed): for every test that replays the corpus."""
    return [
        pytest.param(
            rel,
            id=rel,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[rel])]
            if rel in KNOWN_DEFECTS
            else [],
        )
        for rel in rels
    ]


@pytest.mark.parametrize("rel", cases(sorted(EXPECTED)))
async def test_a_real_recording_replays_to_what_it_carries(
    rel: str, autojump_clock: trio.testing.MockClock
) -> None:
    for how, kind, chunk_size in _variants(rel):
        result, requests, elapsed = await _replay(rel, kind, chunk_size)
        _check(rel, how, result, requests, elapsed)


def test_every_recording_has_an_expectation_and_a_provenance_entry() -> None:
    on_disk = sorted(
        str(p.relative_to(REAL))
        for d in DIALECTS
        if (REAL / d).is_dir()
        for p in (REAL / d).iterdir()
    )
    assert on_disk == sorted(EXPECTED)
    provenance = (REAL / "PROVENANCE.md").read_text("utf-8")
    listed = set(re.findall(r"^### `([^`]+)`", provenance, flags=re.MULTILINE))
    assert listed == set(EXPECTED)


def test_the_known_defects_name_recordings_that_exist() -> None:
    assert set(KNOWN_DEFECTS) <= set(EXPECTED)
    assert all(reason.strip() for reason in KNOWN_DEFECTS.values())


def test_the_expectations_are_well_formed() -> None:
    finishes = {"stop", "length", "tool_call", "unknown"}
    for rel, expected in EXPECTED.items():
        assert expected["expect"] in ("completed", "error"), rel
        assert isinstance(expected["requests"], int), rel
        if expected["expect"] == "completed":
            assert expected["status"] == 200, rel
            assert isinstance(expected["text"], str), rel
            assert expected["finish_reason"] in finishes, rel
        elif expected["status"] != 200:
            assert "error" in expected, rel
