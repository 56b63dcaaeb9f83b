"""The fan-out scenarios F32-F38, F47-F49 through the real server, and F32 and F33 on the hub
alone in exact virtual time (the harness: `fault_support`).

Each scenario checks the provider's request times, how the run ended (`run.done` status, code,
attempts), the exact events of the run in the catalogue's notation, that every reader got each
event exactly once and in order (seq 1..n, one `run.done`, last), and that the text rebuilt
honouring `attempt.reset` is the provider's, exactly once.
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import msgspec
import pytest
import trio
import trio.testing
from rillet._core._errors import SubscriberDropped
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome
from rillet._core._runevents import RunDone, StatusEvent, decode_run_event
from rillet._hub._hub import Hub, MemoryRunLog
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet.transports.server import Limits
from rillet.transports.sinks import JSONLSink
from rillet.transports.testing import (
    Reply,
    openai_text_stream,
)

from ..fault_support import (
    LIMIT,
    Pace,
    Read,
    check_reads,
    check_site,
    follow,
    read_sse,
    read_ws,
    read_ws_raw,
    site,
    sse_url,
    text_reply,
    words,
    ws_url,
)
from ..handler_support import (
    END_OK,
    HANG,
    OK,
    OK_SEEN,
    REQUEST,
    TEXT,
    Answer,
    FakeProvider,
    check_envelope,
    check_uni,
    expect,
    openai_events,
    partial,
    policy,
    provider_for,
    rebuild,
    seen,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rillet._turn._turn import Sink, Turn, TurnResult


# --- F32, F33 on the hub alone: exact virtual time ------------------------------------------------


@attrs.define
class HubReader:
    """A subscriber of the hub that resumes after every drop; `per_event` seconds per event
    (0: as fast as it can)."""

    hub: Hub
    run_id: str
    per_event: float = 0.0
    data: list[bytes] = attrs.field(factory=list)
    resumed_after: list[int] = attrs.field(factory=list)  # the seq each drop left it at
    done_at: float | None = None

    @property
    def drops(self) -> int:
        return len(self.resumed_after)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        last = 0
        first = True
        while self.done_at is None:
            with self.hub.subscribe(self.run_id, last) as sub:
                if first:
                    task_status.started()
                    first = False
                try:
                    async for entry in sub:
                        self.data.append(entry.data)
                        last = entry.seq
                        if self.per_event:
                            await trio.sleep(self.per_event)
                        if isinstance(entry.event, RunDone):
                            self.done_at = trio.current_time()
                except SubscriberDropped as dropped:
                    self.resumed_after.append(dropped.last_seq)


def paced_answer(count: int, gap: float) -> Answer:
    """The `ok` stream with `count` deltas, one every `gap` seconds."""
    events = openai_events(words(count))
    body: list[Any] = [events[0]]
    for delta in events[1 : 1 + count]:
        body += [gap, delta]
    return Answer(body=[*body, *events[1 + count :]])


async def hub_run(
    answer: Answer, readers: Sequence[HubReader], hub: Hub, run_id: str
) -> tuple[TurnResult, float, FakeProvider]:
    """A turn on the virtual-time provider whose run events go to `hub`, with `readers`
    subscribed before its first event."""
    fake = FakeProvider([answer])
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sink = hub.sink(run_id)
        for reader in readers:
            await nursery.start(reader.run)
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
                provider_for(),
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
                sinks=[sink],
                run_id=run_id,
            )
        )
        result = await turn.result()
        ended = trio.current_time()
    return result, ended, fake


async def test_f32_a_10x_slower_subscriber_is_dropped_resumes_and_slows_nobody(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 1,000 deltas at 100 a second; the slow subscriber takes 0.1 s an event (10x slower)
    hub = Hub(buffer=64)
    fast = [HubReader(hub, "f32") for _ in range(3)]
    slow = HubReader(hub, "f32", per_event=0.1)
    base = Hub(buffer=64)
    control = [HubReader(base, "f32") for _ in range(3)]
    alone, alone_ended, _ = await hub_run(paced_answer(1000, 0.01), control, base, "f32")
    start = trio.current_time()
    result, ended, fake = await hub_run(paced_answer(1000, 0.01), [*fast, slow], hub, "f32")
    log = [entry.data for entry in hub.log.get("f32").entries]
    events = [entry.event for entry in hub.log.get("f32").entries]
    assert fake.times == [pytest.approx(start)]
    assert result.outcome is Outcome.COMPLETED
    assert seen(events) == expect("start", "D*1000", "usage", "done", END_OK)
    check_envelope(events, "f32")
    assert rebuild(events) == "".join(words(1000))
    assert ended - start == pytest.approx(alone_ended, abs=1e-9)  # the run was not slowed
    for reader, twin in zip(fast, control, strict=True):
        assert reader.data == log  # every event once, in order
        assert reader.drops == 0
        assert reader.done_at is not None
        assert twin.done_at is not None
        assert reader.done_at - start == pytest.approx(twin.done_at, abs=1e-9)
    assert slow.drops >= 1  # dropped at overflow...
    assert slow.data == log  # ...resumed, and got every event exactly once
    assert slow.resumed_after == sorted(set(slow.resumed_after))
    assert slow.done_at is not None
    assert slow.done_at - start > 10 * (ended - start) * 0.9
    assert alone.outcome is Outcome.COMPLETED


async def test_f33_a_subscriber_that_never_reads_is_dropped_when_full(
    autojump_clock: trio.testing.MockClock,
) -> None:
    base = Hub(buffer=64)
    _, alone_ended, _ = await hub_run(
        paced_answer(300, 0.01), [HubReader(base, "f33")], base, "f33"
    )
    hub = Hub(buffer=64)
    reader = HubReader(hub, "f33")
    start = trio.current_time()
    fake = FakeProvider([paced_answer(300, 0.01)])
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sink = hub.sink("f33")
        stuck = hub.subscribe("f33")  # never read
        await nursery.start(reader.run)
        result = await run_turn(
            REQUEST,
            provider_for(),
            client=client,
            policy=policy(),
            limiter=RateLimiter(),
            sinks=[sink],
            run_id="f33",
        )
        ended = trio.current_time()
    assert result.outcome is Outcome.COMPLETED
    assert ended - start == pytest.approx(alone_ended, abs=1e-9)  # the turn ends as it would
    assert stuck.drop_reason == "fell_behind"
    assert stuck.cancel_scope.cancel_called
    assert stuck.cursor == 0
    with pytest.raises(SubscriberDropped):
        await stuck.next_batch()
    stuck.close()
    assert reader.data == [entry.data for entry in hub.log.get("f33").entries]
    assert hub.statistics()["subscribers"] == 0


# --- F32-F38, F47, F49 through the server ---------------------------------------------------------

SMALL = 4096  # socket buffers of a client that backs up quickly (and of the server, per client)
# Subscribers that stop reading fill the kernel's buffers, and TCP then waits on its own timers
# (zero-window probes) in real time, which a mock clock cannot drive: the tests with stuck
# readers run in real time, with short real delays. F32 and F33 also run on the hub alone in
# exact virtual time (above).
STUCK_LIMITS = Limits(send_buffer=SMALL, max_subscribers_per_client=2000)


def thousand(gap: float) -> Reply:
    """1,000 deltas, 25 to a chunk, a chunk every `gap` seconds (41 chunks)."""
    return text_reply(words(1000), per_chunk=25, chunk_delay=gap)


THOUSAND_SEEN = expect("start", "D*1000", "usage", "done", END_OK)


async def test_f32_slow_sse_and_websocket_subscribers_are_dropped_resume_and_slow_nobody() -> None:
    with trio.fail_after(20):
        async with site([thousand(0.03)], hub=Hub(buffer=256), limits=STUCK_LIMITS) as served:
            run = await served.start()
            reads: dict[str, list[Read]] = {}

            over = trio.Event()

            async def one(name: str, transport: str, pace: Pace | None) -> None:
                rcvbuf = SMALL if pace else None
                reads[name] = await follow(run, transport, pace=pace, rcvbuf=rcvbuf)
                if name == "fast-sse":
                    over.set()

            # 25 events per 0.3 s against the run's 25 per 0.03 s: ten times slower while the
            # run streams (after it, the slow readers catch up at full speed)
            slow = Pace(25, 0.3, over)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "fast-sse", "sse", None)
                nursery.start_soon(one, "fast-ws", "ws", None)
                nursery.start_soon(one, "slow-sse", "sse", slow)
                nursery.start_soon(one, "slow-ws", "ws", slow)
            metrics = await served.metrics()
    events = check_site(
        served, run, at=[0.0], saw=THOUSAND_SEEN, text="".join(words(1000)), tolerance=0.5
    )
    # the run took the script's time (41 chunks, 30 ms apart): nobody slowed it
    assert 1230 <= events[-1].elapsed_ms < 1230 + 600
    for name, segments in reads.items():
        check_reads(served, run, segments)  # every event exactly once, in order
        if name.startswith("fast"):
            assert len(segments) == 1, name  # never dropped
    for name in ("slow-sse", "slow-ws"):
        assert len(reads[name]) >= 2, name  # dropped at overflow, then resumed
        assert not reads[name][0].finished
    assert (reads["slow-ws"][0].code, reads["slow-ws"][0].reason) == (1013, "fell_behind")
    assert (reads["fast-ws"][0].code, reads["fast-ws"][0].reason) == (1000, "done")
    assert metrics["subscribers_dropped"] >= 2


async def test_f33_subscribers_that_never_read_are_dropped_and_the_run_ends_on_time() -> None:
    with trio.fail_after(20):
        limits = attrs.evolve(STUCK_LIMITS, close_timeout=0.2)
        async with site([thousand(0.02)], hub=Hub(buffer=256), limits=limits) as served:
            run = await served.start()
            never = trio.Event()
            reads: dict[str, Read] = {}

            async def stuck(name: str) -> None:
                if name == "sse":
                    reads[name] = await read_sse(run.events_url, rcvbuf=SMALL, never_read=never)
                else:
                    reads[name] = await read_ws(run.ws_url, rcvbuf=SMALL, never_read=never)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stuck, "sse")
                nursery.start_soon(stuck, "ws")
                fast = await read_sse(run.events_url)
                while (await served.metrics())["subscribers_dropped"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # the server offers a count, not an event
                never.set()
            metrics = await served.metrics()
    events = check_site(
        served, run, at=[0.0], saw=THOUSAND_SEEN, text="".join(words(1000)), tolerance=0.5
    )
    assert 820 <= events[-1].elapsed_ms < 820 + 600  # on the script's time: nobody waited
    check_reads(served, run, [fast])
    assert metrics["subscribers_dropped"] == 2
    assert metrics["subscribers"] == 0
    assert [read.data for read in reads.values()] == [[], []]


async def test_f34_dropped_after_seq_37_of_100_resumes_with_38_to_100_once(
    loop_clock: trio.testing.MockClock,
) -> None:
    # run.started, 96 deltas, usage, answer.done, run.done: 100 events, streamed over 1.2 s
    script = [text_reply(words(96), per_chunk=8, chunk_delay=0.1)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            first = await read_sse(run.events_url, limit=37)
            assert not served.hub.log.get(run.run_id).done  # cut while the run streams
            cursor = first.ids[-1]
            assert cursor == f"{run.run_id}:37"
            rests = [
                await read_sse(run.events_url, last_event_id=cursor),
                await read_sse(sse_url(run, "37")),
                await read_ws(ws_url(run, "37")),
                await read_ws(ws_url(run, cursor)),
            ]
    check_site(
        served,
        run,
        at=[0.0],
        saw=expect("start", "D*96", "usage", "done", END_OK),
        text="".join(words(96)),
    )
    log = served.log(run.run_id)
    assert len(log) == 100
    assert first.seqs == list(range(1, 38))
    for rest in rests:
        assert rest.seqs == list(range(38, 101))
        check_reads(served, run, [first, rest])
        assert rest.clean


async def test_f35_resume_after_run_done_replays_within_retention_then_404(
    loop_clock: trio.testing.MockClock,
) -> None:
    text = "".join(words(10))
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(10))]) as served:
            run = await served.start()
            await served.wait_for(run.run_id)
            saw = expect("start", "D*10", "usage", "done", END_OK)
            check_site(served, run, at=[0.0], saw=saw, text=text)
            log = served.log(run.run_id)
            done_at = trio.current_time()
            await trio.sleep_until(done_at + 299.0)  # retention: 300 s after run.done
            replay_sse = await read_sse(sse_url(run, "5"))
            replay_ws = await read_ws(ws_url(run, "5"))
            await trio.sleep_until(done_at + 301.0)
            later_sse = await read_sse(sse_url(run, "5"))
            later_ws = await read_ws(ws_url(run, "5"))
            unknown = await read_sse(sse_url(attrs.evolve(run, run_id="ab" * 12)))
    assert replay_sse.data == log[5:]  # replay to run.done, then the stream ends
    assert replay_sse.finished
    assert replay_sse.clean
    assert replay_ws.data == log[5:]
    assert (replay_ws.code, replay_ws.reason) == (1000, "done")
    assert later_sse.status == 404
    assert later_sse.body == unknown.body  # the same bytes as a run that never was
    assert (later_ws.code, later_ws.reason) == (1008, "not_found")
    assert later_ws.data == []


@pytest.mark.parametrize("cursor", ["x", "-1", "1.5", "past", "other"])
async def test_f36_bad_cursors_are_refused_with_400_or_1008_and_no_event(
    loop_clock: trio.testing.MockClock, cursor: str
) -> None:
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(5))]) as served:
            run, other = await served.start(), await served.start()
            await served.wait_for(run.run_id)
            await served.wait_for(other.run_id)
            last = len(served.log(run.run_id))
            value = {"past": str(last + 1), "other": f"{other.run_id}:2"}.get(cursor, cursor)
            by_header = await read_sse(run.events_url, last_event_id=value)
            by_query = await read_sse(sse_url(run, value))
            by_ws = await read_ws(ws_url(run, value))
    saw = expect("start", "D*5", "usage", "done", END_OK)
    check_site(served, run, at=[0.0, 0.0], saw=saw, text="".join(words(5)), attempts=1)
    for refused in (by_header, by_query):
        assert refused.status == 400
        assert refused.data == []
        assert msgspec.json.decode(refused.body)["error"]["type"] == "cursor_invalid"
    assert (by_ws.code, by_ws.reason, by_ws.data) == (1008, "cursor_invalid", [])


async def test_f36_an_unknown_run_gets_the_same_bytes_as_not_yours(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(5))]) as served:
            mine, other = await served.start(), await served.start()
            wrong = attrs.evolve(mine, events_url=mine.events_url.replace(mine.token, other.token))
            unknown = attrs.evolve(
                other, events_url=other.events_url.replace(other.run_id, "ab" * 12)
            )
            answers = [await read_sse(r.events_url) for r in (wrong, unknown)]
            ws_wrong = await read_ws(mine.ws_url.replace(mine.token, other.token))
            ws_unknown = await read_ws(other.ws_url.replace(other.run_id, "ab" * 12))
    assert [a.status for a in answers] == [404, 404]
    assert answers[0].body == answers[1].body
    assert (ws_wrong.code, ws_wrong.reason) == (ws_unknown.code, ws_unknown.reason)
    assert (ws_wrong.code, ws_wrong.reason) == (1008, "not_found")
    assert ws_wrong.data == ws_unknown.data == []


async def test_f37_join_after_50_deltas_without_cursor_starts_at_seq_1_then_live(
    loop_clock: trio.testing.MockClock,
) -> None:
    # 50 deltas at once, then 10 more after 5 s
    stream = text_reply(words(60), per_chunk=100).chunks[0]
    frames = [f + b"\n\n" for f in stream.split(b"\n\n") if f]
    script = [Reply(chunks=(b"".join(frames[:51]), b"".join(frames[51:])), chunk_delay=2.5)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            await served.wait_for(run.run_id, 51)  # run.started and 50 deltas
            joined_at = trio.current_time()
            assert not served.hub.log.get(run.run_id).done
            async with trio.open_nursery() as nursery:
                reads: list[Read] = []

                async def sse() -> None:
                    reads.append(await read_sse(run.events_url))

                async def ws() -> None:
                    reads.append(await read_ws(run.ws_url))

                nursery.start_soon(sse)
                nursery.start_soon(ws)
    saw = expect("start", "D*60", "usage", "done", END_OK)
    events = check_site(served, run, at=[0.0], saw=saw, text="".join(words(60)))
    assert joined_at - run.started == pytest.approx(2.5, abs=1e-3)
    assert events[-1].elapsed_ms == 5000  # the rest came live, 2.5 s after the join
    for read in reads:
        assert read.seqs[0] == 1
        check_reads(served, run, [read])
        assert read.finished


async def test_f38_500_websocket_subscribers_each_see_the_reset_and_one_completed_end(
    loop_clock: trio.testing.MockClock, no_gc: None
) -> None:
    fragments = words(10)
    stream = openai_text_stream(fragments)
    frames = stream.split(b"\n\n")
    cut = len(b"\n\n".join(frames[:11])) + 2  # the role chunk and 10 deltas, then dropped
    script = [
        Reply(chunks=(stream,), drop_after_bytes=cut, headers_delay=1.0),
        text_reply(fragments, headers_delay=1.0),
    ]
    reads: list[Read] = []
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()

            async def one() -> None:
                reads.append(await read_ws_raw(run.ws_url))

            async with trio.open_nursery() as nursery:
                for _ in range(500):
                    nursery.start_soon(one)
    saw = expect("start", "D*10", "reset", "D*10", "usage", "done", END_OK)
    check_site(served, run, at=[0.0, 1.1], saw=saw, text="".join(fragments))
    assert len(reads) == 500
    for read in reads:
        check_reads(served, run, [read])  # each: D x10, reset, the retry's text, one end
        assert (read.code, read.reason) == (1000, "done")
        assert rebuild(read.events) == "".join(fragments)


async def test_f47_a_cursor_below_the_kept_log_is_410_or_1008_cursor_expired(
    loop_clock: trio.testing.MockClock,
) -> None:
    hub = Hub(log=MemoryRunLog(max_events=16))
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(40))], hub=hub) as served:
            run = await served.start()
            await served.wait_for(run.run_id)
            first_kept = hub.log.get(run.run_id).base
            resumed = await read_sse(run.events_url, last_event_id=f"{run.run_id}:1")
            joined = await read_sse(run.events_url)  # from seq 1: a gap too
            ws_resumed = await read_ws(ws_url(run, "1"))
            ws_joined = await read_ws(run.ws_url)
            kept = await read_sse(sse_url(run, str(first_kept - 1)))
    assert first_kept > 2
    for refused in (resumed, joined):
        assert refused.status == 410
        assert refused.data == []
        error = msgspec.json.decode(refused.body)["error"]
        assert (error["type"], error["first_kept"]) == ("cursor_expired", first_kept)
    for refused in (ws_resumed, ws_joined):
        assert (refused.code, refused.reason, refused.data) == (1008, "cursor_expired", [])
    assert kept.seqs[0] == first_kept  # the oldest kept event is still reachable
    assert kept.finished


async def test_f48_every_reader_sees_the_same_reset_at_the_same_point(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # F04: 3 deltas, a stall cut at 180 s, then the whole reply
    fake = FakeProvider([partial(3, HANG), Answer(body=OK)])
    hub = Hub()
    run_jsonl, uni_jsonl = io.BytesIO(), io.BytesIO()
    got: dict[str, list[Any]] = {"run_events": [], "uni_events": [], "hub": []}
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sinks: list[Sink] = [
            JSONLSink(run_jsonl),
            JSONLSink(uni_jsonl, kind="uni"),
            hub.sink("f48"),
        ]
        subscription = hub.subscribe("f48")
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
                provider_for(),
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
                sinks=sinks,
                run_id="f48",
            )
        )

        async def read_run() -> None:
            got["run_events"] = [event async for event in turn.run_events()]

        async def read_uni() -> None:
            got["uni_events"] = [item async for item in turn.uni_events()]

        async def read_hub() -> None:
            with subscription:
                got["hub"] = [entry.event async for entry in subscription]

        for reader in (read_run, read_uni, read_hub):
            nursery.start_soon(reader)
        result = await turn.result()
    assert fake.times == pytest.approx([0.0, 180.1])
    assert result.outcome is Outcome.COMPLETED
    runs = got["run_events"]
    assert seen(runs) == expect("start", "D*3", "reset", *OK_SEEN, END_OK)
    check_envelope(runs, "f48")
    assert rebuild(runs) == TEXT
    assert got["hub"] == runs
    assert [decode_run_event(line) for line in run_jsonl.getvalue().splitlines()] == runs
    # the MMSP views: the reset after the third delta, before the retry's first event
    uni_lines = uni_jsonl.getvalue().splitlines()
    uni = got["uni_events"]
    assert len(uni_lines) == len(uni)
    reset_at = [i for i, item in enumerate(uni) if isinstance(item, AttemptReset)]
    assert reset_at == [3]
    assert msgspec.json.decode(uni_lines[3]) == {"type": "attempt.reset", "attempt": 2}
    check_uni(uni)
    # and the run events put it at the same point: after three deltas (and the backoff's status),
    # before the retry's text
    reset_seq = [e.seq for e in runs if type(e).__name__ == "AttemptResetEvent"]
    assert reset_seq == [6]
    assert isinstance(runs[4], StatusEvent)


async def test_f49_a_silent_run_gets_sse_comments_at_15_and_30_s_without_id_or_seq(
    loop_clock: trio.testing.MockClock,
) -> None:
    stream = openai_text_stream(["Hel", "lo"])
    frames = [f + b"\n\n" for f in stream.split(b"\n\n") if f]
    script = [Reply(chunks=(b"".join(frames[:2]), b"", b"".join(frames[2:])), chunk_delay=20.0)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    saw = expect("start", "D*2", "usage", "done", END_OK)
    events = check_site(served, run, at=[0.0], saw=saw, text="Hello")
    check_reads(served, run, [read])
    # the role chunk and "Hel" at 20 s, then 40 s of silence, then the rest at 60 s
    assert [e.elapsed_ms for e in events] == [0, 20_000, 60_000, 60_000, 60_000, 60_000]
    comments = [t - run.started for t in read.comments]
    # 15 s after run.started, then 15 and 30 s into the 40 s of silence after "Hel"
    assert comments == pytest.approx([15.0, 35.0, 50.0], abs=0.05)
    assert read.ids == [f"{run.run_id}:{seq}" for seq in range(1, len(events) + 1)]
