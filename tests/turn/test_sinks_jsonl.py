"""The JSON Lines sink: batches fed by hand, and one real turn on loopback reaching the
terminal and two JSON Lines files."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

import msgspec
import pytest
import trio
import trio.testing
from rillet import CallbackSink, Policy, Sink, SinkBatch, TurnRequest, run_turn, user
from rillet._core._dialect import Provider
from rillet._core._events import (
    TextDelta,
    UniEvent,
    UsageMetadata,
    decode_uni_event,
    delta_event,
    encode_json,
    stop_event,
)
from rillet._core._markers import AttemptReset
from rillet._core._runevents import RunDone, RunEvent, RunStarted, decode_run_event
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.sinks import JSONLSink, TerminalSink
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream, split

if TYPE_CHECKING:
    from pathlib import Path

    from rillet._turn._turn import UniItem


# --- JSON Lines -----------------------------------------------------------------------------------


from ..sinks_support import (
    BrokenBytes,
    batch,
    builder,
    completed,
    feed,
    text,
)


def run_batches() -> list[SinkBatch]:
    b = builder()
    return [
        batch(b.started("openai-chat", "gpt")),
        batch(text(b, "Hel"), b.status("backing_off", 2, 0.1)),
        batch(b.reset(2), text(b, "Hello")),
        completed(b),
    ]


async def test_jsonl_run_writes_each_run_event_as_its_json_flushed_per_batch() -> None:
    class CountingBytes(io.BytesIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1

    file = CountingBytes()
    batches = run_batches()
    sink = JSONLSink(file)
    for one in batches:
        await sink.deliver(one)
    assert file.flushes == len(batches)
    await sink.close()
    assert not file.closed  # the caller's file stays open
    events = [event for one in batches for event in one.run]
    lines = file.getvalue().split(b"\n")
    assert lines[-1] == b""
    assert lines[:-1] == [msgspec.json.encode(event) for event in events]
    assert [decode_run_event(line) for line in lines[:-1]] == events


def uni_items() -> list[UniItem]:
    return [
        delta_event(TextDelta(text="Hel"), 1),
        AttemptReset(2),
        delta_event(TextDelta(text="Hello"), 2),
        stop_event(UsageMetadata(prompt_tokens=3, response_tokens=1), "stop", 3),
    ]


async def test_jsonl_uni_writes_mmsp_json_and_resets() -> None:
    file = io.BytesIO()
    items = uni_items()
    b = builder()
    sink = JSONLSink(file, kind="uni")
    await feed(
        sink,
        SinkBatch([b.started("p", "m")], items[:2]),
        SinkBatch([], items[2:]),
        completed(b),  # run events only: nothing written
    )
    lines = file.getvalue().decode().splitlines()
    assert len(lines) == 4
    assert json.loads(lines[1]) == {"type": "attempt.reset", "attempt": 2}
    for line, item in zip(lines, items, strict=True):
        if isinstance(item, UniEvent):
            assert line.encode() == encode_json(item)
            assert decode_uni_event(line) == item


async def test_jsonl_appends_to_a_path_and_closes_what_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"earlier":true}\n')
    batches = run_batches()
    sink = JSONLSink(path)
    await feed(sink, *batches)
    lines = path.read_bytes().splitlines()
    assert lines[0] == b'{"earlier":true}'
    assert [decode_run_event(line) for line in lines[1:]] == [e for one in batches for e in one.run]
    assert sink._file.closed


async def test_jsonl_writes_text_to_a_text_file_and_leaves_it_open() -> None:
    file = io.StringIO()
    items = uni_items()
    await feed(JSONLSink(file, kind="uni"), SinkBatch([], items))
    assert not file.closed
    expected = [
        encode_json(i) if isinstance(i, UniEvent) else b'{"type":"attempt.reset","attempt":2}'
        for i in items
    ]
    assert file.getvalue() == "".join(line.decode() + "\n" for line in expected)


async def test_jsonl_a_broken_pipe_stops_the_writing_without_raising() -> None:
    file = BrokenBytes()
    sink = JSONLSink(file)
    batches = run_batches()
    await feed(sink, *batches)
    assert sink.broken_pipe
    assert file.attempts == 1


def test_jsonl_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        JSONLSink(io.BytesIO(), kind="mmsp")  # type: ignore[arg-type]


# --- a real turn ----------------------------------------------------------------------------------


def loopback_provider(url: str) -> Provider:
    return Provider(dialect=OpenAIChatDialect(), base_url=f"{url}/v1", model="gpt-4o-mini")


async def test_a_real_turn_reaches_the_terminal_and_both_jsonl_files(tmp_path: Path) -> None:
    stream = openai_text_stream(["Hello", ", world", "!"])
    out, err = io.StringIO(), io.StringIO()
    terminal = TerminalSink(out, err)
    run_file = tmp_path / "run.jsonl"
    uni_file = io.BytesIO()
    seen_run: list[RunEvent] = []
    seen_uni: list[UniItem] = []
    watcher = CallbackSink(seen_run.append, seen_uni.append)
    sinks: list[Sink] = [terminal, JSONLSink(run_file), JSONLSink(uni_file, kind="uni"), watcher]
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=split(stream, 40))]) as p:
            result = await run_turn(
                TurnRequest(messages=[user("Hi")]), loopback_provider(p.url), sinks=sinks
            )
    assert result.ok
    assert out.getvalue() == "Hello, world!\n"
    assert err.getvalue() == ""
    run_lines = run_file.read_bytes().splitlines()
    assert [decode_run_event(line) for line in run_lines] == seen_run
    assert isinstance(seen_run[0], RunStarted)
    assert isinstance(seen_run[-1], RunDone)
    assert seen_run[-1].status == "completed"
    uni_lines = uni_file.getvalue().splitlines()
    assert [decode_uni_event(line) for line in uni_lines] == seen_uni
    assert seen_uni[-1].event_type == "stop"  # type: ignore[union-attr]


async def test_a_real_retry_shows_the_marker_and_the_restarted_text(tmp_path: Path) -> None:
    stream = openai_text_stream(["Hello", ", world!"])
    cut = len(b"\n\n".join(stream.split(b"\n\n")[:2])) + 2  # the role frame and "Hello"
    script = [Reply(chunks=(stream,), drop_after_bytes=cut), Reply(chunks=split(stream, 40))]
    out, err = io.StringIO(), io.StringIO()
    uni_file = tmp_path / "uni.jsonl"
    policy = Policy(backoff_base=0.01, random=lambda: 0.0)
    with trio.fail_after(10):
        async with open_loopback_provider(script) as p:
            result = await run_turn(
                TurnRequest(messages=[user("Hi")]),
                loopback_provider(p.url),
                sinks=[TerminalSink(out, err), JSONLSink(uni_file, kind="uni")],
                policy=policy,
            )
    assert result.ok
    assert result.attempts == 2
    assert out.getvalue() == "Hello\nHello, world!\n"
    assert err.getvalue() == (
        "retrying (attempt 2) in 10 ms: the connection broke off\n[attempt 2: output restarted]\n"
    )
    lines = [json.loads(line) for line in uni_file.read_bytes().splitlines()]
    assert {"type": "attempt.reset", "attempt": 2} in lines
