"""The chaos soak against worker processes (`python -m tests.soak --workers 2`) at a tiny scale,
so that it keeps working: 20 turns or more, until a worker has been killed mid-run and Redis
restarted, every check of the full soak made.

The soak runs in a process of its own, as `python -m tests.soak` does: the Redis clients a
restart cuts leave their streams to the garbage collector, which must not close them during
another test of this process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, trio
from tests.soak_workers import soak, summary
tally = trio.run(lambda: soak(20, 120.0, 4, 20261205, 2, 1.0, least=(1, 1)))
print(json.dumps({
    "kills": tally.kills, "restarts": tally.restarts, "turns": tally.turns,
    "mismatches": tally.mismatches, "leaks": tally.leaks, "summary": summary(tally, 0.0, 2),
}))
"""


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_tiny_soak_with_a_worker_kill_and_a_redis_restart_loses_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    tally = json.loads(done.stdout.strip().splitlines()[-1])
    text = tally["summary"]
    assert tally["kills"] >= 1, text
    assert tally["restarts"] >= 1, text
    assert tally["turns"] >= 20, text
    assert not tally["mismatches"], text
    assert not tally["leaks"], text
