"""The chaos soak against worker processes (`python -m tests.soak --workers 2`) at a tiny scale,
so that it keeps working: 20 turns or more, until a worker has been killed mid-run and Redis
restarted, every check of the full soak made."""

from __future__ import annotations

import shutil

import pytest

from .soak_workers import soak, summary

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
async def test_a_tiny_soak_with_a_worker_kill_and_a_redis_restart_loses_nothing() -> None:
    tally = await soak(20, 120.0, 4, 20261205, 2, 1.0, least=(1, 1))
    text = summary(tally, 0.0, 2)
    assert tally.kills >= 1, text
    assert tally.restarts >= 1, text
    assert tally.turns >= 20, text
    assert not tally.mismatches, text
    assert not tally.leaks, text
