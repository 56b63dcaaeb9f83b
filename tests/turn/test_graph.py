"""The actor graph: each actor run alone on channels, and the two graphs (`chained`, `hops`)
giving the same events for the same provider."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import trio
import trio.testing
from rillet import (
    Outcome,
    Policy,
    RateLimiter,
    StreamProtocolError,
    TextDone,
    TurnRequest,
    UniEvent,
    encode_json,
    run_turn,
    user,
)
from rillet._core._lanes import (
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    RawUsage,
)
from rillet._core._markers import AttemptOpen, Status
from rillet._core._runevents import RunEventBuilder
from rillet._turn._graph import (
    AccumulatorActor,
    ChannelOutlet,
    Given,
    GrammarActor,
    Route,
    SinkBatch,
    sink_actor,
)
from rillet._turn._history import PlainLog
from rillet.lowlevel import Accumulator, AttemptReset
from rillet.providers import OpenAIChatDialect, Provider
from rillet.transports.testing import openai_text_body, openai_text_stream, split
from rillet.transports.upstream import MemoryReply, MemoryUpstream

Batch = list[Any]  # lanes and the source's markers, as the grammar actor takes them
USAGE = RawUsage(prompt_tokens=3, response_tokens=2)


def lanes(*texts: str, stop: bool = True) -> list[Any]:
    out: list[Any] = [MessageStart(), PartStart(index=0, kind="text")]
    out += [PartDelta(0, "text", t) for t in texts]
    if stop:
        out += [MessageDelta(finish_reason="stop", usage=USAGE), MessageStop()]
    return out


async def grammar_on_channels(batches: list[Batch]) -> tuple[list[Batch], GrammarActor]:
    """Run the grammar actor alone: `batches` in, what it forwards out."""
    send_in, receive_in = trio.open_memory_channel[Batch](4)
    send_out, receive_out = trio.open_memory_channel[Batch](64)
    actor = GrammarActor("test", clock=lambda: 0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run, receive_in, send_out)
        async with send_in:
            for batch in batches:
                await send_in.send(batch)
    return [batch async for batch in receive_out], actor


def texts(batches: list[Batch]) -> list[Any]:
    out: list[Any] = []
    for batch in batches:
        for item in batch:
            if isinstance(item, UniEvent):
                out.append(json.loads(encode_json(item))["content_items"] or "stop")
            else:
                out.append(item)
    return out


async def test_the_grammar_actor_checks_lanes_into_uni_events_on_its_channels() -> None:
    from rillet._turn._graph import GrammarVerdict, Settle

    verdict = GrammarVerdict()
    out, _ = await grammar_on_channels(
        [
            [AttemptOpen(1)],
            lanes("Hi", " there")[:4],
            lanes("Hi", " there")[4:],
            [Settle(False, verdict)],
        ]
    )
    assert verdict.done.is_set()
    assert verdict.error is None
    assert verdict.emitted == 4  # two deltas, the done, the stop
    got = texts(out)
    assert got[0] == [{"type": "text.delta", "text": "Hi"}]
    assert got[2] == [{"type": "text.done", "text": "Hi there"}]
    assert got[-1] == "stop"


async def test_the_grammar_actor_reports_a_breach_and_owes_the_reset() -> None:
    from rillet._turn._graph import GrammarVerdict, Settle

    first, second = GrammarVerdict(), GrammarVerdict()
    breach = [MessageStart(), PartStart(index=0, kind="text"), PartDelta(0, "text", "x"),
              PartDelta(7, "text", "lane never opened")]  # fmt: skip
    out, _ = await grammar_on_channels(
        [
            [AttemptOpen(1), *breach],
            [Settle(False, first)],
            [Status("backing_off", 2, 0.1)],
            [AttemptOpen(2), *lanes("ok")],
            [Settle(False, second)],
        ]
    )
    assert isinstance(first.error, StreamProtocolError)
    assert first.emitted == 1
    assert second.error is None
    items = texts(out)
    # the reset comes right before the second attempt's first event, naming that attempt
    reset = next(i for i, item in enumerate(items) if isinstance(item, AttemptReset))
    assert items[reset] == AttemptReset(2)
    assert isinstance(items[reset - 1], Status)
    assert items[reset + 1] == [{"type": "text.delta", "text": "ok"}]


async def test_markers_always_lead_a_forwarded_batch() -> None:
    out, _ = await grammar_on_channels(
        [
            [
                AttemptOpen(1),
                *lanes("a", stop=False),
                Status("backing_off", 2),
                PartDelta(0, "text", "b"),
            ]
        ]
    )
    for batch in out:
        kinds = [isinstance(item, UniEvent) for item in batch]
        assert kinds == sorted(kinds)  # markers (False) before events (True)


async def test_the_accumulator_actor_runs_alone_and_feeds_its_sinks() -> None:
    builder = RunEventBuilder("r1", lambda: 0.0)
    uni: PlainLog[Any] = PlainLog()
    run: PlainLog[Any] = PlainLog()
    sink_send, sink_receive = trio.open_memory_channel[SinkBatch](8)

    class Sink:
        got: list[SinkBatch] = []  # noqa: RUF012

        async def deliver(self, batch: SinkBatch) -> None:
            self.got.append(batch)

        async def close(self) -> None:
            pass

    sink, given = Sink(), Given()
    route = Route(sink, given, sink_send, None)
    actor = AccumulatorActor(Accumulator(), builder, uni, run, True, [route], [given])
    events, _ = await grammar_on_channels([[AttemptOpen(1), *lanes("Hello", "!")]])
    send, receive = trio.open_memory_channel[Batch](4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run, receive)
        nursery.start_soon(sink_actor, sink, sink_receive, given)
        async with send:
            for batch in events:
                await send.send(batch)
        await trio.testing.wait_all_tasks_blocked()
        await sink_send.aclose()
    assert actor.accumulator.text == "Hello!"
    kinds = [json.loads(encode_json(e))["type"] for e in run.items]
    assert kinds == ["answer.delta", "answer.delta"]  # the usage comes with the closing events
    assert sum(len(b.uni) for b in sink.got) == len(uni.items) == given.uni


async def test_the_channel_outlet_waits_for_room_and_for_the_verdict() -> None:
    send, receive = trio.open_memory_channel[Batch](1)
    outlet = ChannelOutlet(send)
    opening: Batch = [AttemptOpen(1)]
    assert outlet.offer(opening)
    assert not outlet.offer(lanes("x"))  # the channel holds one batch: this one waits
    async with trio.open_nursery() as nursery:
        forwarded: list[Batch] = []

        async def grammar() -> None:
            actor = GrammarActor("test", outlet, clock=lambda: 0)
            async for batch in receive:
                actor.step(batch, forwarded)

        nursery.start_soon(grammar)
        verdict = await outlet.settle(close=False)
        assert verdict.error is None
        assert verdict.emitted == 3
        await send.aclose()


# --- the two graphs, end to end -----------------------------------------------------------------


def provider() -> Provider:
    return Provider(OpenAIChatDialect(), "http://graph.invalid/v1", "m")


async def events_of(graph: str, replies: list[MemoryReply], **fields: Any) -> tuple[Any, ...]:
    policy = Policy(graph=graph, random=lambda: 0.0, **fields)
    upstream = MemoryUpstream(replies)
    async with trio.open_nursery() as nursery:
        turn = await nursery.start(
            lambda task_status: run_turn(
                TurnRequest(messages=[user("hi")]),
                provider(),
                upstream=upstream,
                policy=policy,
                limiter=RateLimiter(),
                task_status=task_status,
            )
        )
        result = await turn.result()
    run = [
        {k: v for k, v in json.loads(encode_json(e)).items() if k not in ("elapsed_ms", "run_id")}
        for e in [e async for e in turn.run_events()]
    ]
    uni = []
    for item in [i async for i in turn.uni_events()]:
        if isinstance(item, UniEvent):
            wire = json.loads(encode_json(item))
            wire.pop("created_at", None)
            uni.append(wire)
        else:
            uni.append(repr(item))
    return (
        run,
        uni,
        result.outcome,
        result.text,
        result.events,
        result.partial,
        result.attempts,
        result.provider_finish_reason,
    )


SSE = {"content-type": "text/event-stream"}
OK = openai_text_stream(["The ", "quick ", "fox."])
CUT = OK[: len(OK) // 2]  # the body ends half way: a truncation, retried
BREACH = b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}\n\n'
FILTERED = openai_text_stream(["The ", "qu"], finish_reason="content_filter")


@pytest.mark.parametrize(
    "replies",
    [
        [MemoryReply(split(OK, 7), headers=SSE)],
        [MemoryReply(split(CUT, 5), headers=SSE), MemoryReply(split(OK, 11), headers=SSE)],
        [MemoryReply(split(CUT, 5), headers=SSE)],  # every attempt cut: the rescue fails too
        [MemoryReply([OK[:40], BREACH], headers=SSE)],
        [MemoryReply([b'{"error": {"message": "no"}}'], status=400)],
        [MemoryReply(split(FILTERED, 9), headers=SSE)],
    ],
    ids=["ok", "cut-then-ok", "always-cut", "breach", "refused", "filtered"],
)
async def test_both_graphs_give_the_same_events(
    autojump_clock: trio.testing.MockClock, replies: list[MemoryReply]
) -> None:
    chained = await events_of("chained", replies)
    hops = await events_of("hops", replies)
    assert chained == hops
    assert chained[0][-1]["type"] == "run.done"


@pytest.mark.parametrize("graph", ["chained", "hops"])
async def test_the_providers_own_finish_reason_reaches_the_result(
    autojump_clock: trio.testing.MockClock, graph: str
) -> None:
    # the stop says `unknown`; the result keeps what it stood for, streamed or rescued
    streamed = await events_of(graph, [MemoryReply(split(FILTERED, 9), headers=SSE)])
    assert streamed[0][-2]["finish_reason"] == "unknown"
    assert (streamed[3], streamed[-1]) == ("The qu", "content_filter")
    whole = MemoryReply([openai_text_body("Half", finish_reason="content_filter")])
    rescued = await events_of(graph, [MemoryReply(split(CUT, 5), headers=SSE)] * 4 + [whole])
    assert rescued[2] is Outcome.RESCUED
    assert (rescued[3], rescued[-1]) == ("Half", "content_filter")
    plain = await events_of(graph, [MemoryReply(split(OK, 7), headers=SSE)])
    assert plain[-1] == "stop"


def test_the_graph_is_checked() -> None:
    with pytest.raises(ValueError, match="graph"):
        Policy(graph="loops")
    assert Policy().graph == "chained"
    assert Outcome.COMPLETED.succeeded


# --- the text, accumulated once -------------------------------------------------------------------


def test_answer_text_joins_fragments_a_few_at_a_time_and_reads_whole() -> None:
    from rillet._core._text import AnswerText

    answer = AnswerText()
    for i in range(1000):
        answer.append(str(i % 10))
    assert len(answer.parts) == 3 + 229  # runs of 257 joined, the tail not yet: not 1000
    expected = "".join(str(i % 10) for i in range(1000))
    assert answer.text == expected
    assert answer.chars == 1000
    assert answer.sha256 == hashlib.sha256(expected.encode()).hexdigest()
    answer.reset()
    assert answer.text == ""


def test_the_run_events_read_the_accumulators_text_and_do_not_keep_their_own() -> None:
    accumulator = Accumulator()
    builder = RunEventBuilder("r", lambda: 0.0, text=accumulator.answer)
    events: list[UniEvent] = []
    from rillet._core._grammar import Grammar

    grammar = Grammar("test", clock=lambda: 0)
    grammar.feed_many(lanes("Hello", ", world"), events)
    accumulator.feed_many(events)
    runs: list[Any] = []
    builder.uni_many(events, runs)
    # the text is kept once: the answer holds the `text.done` item's own string, not a copy
    done_item = accumulator.items[0]
    assert isinstance(done_item, TextDone)
    assert len(accumulator.answer.parts) == 1
    assert accumulator.answer.parts[0] is done_item.text
    assert builder.text == accumulator.text == "Hello, world"
    closing = builder.finish(Outcome.COMPLETED, None, attempts=1)
    done = json.loads(encode_json(closing[0]))
    assert (done["type"], done["chars"]) == ("answer.done", 12)
    accumulator.reset()  # the owner voids it; the run events see the void too
    builder.reset(2)
    assert builder.text == ""


async def test_a_turns_result_message_and_run_events_agree_on_the_text() -> None:
    replies = [MemoryReply(split(OK, 7), headers=SSE)]
    run, _, outcome, text, *_ = await events_of("chained", replies)
    assert outcome is Outcome.COMPLETED
    assert text == "The quick fox."
    done = next(e for e in run if e["type"] == "answer.done")
    assert done["chars"] == len(text)
    assert done["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert "".join(e["delta"] for e in run if e["type"] == "answer.delta") == text
