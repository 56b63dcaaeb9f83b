"""S32: the kept runs' memory cap holds, measured rather than trusted.

A run log forgets the oldest finished runs once its estimate of what the kept runs hold passes
`max_total_bytes`. The estimate is only as good as its constants: with the old ones, 2,000
kept runs grew a server by 327 MiB against its 256 MiB cap. These tests fill a log past its cap
many times over with runs shaped as a server's are (a run's id shared by its events, every
fragment's text a string of its own, fragments from 1 to 2,000 characters) and measure with
tracemalloc what it really holds. The tolerance is 5 % above the cap (tracemalloc's own
bookkeeping and the list's spare room), and the log must use what the cap allows: at least 75 %
of it (it trims to 7/8 and fills again). RSS, which adds the allocator's own overhead, is
measured by `python -m bench.kept_runs rss` (bench/RESULTS.md).
"""

from __future__ import annotations

import gc
import hashlib
import tracemalloc

import pytest
import trio
from rillet._core._runevents import (
    AnswerDelta,
    AnswerDone,
    RunEvent,
    RunStarted,
    UsageEvent,
)
from rillet._hub._hub import MemoryRunLog

from ..sinks_support import completed_done

CAP = 4 * 1024 * 1024
TOLERANCE = 1.05  # what tracemalloc may see above the cap
USED = 0.75  # what it must see at least: the cap is a bound the log fills, not a guess far above
# A run's own 2 KiB (`RUN_BYTES`) counts a server's record of it too (its token and digest,
# about 1.2 KiB), which a log alone does not hold: runs of a few events fill less of the cap.
USED_SHORT_RUNS = 0.55


def run_events(run_id: str, sizes: list[int]) -> list[RunEvent]:
    """A finished run's events as a server logs them: one fragment of each size."""
    events: list[RunEvent] = [
        RunStarted(seq=1, provider="openai-chat", model="gpt-4o-mini", run_id=run_id, elapsed_ms=0)
    ]
    for size in sizes:
        text = "x" * (size - 1) + " "  # a string of its own, as a decoded fragment is
        events.append(AnswerDelta(seq=len(events) + 1, delta=text, run_id=run_id, elapsed_ms=0))
    events.append(
        UsageEvent(
            seq=len(events) + 1,
            prompt_tokens=12,
            response_tokens=len(sizes),
            run_id=run_id,
            elapsed_ms=0,
        )
    )
    digest = hashlib.sha256(b"".join(s.to_bytes(4) for s in sizes)).hexdigest()
    events.append(
        AnswerDone(
            seq=len(events) + 1, sha256=digest, chars=sum(sizes), run_id=run_id, elapsed_ms=0
        )
    )
    events.append(completed_done(run_id, len(events) + 1))
    return events


SHAPES = {
    "small-fragments": [5] * 200,  # a chat model's tokens
    "mixed": [1, 40, 400, 2000, 90, 7] * 30,
    "large-fragments": [2000] * 20,  # whole paragraphs a read
    "short-runs": [12],  # one fragment: the run's own objects weigh most
}


@pytest.mark.parametrize("shape", SHAPES)
def test_s32_kept_runs_hold_no_more_than_the_cap_measured(shape: str) -> None:
    sizes = SHAPES[shape]

    async def fill() -> tuple[int, int, int]:
        log = MemoryRunLog(max_total_bytes=CAP, max_total_events=10_000_000)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            filled = n = 0
            while filled < 3 * CAP:  # past the cap three times over: it has evicted and refilled
                run_id = f"{n:024x}"
                log.create(run_id)
                written = log.append(run_id, run_events(run_id, sizes))
                filled += sum(len(entry.data) for entry in written) * 5 // 2
                n += 1
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        return held, log.total_bytes, log.evicted

    held, estimated, evicted = trio.run(fill)
    assert evicted > 0  # the cap was reached and held
    assert estimated <= CAP
    assert held <= CAP * TOLERANCE, (
        f"{held / CAP:.2f} of the cap ({held / estimated:.2f} of the estimate)"
    )
    used = USED_SHORT_RUNS if shape == "short-runs" else USED
    assert held >= CAP * used, (
        f"{held / CAP:.2f} of the cap ({held / estimated:.2f} of the estimate)"
    )
