"""The grammar: lane events in, checked UniEvents out. Pure: no I/O, no trio, no clock but the
injected one that stamps `created_at`.

Theory of operation
-------------------
A dialect opens lanes, feeds them fragments and closes them; on the wire lanes may interleave
(two Chat Completions tool calls alternating by `index`). MMSP's grammar forbids that: groups
`K.delta+ K.done` never interleave. So the grammar keeps a queue of lanes in the order they
opened. The lane at the head of the queue is *active*: its fragments go out at once. A fragment
for any other open lane is held in that lane until every lane before it has closed; then its held
fragments go out in arrival order, and if it has closed meanwhile, its `.done` follows at once.
No fragment is ever attributed to the wrong item, and nothing is dropped or reordered within an
item.

What goes out for a fragment (MMSP's rules): a fragment whose growing field is empty is dropped,
unless it carries a fidelity not yet seen in its lane, or it is the first fragment of a tool call
(which carries the call's name and id); every later tool fragment has `name: ""` and
`tool_call_id: ""`. A lane whose fragments all were dropped has no `.done`.

A lane's `.done` is its first fragment with the growing field replaced by the join of all of
them: text and thinking concatenated, bytes concatenated, tool arguments parsed once from the
joined string (`""` parses to `{}`), plus the lane's one fidelity. A finish reason closes every
lane still open; `MessageStop` ends the reply: the stop event goes out with the merged usage and
the finish reason mapped onto `stop | length | tool_call | unknown`. A reply that reached its
terminal event is complete even when the provider gave no usage (the counts are all null) or no
finish reason (`unknown`); anything after the stop is ignored.

A lane still open when the stream ends without `MessageStop`, or when the provider reports an
error, gets no `.done`: a `.done` promises a complete item.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ._arguments import parse_arguments
from ._errors import (
    EmptyResponseError,
    IncompleteStreamError,
    StreamProtocolError,
)
from ._events import (
    EmbeddingDelta,
    EmbeddingDone,
    FinishReason,
    InlineDataDelta,
    InlineDataDone,
    InlineThinkingDelta,
    InlineThinkingDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UsageMetadata,
    stop_event,
)
from ._finish import map_finish_reason
from ._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartRun,
    PartStart,
    PartStop,
    Ping,
    ProviderErrorEvent,
    RawUsage,
)
from ._markers import DeltaRun

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Grammar", "wall_clock_ms"]

_NO_USAGE = UsageMetadata(
    cached_tokens=None, prompt_tokens=None, thoughts_tokens=None, response_tokens=None
)
_THINKING_KINDS = frozenset({"thinking", "inline_thinking"})


def wall_clock_ms() -> int:
    """Unix time in milliseconds: what `created_at` carries."""
    return time.time_ns() // 1_000_000


_PIECE = 256
"""A lane's string fragments are joined 256 at a time as they come: a long reply keeps a few
long strings rather than one object per fragment, and joining costs linear time overall."""


def _join_tail(lane: _Lane) -> None:
    """Join the fragments after the pieces already joined into one more piece."""
    chunks = lane.chunks
    chunks[lane.pieces :] = ["".join(chunks[lane.pieces :])]
    lane.pieces += 1


class _Lane:
    """One open item: its header, its fragments so far, and what is held while it waits."""

    __slots__ = (
        "call_id",
        "chunks",
        "closed",
        "fidelity",
        "held",
        "index",
        "kind",
        "mime_type",
        "name",
        "pieces",
        "started",
    )

    def __init__(self, start: PartStart) -> None:
        self.kind: LaneKind = start.kind
        self.index = start.index
        self.name = start.name
        self.call_id = start.call_id
        self.mime_type = start.mime_type
        self.chunks: list[Any] = []
        self.pieces = 0  # chunks[:pieces] are runs of fragments already joined (`_keep`)
        self.held: list[PartDelta] = []
        self.fidelity: dict[str, Any] | None = None
        self.started = False  # a fragment of it went out
        self.closed = False


class Grammar:
    """Turns one attempt's lane events into MMSP UniEvents, enforcing the grammar.

    `feed` takes one lane event and returns the UniEvents it releases (often one, sometimes none,
    several when a held lane is released). `close` is called at end of input. Lane events after
    the stop are ignored. Violations raise `StreamProtocolError`; a stream that ends without its
    terminal event raises
    `IncompleteStreamError`; a reply of thinking only raises `EmptyResponseError`; a closed tool
    call whose arguments do not parse raises `ToolCallArgumentParseError` in place of its `.done`.
    After any error the grammar is spent. `stopped` says whether the stop event has gone out.

    With `runs` on, a run of fragments for the lane streaming now (`PartRun`) comes out as one
    `DeltaRun` standing for its deltas, for a reader that wants only their strings; `folded`
    counts the UniEvents those stood for beyond one each.
    """

    __slots__ = (
        "_clock",
        "_content_seen",
        "_finish",
        "_lanes",
        "_queue",
        "_started",
        "_thinking_seen",
        "_usage",
        "folded",
        "message_id",
        "model",
        "provider",
        "runs",
        "stopped",
    )

    def __init__(self, provider: str, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.provider = provider
        self.runs = False  # release a run of fragments as one `DeltaRun` (`feed_many`)
        self.folded = 0  # the UniEvents the `DeltaRun`s released so far stand for, less one each
        self._clock = clock
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._queue: deque[_Lane] = deque()
        self._usage: RawUsage | None = None
        self._finish: str | None = None
        self.stopped = False  # the stop event has gone out (set here only)
        self._started = False
        self._content_seen = False
        self._thinking_seen = False
        self.message_id = ""
        self.model = ""

    @property
    def provider_finish(self) -> str | None:
        """The provider's own finish reason as it spelt it (`content_filter`, `SAFETY`), if it
        gave one: what a stop's `unknown` stands for."""
        return self._finish

    def feed(self, event: LaneEvent, out: list[UniEvent] | None = None) -> list[UniEvent]:
        """Take one lane event; append the UniEvents it releases to `out` (a new list if None),
        in order, and return it. If it raises, `out` still holds every event released before
        the error (a `.done` of a lane closed before the one that failed, say)."""
        if out is None:
            out = []
        if self.stopped:
            return out  # the reply is over: nothing after its terminal event matters
        if type(event) is PartRun:  # the same as its fragments one by one
            for value in event.values:
                self.feed(PartDelta(event.index, event.kind, value), out)
            return out
        if type(event) is PartDelta:
            lane = self._lanes.get((event.kind, event.index))
            if lane is None:
                raise self._no_lane(event)
            if self._queue[0] is lane:
                emitted = self._emit(lane, event.value, event.fidelity)
                if emitted is not None:
                    out.append(emitted)
            else:
                lane.held.append(event)
        elif type(event) is PartStart:
            self._start(event)
        elif type(event) is PartStop:
            self._stop_lane(event, out)
        elif type(event) is MessageDelta:
            self._message_delta(event, out)
        elif type(event) is MessageStop:
            self._message_stop(out)
        elif type(event) is ProviderErrorEvent:
            raise event.error
        elif type(event) is MessageStart:
            if self._started:
                raise self._violation("a second message start")
            self._started = True
            self.message_id = event.id or self.message_id
            self.model = event.model or self.model
        elif type(event) is not Ping:
            raise self._violation(f"not a lane event: {type(event).__name__}")
        return out

    def feed_many(self, events: list[LaneEvent], out: list[UniEvent]) -> None:
        """Take lane events in order, appending what they release to `out`.

        The same as `feed` for each, with a fast path for the commonest events by far: a
        non-empty text, thinking or later tool fragment, without fidelity, for the lane
        streaming now, alone (`PartDelta`) or in a run of them (`PartRun`).
        """
        stopped = self.stopped  # (a local: `feed` below may set the attribute)
        if stopped:
            return  # the reply is over: the batch is ignored
        queue = self._queue
        now = -1  # the batch's stamp, read once (when a UniEvent needs it): they came together
        for event in events:
            if type(event) is PartDelta and queue:
                head = queue[0]
                value = event.value
                if (
                    head.index == event.index
                    and head.kind == event.kind
                    and event.fidelity is None
                    and type(value) is str
                    and value
                ):
                    kind = head.kind
                    if kind == "text":
                        item: Any = TextDelta(text=value)
                    elif kind == "thinking":
                        item = ThinkingDelta(thinking=value)
                    elif kind == "tool_call" and head.started:  # a later argument fragment
                        item = ToolCallDelta(name="", arguments=value, tool_call_id="")
                    else:
                        self.feed(event, out)
                        if self.stopped:
                            return
                        continue
                    head.started = True
                    chunks = head.chunks
                    chunks.append(value)
                    if len(chunks) - head.pieces > _PIECE:
                        _join_tail(head)
                    if now < 0:
                        now = self._clock()
                    out.append(UniEvent(event_type="delta", content_items=[item], created_at=now))
                    continue
            elif type(event) is PartRun and queue:
                head = queue[0]
                kind = head.kind
                values = event.values
                if (
                    head.index == event.index
                    and kind == event.kind
                    # the kinds the UniEvents below are made for; any other goes the slow way
                    and (
                        kind == "text"
                        or kind == "thinking"
                        or (kind == "tool_call" and head.started)
                    )
                    and all(values)
                ):
                    if self.runs:
                        out.append(DeltaRun(kind, values))  # type: ignore[arg-type]
                        self.folded += len(values) - 1
                    else:
                        if now < 0:  # (a run needs no stamp: it is read here, for UniEvents)
                            now = self._clock()
                        if kind == "text":
                            out += [
                                UniEvent(
                                    event_type="delta",
                                    content_items=[TextDelta(text=v)],
                                    created_at=now,
                                )
                                for v in values
                            ]
                        elif kind == "thinking":
                            out += [
                                UniEvent(
                                    event_type="delta",
                                    content_items=[ThinkingDelta(thinking=v)],
                                    created_at=now,
                                )
                                for v in values
                            ]
                        else:
                            out += [
                                UniEvent(
                                    event_type="delta",
                                    content_items=[
                                        ToolCallDelta(name="", arguments=v, tool_call_id="")
                                    ],
                                    created_at=now,
                                )
                                for v in values
                            ]
                    head.started = True
                    chunks = head.chunks
                    chunks += values
                    if len(chunks) - head.pieces > _PIECE:
                        _join_tail(head)
                    continue
            self.feed(event, out)
            if self.stopped:
                return  # the reply is over: the rest of the batch is ignored

    def close(self) -> list[UniEvent]:
        """End of input. Returns nothing after a stop; raises `IncompleteStreamError` otherwise."""
        if self.stopped:
            return []
        missing = self._missing() or ("the terminal event",)
        raise IncompleteStreamError(
            self.provider, missing, self._mapped_finish(), self._usage_metadata()
        )

    # --- lanes ----------------------------------------------------------------------------------

    def _start(self, event: PartStart) -> None:
        key = (event.kind, event.index)
        if key in self._lanes:
            raise self._violation(f"{event.kind} lane {event.index} opened twice")
        if event.kind == "tool_call" and not (event.name and event.call_id):
            raise self._violation(
                f"tool call lane {event.index} must carry the name and the tool_call_id"
            )
        lane = _Lane(event)
        self._lanes[key] = lane
        self._queue.append(lane)

    def _stop_lane(self, event: PartStop, out: list[UniEvent]) -> None:
        lane: _Lane | None = None
        if event.index is None:
            lane = next((q for q in self._queue if not q.closed), None)
            if lane is None:
                raise self._violation("PartStop with no open lane")
        elif event.kind is not None:
            lane = self._lanes.get((event.kind, event.index))
        else:
            lane = next((q for q in self._queue if not q.closed and q.index == event.index), None)
        if lane is None:
            raise self._violation(f"PartStop for lane {event.index}, which is not open")
        self._close(lane, out)

    def _close(self, lane: _Lane, out: list[UniEvent]) -> None:
        """Close a lane. What it releases is appended to `out` as it goes, so if a later `.done`
        raises, everything released before it is still there."""
        lane.closed = True
        del self._lanes[(lane.kind, lane.index)]
        if self._queue[0] is not lane:
            return  # it waits its turn; its `.done` goes out when it is released
        queue = self._queue
        while queue and queue[0].closed:
            done = self._done(queue.popleft())
            if done is not None:
                out.append(done)
            if queue:  # release what the next lane held
                head = queue[0]
                held, head.held = head.held, []
                for fragment in held:
                    emitted = self._emit(head, fragment.value, fragment.fidelity)
                    if emitted is not None:
                        out.append(emitted)

    def _close_all(self, out: list[UniEvent]) -> None:
        for lane in list(self._queue):
            if not lane.closed:
                self._close(lane, out)

    def _emit(self, lane: _Lane, value: Any, fidelity: dict[str, Any] | None) -> UniEvent | None:
        if fidelity:
            if lane.fidelity is None:
                lane.fidelity = fidelity
            elif lane.fidelity == fidelity:
                fidelity = None  # a repeated fidelity goes out once
            else:
                raise self._violation(
                    f"{lane.kind} lane {lane.index} carried two different fidelity payloads"
                )
        kind = lane.kind
        if kind == "text":
            if type(value) is not str:
                raise self._wrong_value(lane, value)
            if not value and not fidelity:
                return None
            item: Any = TextDelta(text=value, fidelity=fidelity)
        elif kind == "thinking":
            if type(value) is not str:
                raise self._wrong_value(lane, value)
            if not value and not fidelity:
                return None
            item = ThinkingDelta(thinking=value, fidelity=fidelity)
        elif kind == "tool_call":
            if not isinstance(value, str):
                raise self._wrong_value(lane, value)
            if lane.started:
                if not value and not fidelity:
                    return None
                item = ToolCallDelta(name="", arguments=value, tool_call_id="", fidelity=fidelity)
            else:
                item = ToolCallDelta(
                    name=lane.name, arguments=value, tool_call_id=lane.call_id, fidelity=fidelity
                )
        elif kind == "embedding":
            if not isinstance(value, list):
                raise self._wrong_value(lane, value)
            item = EmbeddingDelta(embedding=value)
        else:
            if not isinstance(value, bytes):
                raise self._wrong_value(lane, value)
            if not value and not fidelity:
                return None
            cls = InlineDataDelta if kind == "inline_data" else InlineThinkingDelta
            item = cls(data=value, mime_type=lane.mime_type, fidelity=fidelity)
        lane.started = True
        lane.chunks.append(value)
        if len(lane.chunks) - lane.pieces > _PIECE and type(value) is str:
            _join_tail(lane)
        return UniEvent(event_type="delta", content_items=[item], created_at=self._clock())

    def _done(self, lane: _Lane) -> UniEvent | None:
        if not lane.started:
            return None
        kind = lane.kind
        fidelity = lane.fidelity
        item: Any
        if kind == "text":
            item = TextDone(text="".join(lane.chunks), fidelity=fidelity)
        elif kind == "thinking":
            item = ThinkingDone(thinking="".join(lane.chunks), fidelity=fidelity)
        elif kind == "tool_call":
            item = ToolCallDone(
                name=lane.name,
                arguments=self._parse_arguments(lane),
                tool_call_id=lane.call_id,
                fidelity=fidelity,
            )
        elif kind == "embedding":
            item = EmbeddingDone(embedding=[v for chunk in lane.chunks for v in chunk])
        elif kind == "inline_data":
            item = InlineDataDone(
                data=b"".join(lane.chunks), mime_type=lane.mime_type, fidelity=fidelity
            )
        else:
            item = InlineThinkingDone(
                data=b"".join(lane.chunks), mime_type=lane.mime_type, fidelity=fidelity
            )
        if kind not in _THINKING_KINDS:
            self._content_seen = True
        else:
            self._thinking_seen = True
        return UniEvent(event_type="delta", content_items=[item], created_at=self._clock())

    def _parse_arguments(self, lane: _Lane) -> dict[str, Any]:
        return parse_arguments("".join(lane.chunks), self.provider, lane.name, lane.call_id)

    # --- the message ----------------------------------------------------------------------------

    def _message_delta(self, event: MessageDelta, out: list[UniEvent]) -> None:
        if event.usage is not None:
            self._usage = _merge_usage(self._usage, event.usage)
        if event.finish_reason is not None:
            self._finish = event.finish_reason
            self._close_all(out)

    def _message_stop(self, out: list[UniEvent]) -> None:
        # the terminal event makes the reply complete, whatever it lacks: usage never reported
        # is all null, a finish reason never given is `unknown` (many compatible servers ignore
        # `include_usage`; some gateways never set a finish reason)
        self._close_all(out)
        usage = self._usage_metadata() or _NO_USAGE
        finish = self._mapped_finish() or "unknown"
        if not self._content_seen:
            raise EmptyResponseError(
                self.provider,
                finish,
                usage,
                provider_reason=self._finish,
                thinking=self._thinking_seen,
            )
        self.stopped = True
        out.append(stop_event(usage, finish, self._clock()))

    def _missing(self) -> tuple[str, ...]:
        missing = []
        if self._usage is None:
            missing.append("usage_metadata")
        if self._finish is None:
            missing.append("finish_reason")
        return tuple(missing)

    def _mapped_finish(self) -> FinishReason | None:
        return None if self._finish is None else map_finish_reason(self._finish)

    def _usage_metadata(self) -> UsageMetadata | None:
        u = self._usage
        if u is None:
            return None
        return UsageMetadata(
            cached_tokens=u.cached_tokens,
            prompt_tokens=u.prompt_tokens,
            thoughts_tokens=u.thoughts_tokens,
            response_tokens=u.response_tokens,
        )

    # --- errors ---------------------------------------------------------------------------------

    def _violation(self, message: str) -> StreamProtocolError:
        return StreamProtocolError(self.provider, message)

    def _no_lane(self, event: PartDelta) -> StreamProtocolError:
        other = next((q for q in self._queue if q.index == event.index and not q.closed), None)
        if other is not None:
            return self._violation(
                f"a {event.kind} fragment for lane {event.index}, which is a {other.kind} lane"
            )
        return self._violation(f"a {event.kind} fragment for lane {event.index}, which is not open")

    def _wrong_value(self, lane: _Lane, value: Any) -> StreamProtocolError:
        return self._violation(
            f"a {type(value).__name__} fragment for {lane.kind} lane {lane.index}"
        )


def _merge_usage(old: RawUsage | None, new: RawUsage) -> RawUsage:
    """Field by field; later non-null values win."""
    if old is None:
        return new
    return RawUsage(
        cached_tokens=new.cached_tokens if new.cached_tokens is not None else old.cached_tokens,
        prompt_tokens=new.prompt_tokens if new.prompt_tokens is not None else old.prompt_tokens,
        thoughts_tokens=(
            new.thoughts_tokens if new.thoughts_tokens is not None else old.thoughts_tokens
        ),
        response_tokens=(
            new.response_tokens if new.response_tokens is not None else old.response_tokens
        ),
    )
