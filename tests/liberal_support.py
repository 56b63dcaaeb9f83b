"""Rewrites of a real recording that keep what it says: the changes providers make without
notice (new fields, new event and item types, keep-alives, other line ends, bytes after the
end), and the few changes that must not be read as the same answer (`test_real_corpus_liberal`).

Every rewrite works on the recording's frames (an SSE block's lines, an NDJSON line) and writes
them back with LF line ends, so a rewrite of one recording is byte-for-byte the same each run.
A recording's bytes are read with `surrogateescape`, so any byte it holds goes back as it came.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from typing import Any

__all__ = [
    "PROBE",
    "Frames",
    "add_unknown_fields",
    "cut_points",
    "is_terminal",
    "wrong_shape",
]

PROBE = "x_rillet_probe"
"""The name of the field added to every object: no provider sends it (results are compared with
it taken out of the fidelity, which echoes a provider's blocks as they came)."""
_VALUES = ('"a string"', "null", '[1,"two",null,{}]', '{"nested":{"deeper":[true,{"k":"v"}]}}')
_SKIP_KEYS = frozenset({'"input"', '"args"', '"arguments"'})
"""Where no field is added: a tool call's arguments are the model's data, not the wire's shape."""
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:]')
_CLOSES = re.compile(r"\s*\}")


def add_unknown_fields(text: str, turn: int = 0) -> str:
    """`text` (one JSON value) with `PROBE` added to every object in it, nested ones too, but
    not inside tool-call arguments. The value cycles through a string, null, a list and a nested
    object; the field goes first in even-numbered objects and last in odd ones. Nothing else of
    the text changes (numbers, escapes and spacing stay as sent)."""
    out: list[str] = []
    at = 0
    # per open container: is it an object, is it skipped, is the field to go last, is it empty
    stack: list[tuple[bool, bool, bool, bool]] = []
    last_string = ""
    key = ""
    count = turn
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first == '"':
            last_string = token
        elif first == ":":
            key = last_string
        elif first in "{[":
            parent = stack[-1] if stack else (False, False, False, False)
            skipped = parent[1] or (parent[0] and key in _SKIP_KEYS)
            if first == "[":
                stack.append((False, skipped, False, False))
                continue
            empty = _CLOSES.match(text, match.end()) is not None
            last = count % 2 == 1
            if not skipped and not last:
                field = f'"{PROBE}":{_VALUES[count % len(_VALUES)]}'
                out += (text[at : match.end()], field if empty else field + ",")
                at = match.end()
            if not skipped:
                count += 1
            stack.append((True, skipped, not skipped and last, empty))
        else:  # `}` or `]`
            _, _, goes_last, empty = stack.pop()
            if goes_last:
                field = f'"{PROBE}":{_VALUES[(count + len(stack)) % len(_VALUES)]}'
                out += (text[at : match.start()], field if empty else "," + field)
                at = match.start()
    out.append(text[at:])
    return "".join(out)


def strip_probe(value: Any) -> Any:
    """`value` (plain data) without any `PROBE` key, at any depth."""
    if isinstance(value, dict):
        return {k: strip_probe(v) for k, v in value.items() if k != PROBE}
    if isinstance(value, list):
        return [strip_probe(v) for v in value]
    return value


class Frames:
    """A recording as frames: SSE blocks (each a list of lines) or NDJSON lines (each a list of
    one line), with LF line ends, written back by `body`."""

    def __init__(self, body: bytes, framing: str) -> None:
        self.framing = framing
        text = body.decode("utf-8", "surrogateescape")
        if framing == "sse":
            text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
            self.frames = [b.split("\n") for b in re.split(r"\n{2,}", text.strip("\n"))]
        else:
            self.frames = [[line] for line in text.replace("\r\n", "\n").split("\n") if line]

    def body(self, line_end: str = "\n", frames: list[list[str]] | None = None) -> bytes:
        """The frames as bytes: lines ended by `line_end`, an SSE block by a blank line."""
        frames = self.frames if frames is None else frames
        sep = line_end * 2 if self.framing == "sse" else line_end
        text = sep.join(line_end.join(f) for f in frames) + sep
        return text.encode("utf-8", "surrogateescape")

    @staticmethod
    def data(frame: list[str]) -> str | None:
        """An SSE block's data (its `data:` lines joined), an NDJSON line itself."""
        values = [_value(line, "data") for line in frame if line.startswith("data:")]
        return "\n".join(values) if values else None

    def text(self, frame: list[str]) -> str | None:
        """A frame's JSON text (None for a frame that carries none)."""
        if self.framing != "sse":
            return frame[0]
        return self.data(frame)

    @staticmethod
    def name(frame: list[str]) -> str:
        """An SSE block's event name (`message` unless named)."""
        for line in frame:
            if line.startswith("event:"):
                return _value(line, "event") or "message"
        return "message"

    def with_text(self, frame: list[str], text: str) -> list[str]:
        """`frame` carrying `text` instead of its data."""
        if self.framing != "sse":
            return [text]
        kept = [line for line in frame if not line.startswith("data:")]
        at = next((i for i, line in enumerate(frame) if line.startswith("data:")), len(frame))
        return kept[:at] + ["data: " + line for line in text.split("\n")] + kept[at:]

    def json(self, frame: list[str]) -> Any:
        """A frame's JSON value, or None when it carries no JSON object."""
        text = self.text(frame)
        if not text or not text.lstrip().startswith("{"):
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None


def _value(line: str, field: str) -> str:
    value = line[len(field) + 1 :]
    return value[1:] if value.startswith(" ") else value


def is_terminal(frames: Frames, frame: list[str], dialect: str) -> bool:
    """Whether `frame` is the dialect's terminal marker (WIRE.md §9 i; Gemini has none but the
    end of the body)."""
    if dialect == "openai-chat":
        return frames.data(frame) == "[DONE]"
    value = frames.json(frame)
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    if dialect == "anthropic-messages":
        return kind == "message_stop"
    if dialect == "openai-responses":
        return kind in ("response.completed", "response.incomplete")
    if dialect == "ollama-chat":
        return value.get("done") is True
    return False


_WRONG_SHAPE: dict[str, tuple[tuple[str | None, tuple[str, ...]], ...]] = {
    # (the event's `type`, or None for any frame; the path of the known field given the wrong
    # shape); the first that some frame has is used
    "openai-chat": ((None, ("choices",)),),
    "gemini": ((None, ("candidates",)),),
    "ollama-chat": ((None, ("message",)),),
    "anthropic-messages": (("content_block_delta", ("delta",)), ("message_start", ("message",))),
    "openai-responses": (
        ("response.output_text.delta", ("delta",)),
        ("response.function_call_arguments.delta", ("delta",)),
        ("response.refusal.delta", ("delta",)),
        ("response.output_item.added", ("output_index",)),
        ("response.created", ("response",)),
    ),
}
_WRONG_INSIDE: dict[str, tuple[tuple[str | None, tuple[str, ...]], ...]] = {
    # the same, deeper in: a part of the frame read only once its type is (an Anthropic block, a
    # Responses item, kept undecoded till then), or a field of a nested object
    "openai-chat": ((None, ("choices", "0", "delta")),),
    "gemini": ((None, ("candidates", "0", "content")),),
    "ollama-chat": ((None, ("message", "content")),),
    "anthropic-messages": (("content_block_start", ("content_block", "type")),),
    "openai-responses": (("response.output_item.added", ("item", "type")),),
}


def _at(value: Any, path: tuple[str, ...]) -> tuple[Any, str | int] | None:
    """The container that holds `path`'s last step, and that step, if `value` has it (not
    null)."""
    for step in path[:-1]:
        if isinstance(value, list) and int(step) < len(value):
            value = value[int(step)]
        elif isinstance(value, dict) and step in value:
            value = value[step]
        else:
            return None
    last: str | int = int(path[-1]) if isinstance(value, list) else path[-1]
    if isinstance(value, dict) and value.get(last) is not None:
        return value, last
    return None


def wrong_shape(frames: Frames, dialect: str, inside: bool = False) -> bytes | None:
    """The recording with one known field of a known event, in the middle of the stream, given
    the wrong shape (`"choices": 5`; deeper in with `inside`); None when no frame has it."""
    for kind, path in (_WRONG_INSIDE if inside else _WRONG_SHAPE)[dialect]:
        hits = [
            i
            for i, frame in enumerate(frames.frames)
            if isinstance(value := frames.json(frame), dict)
            and (kind is None or value.get("type") == kind)
            and _at(value, path) is not None
        ]
        if hits:
            at = hits[len(hits) // 2]
            value = frames.json(frames.frames[at])
            found = _at(value, path)
            assert found is not None
            found[0][found[1]] = 5
            changed = list(frames.frames)
            changed[at] = frames.with_text(changed[at], json.dumps(value, ensure_ascii=False))
            return frames.body(frames=changed)
    return None


def cut_points(body: bytes, seed: int, reads: int, inside: int = 0) -> list[bytes]:
    """`body` cut into about `reads` pieces at pseudo-random points (`seed`), and at up to
    `inside` more points inside multi-byte UTF-8 characters or between a CR and its LF."""
    rng = random.Random(seed)
    n = len(body)
    points = set(rng.sample(range(1, n), min(n - 1, reads)))
    if inside:
        starts = [m.start() for m in _SPLITS.finditer(body)]
        for at in rng.sample(starts, min(len(starts), inside)):
            lead = body[at]  # a character's first byte (or a CR): cut after it, or further in
            size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            points.add(at + (1 if lead == 0x0D else rng.randrange(1, size)))
    cuts = [0, *sorted(p for p in points if 0 < p < n), n]
    return [body[a:b] for a, b in itertools.pairwise(cuts)]


_SPLITS = re.compile(rb"[\xc2-\xf4]|\r\n")
"""Where a character of two to four bytes starts, and a CRLF."""


# --- the rewrites a liberal reader must read as the recording ------------------------------------


def unknown_fields(frames: Frames, dialect: str) -> bytes:
    """Every JSON object of every frame with `PROBE` added (`add_unknown_fields`)."""
    changed = []
    for i, frame in enumerate(frames.frames):
        text = frames.text(frame)
        if text and text.lstrip().startswith("{"):
            frame = frames.with_text(frame, add_unknown_fields(text, i))
        changed.append(frame)
    return frames.body(frames=changed)


def _event(name: str, data: str) -> list[str]:
    return [f"event: {name}", f"data: {data}"]


def _end(frames: Frames, dialect: str) -> int:
    """The index of the terminal frame (the number of frames when there is none)."""
    return next(
        (i for i, f in enumerate(frames.frames) if is_terminal(frames, f, dialect)),
        len(frames.frames),
    )


def _insert(frames: Frames, where: dict[int, list[list[str]]], named: bool = True) -> bytes:
    """The frames with `where[i]` put before frame `i` (without `event:` lines if not `named`)."""
    changed: list[list[str]] = []
    for i, frame in enumerate([*frames.frames, []]):
        for extra in where.get(i, []):
            changed.append(extra if named else [x for x in extra if not x.startswith("event:")])
        if frame:
            changed.append(frame)
    return frames.body(frames=changed)


def _named(frames: Frames) -> bool:
    return any(frames.name(f) != "message" for f in frames.frames)


def unknown_events(frames: Frames, dialect: str) -> bytes:
    """New event types, each with an object of its own, after the first frame, in the middle,
    and just before the terminal event (unnamed, as `type` alone, where the recording names
    no event)."""
    if dialect == "anthropic-messages":
        events = [
            _event(
                "content_block_annotation",
                '{"type":"content_block_annotation","index":0,'
                '"annotation":{"type":"note","text":"not the answer"}}',
            ),
            _event("rillet_probe", '{"type":"rillet_probe","delta":{"text":"not the answer"}}'),
        ]
    else:
        events = [
            _event(
                "response.rillet_probe.delta",
                '{"type":"response.rillet_probe.delta","sequence_number":0,"item_id":"rp_0",'
                '"output_index":0,"content_index":0,"delta":"not the answer"}',
            ),
            _event("rillet.probe", '{"type":"rillet.probe","payload":{"a":[1,null]}}'),
        ]
    end = _end(frames, dialect)
    return _insert(frames, {at: events for at in {1, end // 2, end}}, _named(frames))


def _indexes(frames: Frames, field: str) -> list[int]:
    values = [frames.json(f) for f in frames.frames]
    return [v[field] for v in values if isinstance(v, dict) and isinstance(v.get(field), int)]


def _after_first(frames: Frames, kind: str, dialect: str) -> int:
    """Just after the first frame of `type` `kind`, else just before the terminal one."""
    for i, frame in enumerate(frames.frames):
        value = frames.json(frame)
        if isinstance(value, dict) and value.get("type") == kind:
            return i + 1
    return _end(frames, dialect)


def unknown_block(frames: Frames, dialect: str) -> bytes:
    """Anthropic: a block of a type added later, at a fresh index between blocks: its start
    (fields named like known ones, of other shapes), a delta of an unknown type, an input delta
    (as new server tools get), and its stop."""
    index = max(_indexes(frames, "index"), default=-1) + 1
    block = [
        _event(
            "content_block_start",
            f'{{"type":"content_block_start","index":{index},'
            '"content_block":{"type":"rillet_probe_block","id":"rp_1","input":5,"text":7}}',
        ),
        _event(
            "content_block_delta",
            f'{{"type":"content_block_delta","index":{index},'
            '"delta":{"type":"rillet_probe_delta","partial_json":5,"text":["x"]}}',
        ),
        _event(
            "content_block_delta",
            f'{{"type":"content_block_delta","index":{index},'
            '"delta":{"type":"input_json_delta","partial_json":"{\\"q\\": 1}"}}',
        ),
        _event("content_block_stop", f'{{"type":"content_block_stop","index":{index}}}'),
    ]
    return _insert(frames, {_after_first(frames, "content_block_stop", dialect): block})


def unknown_item(frames: Frames, dialect: str) -> bytes:
    """Responses: an output item of a type added later (fields named like known ones, of other
    shapes), added, given events of its own, and done, between items."""
    index = max(_indexes(frames, "output_index"), default=-1) + 1
    item = '{"type":"rillet_probe_call","id":"rp_1","status":"%s","arguments":{},"content":5}'
    events = [
        _event(
            "response.output_item.added",
            f'{{"type":"response.output_item.added","sequence_number":0,"output_index":{index},'
            f'"item":{item % "in_progress"}}}',
        ),
        _event(
            "response.rillet_probe_call.delta",
            '{"type":"response.rillet_probe_call.delta","sequence_number":0,'
            f'"output_index":{index},"item_id":"rp_1","delta":"not the answer"}}',
        ),
        _event(
            "response.output_item.done",
            f'{{"type":"response.output_item.done","sequence_number":0,"output_index":{index},'
            f'"item":{item % "completed"}}}',
        ),
    ]
    where = _after_first(frames, "response.output_item.done", dialect)
    return _insert(frames, {where: events}, _named(frames))


def _tight(line: str) -> str:
    """A `data:` or `event:` line without the optional space (where that keeps its value)."""
    for field in ("data: ", "event: "):
        if line.startswith(field) and not line[len(field) :].startswith(" "):
            return field[:-1] + line[len(field) :]
    return line


def sse_fields(frames: Frames, dialect: str) -> bytes:
    """Comments (alone and inside events), `id:` and `retry:` lines (in events, and as blocks
    that dispatch nothing), `data:`/`event:` without the space, and blank lines doubled."""
    parts = [": OPENROUTER PROCESSING\n\n"]
    for i, frame in enumerate(frames.frames):
        lines = [_tight(line) for line in frame] if i % 2 else list(frame)
        if i % 3 == 0:
            lines.insert(len(lines) - 1, ": keep-alive")
        if i % 2 == 0:
            lines.insert(0, f"id: evt-{i}")
        if i % 5 == 0:
            lines.insert(0, "retry: 3000")
        parts.append("\n".join(lines) + ("\n\n\n" if i % 2 else "\n\n"))
        if i % 4 == 1:
            parts.append(": keep-alive\n\n\n\n")
        if i % 7 == 3:
            parts.append("id: 99\n\nretry: 1000\n\n")
    return "".join(parts).encode("utf-8", "surrogateescape")


def blank_lines(frames: Frames, dialect: str) -> bytes:
    """NDJSON: an empty line after every line."""
    return frames.body("\n\n")


_AFTER: dict[str, list[list[str]]] = {
    "openai-chat": [
        ["data: [DONE]"],
        ['data: {"choices": 5}'],
        ['data: {"choices":[{"index":0,"delta":{"content":"not the answer"}}]}'],
        ["not an SSE line {"],
    ],
    "anthropic-messages": [
        _event(
            "content_block_delta",
            '{"type":"content_block_delta","index":0,'
            '"delta":{"type":"text_delta","text":"not the answer"}}',
        ),
        _event("message_delta", '{"type":"message_delta","delta":5}'),
        _event("error", '{"type":"error","error":{"type":"overloaded_error","message":"late"}}'),
    ],
    "openai-responses": [
        ["data: [DONE]"],
        _event(
            "response.output_text.delta",
            '{"type":"response.output_text.delta","sequence_number":0,"item_id":"x",'
            '"output_index":0,"content_index":0,"delta":"not the answer"}',
        ),
        _event("response.completed", '{"type":"response.completed","response":5}'),
        _event("error", '{"type":"error","code":"server_error","message":"late"}'),
    ],
    "ollama-chat": [
        ['{"message":{"role":"assistant","content":"not the answer"},"done":false}'],
        ['{"message": 5}'],
        ['{"message":{"content":"\udcff"},"done":false}'],  # a byte that is not UTF-8
        ["not a JSON line {"],
    ],
}
_AFTER_TAIL = {"sse": b'data: {"cut', "ndjson": b'{"message":{"content":"\xff'}


def _after(frames: Frames, dialect: str) -> list[list[str]] | None:
    """The frames to put after the terminal one (None when there is none)."""
    end = _end(frames, dialect)
    if end == len(frames.frames):
        return None
    return [frames.frames[end], *_AFTER[dialect]]


def after_terminal(frames: Frames, dialect: str) -> bytes | None:
    """The terminal frame again, then frames that are junk or would change the answer, then an
    unfinished frame: nothing after the terminal marker is read (WIRE.md §9, F52)."""
    after = _after(frames, dialect)
    if after is None:
        return None
    return frames.body(frames=frames.frames + after) + _AFTER_TAIL[frames.framing]


def mixed_line_ends(body: bytes, seed: int) -> bytes:
    """`body` with each line end LF, CRLF or CR at random (`seed`), as the event-stream standard
    allows, but never an empty line ended by LF right after a CR (the two would be one CRLF)."""
    rng = random.Random(seed)
    lines = body.replace(b"\r\n", b"\n").split(b"\n")
    out: list[bytes] = []
    end = b""
    for line in lines[:-1]:
        ends = (b"\r\n", b"\r") if end == b"\r" and not line else (b"\n", b"\r\n", b"\r")
        end = rng.choice(ends)
        out += (line, end)
    out.append(lines[-1])
    return b"".join(out)


_UNKNOWN = {
    "anthropic-messages": (unknown_events, unknown_block),
    "openai-responses": (unknown_events, unknown_item),
}


def combined(frames: Frames, dialect: str, seed: int) -> bytes:
    """Every rewrite that applies at once: unknown fields, events, blocks and items; junk after
    the terminal marker; SSE comments, ids and retry lines (NDJSON: empty lines); mixed line
    ends and a BOM (NDJSON: CRLF)."""
    framing = frames.framing
    body = unknown_fields(frames, dialect)
    for rewrite in _UNKNOWN.get(dialect, ()):
        body = rewrite(Frames(body, framing), dialect)
    frames = Frames(body, framing)
    after = _after(frames, dialect) if dialect != "gemini" else None
    if after is not None:
        frames.frames += after
    body = frames.body("\n\n") if framing == "ndjson" else sse_fields(frames, dialect)
    if after is not None:
        body += _AFTER_TAIL[framing]
    if framing == "ndjson":
        return body.replace(b"\n", b"\r\n")
    return b"\xef\xbb\xbf" + mixed_line_ends(body, seed)


# --- the rewrites that must fail -----------------------------------------------------------------


def cut_before_terminal(frames: Frames, dialect: str) -> bytes | None:
    """The recording cut just before its terminal marker. Where the end of the body is an end
    too once the finish reason came (Gemini; Chat Completions with usage as well, as Cerebras
    sends it), before the first chunk that carries a finish reason."""
    finishes = _FINISH.get(dialect)
    end: int | None = _end(frames, dialect)
    if finishes is not None:
        lists, field = finishes
        end = next(
            (
                i
                for i, f in enumerate(frames.frames)
                if isinstance(v := frames.json(f), dict)
                and isinstance(items := v.get(lists), list)
                and any(isinstance(c, dict) and c.get(field) for c in items)
            ),
            end if dialect != "gemini" else None,
        )
    if end is None or end == len(frames.frames):
        return None
    return frames.body(frames=frames.frames[:end])


_FINISH = {"gemini": ("candidates", "finishReason"), "openai-chat": ("choices", "finish_reason")}
"""Where a dialect's chunks carry the finish reason: the list, and the field in its items."""


def bad_utf8_line(frames: Frames, dialect: str) -> bytes | None:
    """NDJSON: a byte that is not UTF-8 inside a string of a line in the middle."""
    if frames.framing != "ndjson":
        return None
    changed = list(frames.frames)
    at = len(changed) // 2
    line = changed[at][0]
    quote = line.find('":"')
    if quote < 0:
        return None
    changed[at] = [line[: quote + 3] + "\udcff" + line[quote + 3 :]]
    return frames.body(frames=changed)
