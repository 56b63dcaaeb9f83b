"""Runs of deltas (`DeltaRun`): a turn whose only reader is its accumulator (no sink, no handle)
has its grammar release a run of one lane's fragments as one item instead of a UniEvent per
fragment. The rule checked here: nothing a caller can see changes. The sans-I/O half checks that
a run stands for exactly the UniEvents it replaces (expanded, they are the same list, and the
count of what was folded is exact) on every fixture and bench stream at several read sizes; the
loopback half runs whole turns over real sockets, with a failed attempt and its retry, with and
without a reader, and compares every fact of their results."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import pytest
import trio
import trio.testing
from rillet._core._events import TextDelta, ThinkingDelta, ToolCallDelta, UniEvent
from rillet._core._grammar import Grammar
from rillet._core._policy import Outcome
from rillet._turn._api import run_turn
from rillet._turn._graph import AccumulatorActor
from rillet._turn._ratelimit import RateLimiter
from rillet.lowlevel import DeltaRun, LaneKind, WireDecoder
from rillet.providers import AnthropicDialect, Provider, Secret
from rillet.transports.testing import Reply, Script, open_loopback_provider

from bench.contestants import dialect_of
from bench.wire import STREAM_KINDS, build_stream

from ..handler_support import OK, REQUEST, TEXT, anthropic_events, openai_events, policy
from ..providers.test_fixtures import DIALECTS, dialect_for
from ..wire_cases import FIXTURES
from .test_turn_loopback import provider_at

if TYPE_CHECKING:
    from rillet._turn._turn import Turn, TurnResult


def expand(items: list[Any]) -> list[Any]:
    """The UniEvents a list of released items stands for (a `DeltaRun` as its deltas)."""
    out: list[Any] = []
    for item in items:
        if type(item) is not DeltaRun:
            out.append(item)
            continue
        for value in item.values:
            if item.kind == "text":
                content: Any = TextDelta(text=value)
            elif item.kind == "thinking":
                content = ThinkingDelta(thinking=value)
            else:
                content = ToolCallDelta(name="", arguments=value, tool_call_id="")
            out.append(UniEvent(event_type="delta", content_items=[content], created_at=0))
    return out


def decode(dialect: Any, chunks: list[bytes], *, runs: bool) -> tuple[list[Any], int, str]:
    """Every item the decoder released, what its runs folded, and the error that ended it."""
    decoder = WireDecoder(dialect, clock=lambda: 0)
    decoder.grammar.runs = runs
    out: list[Any] = []
    error = ""
    try:
        for chunk in chunks:
            decoder.feed(chunk, out)
        decoder.close(out)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return out, decoder.grammar.folded, error


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


FIXTURE_FILES = sorted(
    (folder, path.name)
    for folder in DIALECTS
    for path in (FIXTURES / folder).iterdir()
    if path.suffix in (".sse", ".ndjson") and not path.name.endswith(".expected.json")
)


def check_runs_stand_for_their_deltas(dialect: Any, data: bytes) -> int:
    """At every read size: the runs, expanded, are the plain decode, errors alike. Returns how
    many runs were seen, so a caller can tell the check had something to check."""
    seen = 0
    for size in (1, 7, 64, 500, len(data) or 1):
        chunks = reads(data, size)
        plain, folded_plain, error_plain = decode(dialect, chunks, runs=False)
        with_runs, folded, error = decode(dialect, chunks, runs=True)
        assert folded_plain == 0
        assert expand(with_runs) == plain
        assert error == error_plain
        runs = [item for item in with_runs if type(item) is DeltaRun]
        assert len(with_runs) + folded == len(plain)  # the count a turn reports stays exact
        seen += len(runs)
    return seen


@pytest.mark.parametrize(("folder", "name"), FIXTURE_FILES)
def test_runs_stand_for_their_deltas_in_every_fixture(folder: str, name: str) -> None:
    check_runs_stand_for_their_deltas(dialect_for(folder), (FIXTURES / folder / name).read_bytes())


@pytest.mark.parametrize("kind", sorted(STREAM_KINDS))
def test_runs_stand_for_their_deltas_in_every_bench_stream(kind: str) -> None:
    stream = build_stream(kind, 300)
    seen = check_runs_stand_for_their_deltas(dialect_of(stream.dialect), b"".join(stream.chunks))
    assert seen  # every bench stream has runs: the check above had them to check


def test_a_tool_lane_not_yet_started_goes_the_slow_way() -> None:
    from rillet._core._lanes import MessageStart, PartRun, PartStart

    grammar = Grammar("test", clock=lambda: 0)
    grammar.runs = True
    out: list[Any] = []
    start = PartStart(index=0, kind="tool_call", name="f", call_id="c")
    grammar.feed_many([MessageStart("m", "model"), start], out)
    first: list[Any] = []
    grammar.feed_many([PartRun(0, "tool_call", ['{"a"', ": 1}"])], first)
    # the first fragment of a call carries its name and id: never folded
    assert not any(type(item) is DeltaRun for item in first)
    later: list[Any] = []
    grammar.feed_many([PartRun(0, "tool_call", [", ", '"b": 2'])], later)
    assert later == [DeltaRun("tool_call", [", ", '"b": 2'])]
    assert grammar.folded == 1


# --- whole turns over loopback, with and without a reader --------------------------------------


LIMIT = 3600.0


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.02)


class Recording(WireDecoder):
    """A wire decoder that notes every decoder made and what its grammar released."""

    made: ClassVar[list[Recording]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.released: list[Any] = []
        Recording.made.append(self)

    def feed(self, chunk: bytes, out: list[Any] | None = None) -> list[Any]:
        out = [] if out is None else out
        start = len(out)
        try:
            return super().feed(chunk, out)
        finally:
            self.released += out[start:]


async def one_turn(
    script: Script, *, reader: str, anthropic: bool = False
) -> tuple[TurnResult, list[Recording]]:
    """One turn against a loopback provider playing `script` (OpenAI Chat, or Anthropic):
    awaited alone (`none`), with a sink (`sink`), or started for its handle (`handle`)."""
    Recording.made = []
    with trio.fail_after(LIMIT):
        async with open_loopback_provider(script) as server, httpx.AsyncClient() as client:
            provider = provider_at(server)
            if anthropic:
                provider = Provider(
                    dialect=AnthropicDialect(),
                    base_url=server.url,
                    model="test-model",
                    api_key=Secret("sk-test"),
                )
            turn_of = functools.partial(
                run_turn,
                REQUEST,
                provider,
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
            )
            if reader == "none":
                result = await turn_of()
            elif reader == "sink":
                seen: list[Any] = []
                result = await turn_of(on_text=seen.append)
            else:
                async with trio.open_nursery() as nursery:
                    turn: Turn = await nursery.start(turn_of)
                result = await turn.result()
    return result, Recording.made


def facts(result: TurnResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome,
        "text": result.text,
        "events": result.events,
        "attempts": result.attempts,
        "requests": result.requests,
        "partial": result.partial,
        "message": result.message,
        "error": repr(result.error),
    }


DROPPED = Reply(chunks=(*OK[:3], OK[3]), drop_after_bytes=len(b"".join(OK[:3])))
SCRIPTS = {
    "ok": [Reply(chunks=tuple(OK))],
    "dropped, then ok": [DROPPED, Reply(chunks=tuple(OK))],
    "cut short, then ok": [Reply(chunks=tuple(OK[:4])), Reply(chunks=tuple(OK))],
}


@pytest.mark.parametrize("script", list(SCRIPTS))
async def test_a_turn_with_no_reader_ends_as_one_with_a_reader(
    loop_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    monkeypatch.setattr("rillet._turn._handler.WireDecoder", Recording)
    alone, decoders = await one_turn(SCRIPTS[script], reader="none")
    assert alone.outcome is Outcome.COMPLETED
    assert alone.text == TEXT
    # the turn no one reads released runs, and every attempt's grammar was told to
    assert decoders
    assert all(d.grammar.runs for d in decoders)
    assert any(type(item) is DeltaRun for d in decoders for item in d.released)
    for reader in ("sink", "handle"):
        read, decoders = await one_turn(SCRIPTS[script], reader=reader)
        assert facts(read) == facts(alone)
        assert decoders
        assert not any(d.grammar.runs for d in decoders)
        assert not any(type(item) is DeltaRun for d in decoders for item in d.released)


LONG = openai_events([f"w{i} " for i in range(150)])  # more runs than a turn holds back at once
LONG_DROPPED = Reply(chunks=tuple(LONG[:101]), drop_after_bytes=len(b"".join(LONG[:100])))
ANTHROPIC = anthropic_events()  # its first delta is a run: nothing visible comes before it
ANTHROPIC_DROPPED = Reply(
    chunks=tuple(ANTHROPIC[:5]), drop_after_bytes=len(b"".join(ANTHROPIC[:4]))
)
ENDINGS = {
    "dropped every time": [DROPPED],
    "anthropic, dropped every time": [ANTHROPIC_DROPPED],
    "anthropic, dropped, then ok": [ANTHROPIC_DROPPED, Reply(chunks=tuple(ANTHROPIC))],
    "stalled every time": [Reply(chunks=tuple(OK), stall_after=4)],
    "long, dropped, then ok": [LONG_DROPPED, Reply(chunks=tuple(LONG))],
    "long, dropped every time": [LONG_DROPPED],
}


@pytest.mark.parametrize("script", list(ENDINGS))
async def test_a_turn_with_no_reader_keeps_every_fragment_however_its_attempts_end(
    loop_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    """The runs a turn with no reader holds back (one hand-over for many reads) reach its
    accumulator however an attempt ends: cut off, timed out, before its retry. Its result is
    that of the same turn with a reader, partial text included."""
    monkeypatch.setattr("rillet._turn._handler.WireDecoder", Recording)
    offers: list[int] = []
    offer = AccumulatorActor.offer

    def counted(self: AccumulatorActor, items: Any) -> bool:
        offers.append(len(items))
        return offer(self, items)

    monkeypatch.setattr(AccumulatorActor, "offer", counted)
    anthropic = script.startswith("anthropic")
    alone, decoders = await one_turn(ENDINGS[script], reader="none", anthropic=anthropic)
    runs = sum(type(item) is DeltaRun for d in decoders for item in d.released)
    assert alone.text  # something was read, whatever the outcome
    if script.startswith("long"):  # far fewer hand-overs than reads: the runs were held back
        assert runs > 100
        assert len(offers) * 16 < runs
    for reader in ("sink", "handle"):
        read, _ = await one_turn(ENDINGS[script], reader=reader, anthropic=anthropic)
        assert facts(read) == facts(alone)


@pytest.mark.parametrize("kind", ["inline_data", "inline_thinking", "embedding"])
def test_a_run_of_another_kind_goes_the_slow_way(kind: LaneKind) -> None:
    from rillet._core._lanes import (
        MessageDelta,
        MessageStart,
        MessageStop,
        PartRun,
        PartStart,
        PartStop,
    )

    lanes: list[Any] = [
        MessageStart("m", "model"),
        PartStart(index=0, kind="text"),
        PartRun(0, "text", ["a", "b"]),
        PartStop(0, "text"),
        PartStart(index=1, kind=kind, mime_type="image/png"),
        PartRun(1, kind, ["x", "y"]),
        PartStop(1, kind),
        MessageDelta(finish_reason="stop"),
        MessageStop(),
    ]
    released: dict[bool, tuple[list[Any], str]] = {}
    for runs in (False, True):
        grammar = Grammar("test", clock=lambda: 0)
        grammar.runs = runs
        out: list[Any] = []
        error = ""
        try:
            grammar.feed_many(lanes, out)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        released[runs] = (out, error)
    with_runs, error = released[True]
    # the text run folds; the other kind's run is read as its fragments, as without runs
    assert with_runs[0] == DeltaRun("text", ["a", "b"])
    assert (expand(with_runs), error) == released[False]
