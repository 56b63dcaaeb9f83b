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

What differs between kinds (the field a fragment grows, the item types, the join, the header a
tool call or inline data carries) is one entry of `_KINDS` each; a lane takes its entry when it
opens, and nothing else in the grammar branches on a kind.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

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

__all__ = ["Grammar", "wall_clock_ms"]

_NO_USAGE = UsageMetadata(
    cached_tokens=None, prompt_tokens=None, thoughts_tokens=None, response_tokens=None
)


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


@attrs.frozen
class _Kind:
    """What the grammar does with one lane kind: the one place a kind's items are described.

    A fragment's value grows the item field `field` and must pass `accepts`; it goes out as a
    `delta` item, the lane's close as a `done` item whose field is the fragments joined by
    `join` (for a tool call, the joined string parsed once into its arguments: `parsed`). Each
    item also carries the lane's header: the item fields `header` names, read from the lane's
    start; with `header_first`, only the first delta carries them and later ones have `""`.
    """

    field: str  # the item field a fragment grows: "text", "arguments", "data"...
    accepts: Callable[[Any], bool]  # whether a fragment's value is of this kind's type
    delta: Callable[..., Any]  # the delta item's type
    done: Callable[..., Any]  # the done item's type
    join: Callable[[list[Any]], Any]  # the fragments, joined into the done's field
    parsed: bool = False  # the joined string is tool arguments, parsed into a JSON object
    header: tuple[tuple[str, str], ...] = ()  # (item field, lane attribute) every item carries
    header_first: bool = False  # only the first delta carries the header; it is never dropped
    fidelity: bool = True  # its items carry a fidelity
    drops_empty: bool = True  # a fragment with an empty value and no new fidelity is dropped
    thinking: bool = False  # it is reasoning, not content: a reply of these alone is empty
    later: Callable[[str], Any] | None = None
    """The delta item of a later, non-empty string fragment without fidelity (the commonest
    fragment by far): the fast path's own constructor, None for a kind it does not take."""


def _is_str(value: Any) -> bool:
    return type(value) is str


def _join_lists(chunks: list[Any]) -> list[Any]:
    return [v for chunk in chunks for v in chunk]


_KINDS: dict[str, _Kind] = {
    "text": _Kind(
        field="text",
        accepts=_is_str,
        delta=TextDelta,
        done=TextDone,
        join="".join,
        later=lambda v: TextDelta(text=v),
    ),
    "thinking": _Kind(
        field="thinking",
        accepts=_is_str,
        delta=ThinkingDelta,
        done=ThinkingDone,
        join="".join,
        thinking=True,
        later=lambda v: ThinkingDelta(thinking=v),
    ),
    "tool_call": _Kind(
        field="arguments",
        accepts=lambda v: isinstance(v, str),
        delta=ToolCallDelta,
        done=ToolCallDone,
        join="".join,
        parsed=True,
        header=(("name", "name"), ("tool_call_id", "call_id")),
        header_first=True,
        later=lambda v: ToolCallDelta(name="", arguments=v, tool_call_id=""),
    ),
    "embedding": _Kind(
        field="embedding",
        accepts=lambda v: isinstance(v, list),
        delta=EmbeddingDelta,
        done=EmbeddingDone,
        join=_join_lists,
        fidelity=False,
        drops_empty=False,
    ),
    "inline_data": _Kind(
        field="data",
        accepts=lambda v: isinstance(v, bytes),
        delta=InlineDataDelta,
        done=InlineDataDone,
        join=b"".join,
        header=(("mime_type", "mime_type"),),
    ),
    "inline_thinking": _Kind(
        field="data",
        accepts=lambda v: isinstance(v, bytes),
        delta=InlineThinkingDelta,
        done=InlineThinkingDone,
        join=b"".join,
        header=(("mime_type", "mime_type"),),
        thinking=True,
    ),
}
"""Every lane kind's rules, by `LaneKind`: adding a kind is adding its entry here."""


class _Lane:
    """One open item: its header, its kind's rules, its fragments so far, and what is held
    while it waits."""

    __slots__ = (
        "call_id",
        "chunks",
        "closed",
        "fidelity",
        "held",
        "index",
        "kind",
        "later",
        "mime_type",
        "name",
        "pieces",
        "rule",
        "started",
    )

    def __init__(self, start: PartStart, rule: _Kind) -> None:
        self.kind: LaneKind = start.kind
        self.index = start.index
        self.name = start.name
        self.call_id = start.call_id
        self.mime_type = start.mime_type
        self.rule = rule  # resolved once here: no table lookup per fragment
        # the fast path's constructor, once a fragment may take it (a tool call's first carries
        # the header, so its lane gets it when that first fragment has gone out)
        self.later = None if rule.header_first else rule.later
        self.chunks: list[Any] = []
        self.pieces = 0  # chunks[:pieces] are runs of fragments already joined (`_keep`)
        self.held: list[PartDelta] = []
        self.fidelity: dict[str, Any] | None = None
        self.started = False  # a fragment of it went out
        self.closed = False

    def header(self, *, blank: bool = False) -> dict[str, Any]:
        """The header fields its items carry (`""` each with `blank`)."""
        return {f: "" if blank else getattr(self, a) for f, a in self.rule.header}


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

    @property
    def cache_write_tokens(self) -> int | None:
        """Of the prompt, the tokens written to the provider's cache, if the reply said (rillet's
        own count: MMSP's usage has no field for it; `TurnResult.cache_write_tokens`)."""
        return None if self._usage is None else self._usage.cache_write_tokens

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
                later = head.later  # None for a kind the fast path does not take (yet)
                if (
                    later is not None
                    and head.index == event.index
                    and head.kind == event.kind
                    and event.fidelity is None
                    and type(value) is str
                    and value
                ):
                    head.started = True
                    chunks = head.chunks
                    chunks.append(value)
                    if len(chunks) - head.pieces > _PIECE:
                        _join_tail(head)
                    if now < 0:
                        now = self._clock()
                    out.append(
                        UniEvent(event_type="delta", content_items=[later(value)], created_at=now)
                    )
                    continue
            elif type(event) is PartRun and queue:
                head = queue[0]
                values = event.values
                later = head.later
                if (
                    later is not None
                    and head.index == event.index
                    and head.kind == event.kind
                    and all(values)
                ):
                    if self.runs:
                        out.append(DeltaRun(head.kind, values))  # type: ignore[arg-type]
                        self.folded += len(values) - 1
                    else:
                        if now < 0:  # (a run needs no stamp: it is read here, for UniEvents)
                            now = self._clock()
                        out += [
                            UniEvent(event_type="delta", content_items=[later(v)], created_at=now)
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
        rule = _KINDS.get(event.kind)
        if rule is None:
            raise self._violation(f"a lane of no known kind: {event.kind!r}")
        if rule.header_first and not all(getattr(event, a) for _, a in rule.header):
            raise self._violation(
                f"tool call lane {event.index} must carry the name and the tool_call_id"
            )
        lane = _Lane(event, rule)
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
        rule = lane.rule
        if not rule.accepts(value):
            raise self._wrong_value(lane, value)
        # the header rides on every item, or (a tool call's) on the first only, which is never
        # dropped even when empty: it carries the call's name and id
        first_only = rule.header_first and lane.started
        if (
            not value
            and not fidelity
            and rule.drops_empty
            and (first_only or not rule.header_first)
        ):
            return None
        fields = lane.header(blank=first_only)
        fields[rule.field] = value
        if rule.fidelity:
            fields["fidelity"] = fidelity
        item = rule.delta(**fields)
        if not lane.started:
            lane.started = True
            lane.later = rule.later  # later fragments may take the fast path now
        lane.chunks.append(value)
        if len(lane.chunks) - lane.pieces > _PIECE and type(value) is str:
            _join_tail(lane)
        return UniEvent(event_type="delta", content_items=[item], created_at=self._clock())

    def _done(self, lane: _Lane) -> UniEvent | None:
        if not lane.started:
            return None
        rule = lane.rule
        fields = lane.header()
        joined = rule.join(lane.chunks)
        if rule.parsed:
            joined = parse_arguments(joined, self.provider, lane.name, lane.call_id)
        fields[rule.field] = joined
        if rule.fidelity:
            fields["fidelity"] = lane.fidelity
        if rule.thinking:
            self._thinking_seen = True
        else:
            self._content_seen = True
        return UniEvent(
            event_type="delta", content_items=[rule.done(**fields)], created_at=self._clock()
        )

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
        cache_write_tokens=(
            new.cache_write_tokens if new.cache_write_tokens is not None else old.cache_write_tokens
        ),
    )
