"""The delivery server over HTTP: runs, SSE fan-out and resume, and cursors (the harness:
`server_support`; who may read and start, what never leaks, the page: `test_server_access`).
"""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing
from rillet._core._runevents import (
    AnswerDone,
    RunDone,
    decode_run_event,
)
from rillet._hub._hub import Hub, MemoryRunLog
from rillet.frames import SSEDecoder, SSEEvent
from rillet.transports.server import Limits
from rillet.transports.testing import (
    Reply,
    openai_text_stream,
    split,
)

from ..server_support import (
    _RCVBUF,
    WORDS,
    Stream,
    dropped_then_ok,
    kind,
    read_sse,
    serving,
    text_reply,
    texts,
)

# --- SSE delivery ---------------------------------------------------------------------------------


async def test_sse_delivers_every_event_in_order_with_run_scoped_ids() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
            log = served.log(run["run_id"])
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"] == "no-cache, no-transform"
    assert stream.headers["x-accel-buffering"] == "no"
    assert stream.clean_end
    events = stream.run_events
    assert stream.seqs == list(range(1, len(events) + 1))
    assert isinstance(events[-1], RunDone)
    assert events[-1].status == "completed"
    assert sum(isinstance(e, RunDone) for e in events) == 1
    assert texts(events) == "".join(WORDS)
    assert [e.id for e in stream.events] == [f"{run['run_id']}:{n}" for n in stream.seqs]
    # the data is the hub's pre-encoded JSON, byte for byte
    assert [e.data.encode() for e in stream.events] == log


@pytest.mark.parametrize("how", ["last-event-id", "after"])
async def test_resume_after_a_cut_at_every_point_gets_each_event_once(how: str) -> None:
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            log = served.log(run["run_id"])
            for k in range(len(log) + 1):
                first = await read_sse(served.client, run["events_url"], limit=k)
                assert len(first.events) == k
                url, headers = run["events_url"], {}
                if k and how == "last-event-id":
                    headers["last-event-id"] = first.events[-1].id
                elif k:
                    url += f"&after={first.seqs[-1]}"
                rest = await read_sse(served.client, url, headers=headers)
                if k == len(log):  # nothing left: an EventSource is told to stop
                    assert rest.status == 204
                got = [e.data.encode() for e in first.events + rest.events]
                assert got == log, k


async def test_resume_of_a_live_run_cut_mid_stream_is_exact() -> None:
    words = [f"w{n} " for n in range(40)]
    script = [text_reply(words, chunk_delay=0.005)]
    with trio.fail_after(10):
        async with serving(script) as served:
            for k in (1, 5, 17):
                run = await served.start()
                first = await read_sse(served.client, run["events_url"], limit=k)
                assert not served.hub.log.get(run["run_id"]).done  # cut while it streams
                rest = await read_sse(
                    served.client,
                    run["events_url"],
                    headers={"last-event-id": first.events[-1].id},
                )
                events = first.run_events + rest.run_events
                assert [e.seq for e in events] == list(range(1, len(events) + 1))
                assert isinstance(events[-1], RunDone)
                assert texts(events) == "".join(words)


async def test_a_late_joiner_without_cursor_starts_at_seq_1_then_follows_live() -> None:
    words = [f"{n}," for n in range(60)]
    with trio.fail_after(10):
        async with serving([text_reply(words, chunk_delay=0.003)]) as served:
            run = await served.start()
            await served.wait_for(run["run_id"], 20)
            stream = await read_sse(served.client, run["events_url"])
    assert stream.seqs[0] == 1
    assert stream.seqs == list(range(1, len(stream.seqs) + 1))
    assert texts(stream.run_events) == "".join(words)


async def test_a_slow_subscriber_is_dropped_and_resumes_while_a_fast_one_gets_everything() -> None:
    words = ["x" * 2000 for _ in range(200)]
    script = [text_reply(words, headers_delay=0.2)]
    small = {"transport": httpx.AsyncHTTPTransport(socket_options=[_RCVBUF])}
    with trio.fail_after(10):
        async with serving(
            script,
            hub=Hub(buffer=64),
            limits=Limits(send_buffer=4096),
            client_options=small,
        ) as served:
            run = await served.start()
            fast_done = trio.Event()
            fast: list[Stream] = []

            async def read_fast() -> None:
                async with httpx.AsyncClient() as other:
                    fast.append(await read_sse(other, run["events_url"]))
                fast_done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_fast)
                async with served.client.stream("GET", run["events_url"]) as response:
                    decoder = SSEDecoder()
                    slow: list[SSEEvent] = []
                    async for chunk in response.aiter_raw():
                        slow += decoder.feed(chunk)
                        if not fast_done.is_set():
                            await fast_done.wait()  # stop reading until the run is over
            metrics = (await served.client.get("/metrics.json")).json()
            async with httpx.AsyncClient() as other:
                resumed = await read_sse(
                    other, run["events_url"], headers={"last-event-id": slow[-1].id}
                )
            log = served.log(run["run_id"])
    assert [e.data.encode() for e in fast[0].events] == log  # the fast one got everything
    assert not any(isinstance(decode_run_event(e.data), RunDone) for e in slow)  # cut short
    assert metrics["subscribers_dropped"] == 1
    assert [e.data.encode() for e in slow + resumed.events] == log  # each once, in order


async def test_heartbeat_comments_while_the_run_is_silent(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.02
    stream = openai_text_stream(["Hel", "lo"])
    script = [Reply(chunks=split(stream, len(stream) // 3 + 1), stall_after=1)]
    comments_at: list[float] = []
    events: list[SSEEvent] = []
    with trio.fail_after(120):
        async with serving(script) as served:
            run = await served.start()
            decoder = SSEDecoder()
            with trio.move_on_after(40):
                async with served.client.stream("GET", run["events_url"]) as response:
                    async for chunk in response.aiter_raw():
                        before = decoder.comments
                        events += decoder.feed(chunk)
                        comments_at += [trio.current_time()] * (decoder.comments - before)
            last = decoder.last_event_id
    assert events  # the run said something before going silent
    assert last == events[-1].id  # comments carry no id
    assert len(comments_at) == 2
    assert comments_at[0] == pytest.approx(15, abs=0.5)
    assert comments_at[1] == pytest.approx(30, abs=0.5)


async def test_a_reset_reaches_subscribers_and_the_text_is_rebuilt_once() -> None:
    words = ["one ", "two ", "three ", "four"]
    with trio.fail_after(5):
        async with serving(dropped_then_ok(words, 2)) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
    events = stream.run_events
    kinds = [kind(e) for e in events]
    assert kinds.count("attempt.reset") == 1
    assert kinds.index("attempt.reset") > kinds.index("answer.delta")
    assert texts(events) == "".join(words)
    assert isinstance(events[-2], AnswerDone)
    assert events[-1].status == "completed"  # type: ignore[union-attr]


# --- cursors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cursor", ["x", "-1", "1.5", "99", "0123456789abcdef01234567:2"])
async def test_bad_cursors_are_refused_with_400_and_no_event(cursor: str) -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            by_header = await read_sse(
                served.client, run["events_url"], headers={"last-event-id": cursor}
            )
            by_query = await served.client.get(run["events_url"] + f"&after={cursor}")
    assert by_header.status == 400
    assert not by_header.events
    assert by_query.status_code == 400
    assert by_query.json()["error"]["type"] == "cursor_invalid"


async def test_a_cursor_below_the_kept_log_is_410_cursor_expired() -> None:
    words = [f"{n} " for n in range(40)]
    hub = Hub(log=MemoryRunLog(max_events=16))
    with trio.fail_after(5):
        async with serving([text_reply(words)], hub=hub) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            expired = await served.client.get(run["events_url"] + "&after=1")
            joined = await served.client.get(run["events_url"])
            first_kept = hub.log.get(run["run_id"]).base
    assert expired.status_code == 410
    assert expired.json()["error"]["type"] == "cursor_expired"
    assert expired.json()["error"]["first_kept"] == first_kept
    assert joined.status_code == 410  # joining from seq 1 would leave a gap too


async def test_resume_after_run_done_replays_within_retention_then_404() -> None:
    hub = Hub(log=MemoryRunLog(retention=0.3))
    with trio.fail_after(5):
        async with serving(hub=hub) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            replay = await read_sse(served.client, run["events_url"] + "&after=2")
            await trio.sleep(0.4)
            later = await served.client.get(run["events_url"])
    assert replay.seqs[0] == 3
    assert isinstance(replay.run_events[-1], RunDone)
    assert replay.clean_end
    assert later.status_code == 404
