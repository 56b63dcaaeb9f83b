"""Every real recording that completes, changed the ways providers change their streams without
notice, still reads to the same result; and the changes the rules refuse are refused (WIRE.md
§9 "Robustness rules", RELIABILITY.md rules 1, 4, 6, F52-F54, D7).

Each streamed recording under `tests/fixtures/real/` whose `EXPECTED.json` entry completes is
replayed as sent (the baseline), then rewritten (`liberal_support`) and replayed through a whole
`run_turn` on the trio mock clock, as `test_real_corpus` does. A liberal reader must give every
rewrite the baseline's result: the outcome, the answer text, the thinking, the tool calls and
their arguments (every `.done` item, with the fidelity compared without the added field), the
finish reason, the usage, and one request. The same bytes also go through a `WireDecoder` alone,
fed and then closed as its callers do, which must give the baseline's events exactly. Rewrites:

- `unknown-fields`: a field no provider sends added to every JSON object of every frame, nested
  ones too (a string, null, a list or a nested object), but not inside tool-call arguments: those
  are the model's data, and a field there is a different call.
- `unknown-events` (Anthropic, Responses): new event types with objects of their own;
  `unknown-block` (Anthropic): a block of a new type at a fresh index between blocks, with an
  unknown delta and an input delta; `unknown-item` (Responses): an output item of a new type,
  added, given events of its own, and done. (Chat Completions and Gemini name no events.)
- `sse-fields` (SSE): comments, `id:` and `retry:` lines in events and alone, `data:` and
  `event:` without the space, blank lines doubled; `blank-lines` (NDJSON): empty lines between.
- `after-terminal`: the terminal marker again, then junk (frames of the wrong shape, frames that
  would change the answer, a line that is not JSON or not UTF-8, an unfinished frame). Not for
  Gemini: its only terminal marker is the end of the body.
- `crlf`: CRLF line ends throughout; `cr` (SSE): lone CR line ends; `mixed-ends` (SSE): LF, CRLF
  and CR mixed; `bom` (SSE): a UTF-8 BOM first (also split across reads).
- `cuts`: the recording as sent, in reads cut at seeded pseudo-random points, many inside
  multi-byte UTF-8 characters and between CR and LF.
- `combined`: all of those that apply at once.

Every rewrite is fed in seeded cuts and in one read (`cuts` in fine cuts only).

And what must fail, with the rescue off so the requests count streamed attempts:
`wrong-shape` (a known field of a known event given the wrong shape, `"choices": 5`) and
`wrong-shape-inside` (the same deeper in: a block's or item's `type`, a choice's `delta`): a
`MalformedFrameError` with a bounded text preview, one request (with the rescue on, at most the
rescue besides); `bad-utf8` (NDJSON): a `FrameEncodingError`, retried as corruption on the way
(F24); `cut-before-terminal`: an `IncompleteStreamError`, retried (rule 1).

One test per recording runs every rewrite of it and names each that fails (a test per rewrite
cost more in pytest than the rewrites themselves); a recording `test_real_corpus` lists as a
known defect is a strict xfail here too.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
from rillet import (
    FrameEncodingError,
    IncompleteStreamError,
    MalformedFrameError,
    Outcome,
    Policy,
    RilletError,
    TurnRequest,
    TurnResult,
    run_turn,
    user,
)
from rillet.lowlevel import WireDecoder
from rillet.providers import Provider, dialect_from_name
from rillet.transports.replay import content_type_for

from .. import liberal_support as lib
from .test_real_corpus import DIALECTS, EXPECTED, REAL, cases

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import trio.testing

_BOM = b"\xef\xbb\xbf"


def _streamed() -> list[str]:
    """The completing streamed recordings on disk (listed, so new ones join by themselves)."""
    return sorted(
        rel
        for d in DIALECTS
        if (REAL / d).is_dir()
        for p in (REAL / d).iterdir()
        if p.suffix in (".sse", ".ndjson")
        and EXPECTED.get(rel := f"{d}/{p.name}", {}).get("expect") == "completed"
    )


def _frames_of(fn: Callable[[lib.Frames, str], bytes | None]) -> Any:
    return lambda raw, frames, dialect: fn(frames, dialect)


def _lf(raw: bytes) -> bytes:
    return raw.replace(b"\r\n", b"\n")


VARIANTS: dict[
    str, tuple[Callable[[bytes, lib.Frames, str], bytes | None], Callable[[str, str], bool]]
] = {
    "unknown-fields": (_frames_of(lib.unknown_fields), lambda d, f: True),
    "unknown-events": (
        _frames_of(lib.unknown_events),
        lambda d, f: d in ("anthropic-messages", "openai-responses"),
    ),
    "unknown-block": (_frames_of(lib.unknown_block), lambda d, f: d == "anthropic-messages"),
    "unknown-item": (_frames_of(lib.unknown_item), lambda d, f: d == "openai-responses"),
    "sse-fields": (_frames_of(lib.sse_fields), lambda d, f: f == "sse"),
    "blank-lines": (_frames_of(lib.blank_lines), lambda d, f: f == "ndjson"),
    "after-terminal": (_frames_of(lib.after_terminal), lambda d, f: d != "gemini"),
    "crlf": (lambda raw, fr, d: _lf(raw).replace(b"\n", b"\r\n"), lambda d, f: True),
    "cr": (lambda raw, fr, d: _lf(raw).replace(b"\n", b"\r"), lambda d, f: f == "sse"),
    "bom": (lambda raw, fr, d: _BOM + raw, lambda d, f: f == "sse"),
    "mixed-ends": (
        lambda raw, fr, d: lib.mixed_line_ends(raw, zlib.crc32(raw)),
        lambda d, f: f == "sse",
    ),
    "cuts": (lambda raw, fr, d: raw, lambda d, f: True),
    "combined": (lambda raw, fr, d: lib.combined(fr, d, zlib.crc32(raw)), lambda d, f: True),
}
"""Each rewrite, and where it applies (dialect, framing)."""

NEGATIVES: dict[
    str, tuple[Callable[[bytes, lib.Frames, str], bytes | None], type[Exception], int]
] = {
    "wrong-shape": (_frames_of(lib.wrong_shape), MalformedFrameError, 1),
    "wrong-shape-inside": (
        lambda raw, frames, dialect: lib.wrong_shape(frames, dialect, inside=True),
        MalformedFrameError,
        1,
    ),
    "bad-utf8": (_frames_of(lib.bad_utf8_line), FrameEncodingError, 4),
    "cut-before-terminal": (_frames_of(lib.cut_before_terminal), IncompleteStreamError, 4),
}
"""Each rewrite that must fail: the error, and how many requests the rules allow (rescue off:
one, or one and the 3 transport retries)."""


def _framing(rel: str) -> str:
    return "ndjson" if rel.endswith(".ndjson") else "sse"


def _applicable(rel: str) -> list[str]:
    """The rewrites that apply to a recording, by its dialect and framing."""
    dialect = rel.split("/")[0]
    return [name for name, (_, applies) in VARIANTS.items() if applies(dialect, _framing(rel))]


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


class _Body(httpx.AsyncBaseTransport):
    """Answers every request with the same body, in the same reads."""

    def __init__(self, pieces: list[bytes], content_type: str) -> None:
        self.pieces = pieces
        self.content_type = content_type
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return httpx.Response(
            200,
            headers={"content-type": self.content_type},
            stream=_Pieces(self.pieces),
            request=request,
        )


async def _run(rel: str, pieces: list[bytes], policy: Policy) -> tuple[TurnResult, int]:
    transport = _Body(pieces, content_type_for(Path(rel)))
    provider = Provider(dialect_from_name(rel.split("/")[0]), "http://replay.invalid", "replay")
    async with httpx.AsyncClient(transport=transport) as client:
        result = await run_turn(
            TurnRequest(messages=[user("replay")]), provider, client=client, policy=policy
        )
    return result, transport.requests


def _what(result: TurnResult, requests: int) -> dict[str, Any]:
    """What two reads of one recording must agree on."""
    message = result.message
    return {
        "outcome": result.outcome.name,
        "error": type(result.error).__name__ if result.error is not None else None,
        "requests": requests,
        "text": result.text,
        "finish_reason": message.finish_reason,
        "usage": msgspec.to_builtins(message.usage_metadata),
        "items": _plain(message.content_items),
    }


def _decode(rel: str, pieces: list[bytes]) -> Any:
    """The recording through a `WireDecoder` alone, every piece fed, then closed: its events
    (or the error it raised), as a caller of the sans-I/O decoder sees them."""
    decoder = WireDecoder(dialect_from_name(rel.split("/")[0]), clock=lambda: 0)
    events: list[Any] = []
    try:
        for piece in pieces:
            decoder.feed(piece, events)
        decoder.close(events)
    except RilletError as exc:
        return type(exc).__name__
    return _plain(events)


def _plain(value: Any) -> bytes:
    """`value` as JSON, without the field the rewrites add (which the fidelity may echo)."""
    encoded = msgspec.json.encode(value)
    if lib.PROBE.encode() not in encoded:
        return encoded
    return msgspec.json.encode(lib.strip_probe(msgspec.to_builtins(value)))


_BASELINES: dict[str, dict[str, Any]] = {}
_DECODED: dict[str, Any] = {}


async def _baseline(rel: str) -> dict[str, Any]:
    """The recording as sent, in 256-byte reads: what every rewrite must read to."""
    if rel not in _BASELINES:
        raw = (REAL / rel).read_bytes()
        result, requests = await _run(rel, lib.cut_points(raw, 0, len(raw) // 256), Policy())
        what = _what(result, requests)
        expected = EXPECTED[rel]
        assert what["outcome"] == "COMPLETED", f"{rel}: {what['outcome']} {result.error!r}"
        assert (what["text"], what["finish_reason"], requests) == (
            expected["text"],
            expected["finish_reason"],
            expected["requests"],
        ), rel
        _BASELINES[rel] = what
        _DECODED[rel] = _decode(rel, [raw])
    return _BASELINES[rel]


def _feeds(rel: str, variant: str, body: bytes) -> list[tuple[str, list[bytes]]]:
    """How a rewrite is fed: seeded cuts (fine ones for `cuts` and `combined`), and one read
    (the decoders' paths for a whole read differ from those for pieces)."""
    seed = zlib.crc32(f"{rel}|{variant}".encode())
    if variant == "cuts":
        return [("fine cuts", lib.cut_points(body, seed, min(len(body) // 4, 800), 200))]
    if variant == "combined":
        return [
            ("fine cuts", lib.cut_points(body, seed, min(len(body) // 4, 800), 200)),
            ("one read", [body]),
        ]
    feeds = [
        ("cuts", lib.cut_points(body, seed, min(len(body) // 32, 150), 40)),
        ("one read", [body]),
    ]
    if variant == "bom":
        feeds.append(("BOM split", [body[:1], body[1:2], body[2:]]))
    return feeds


def _differences(want: dict[str, Any], got: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {got[k]!r} (want {want[k]!r})"[:600] for k in want if got[k] != want[k])


async def _rewrite_failures(rel: str, variant: str, want: dict[str, Any]) -> list[str]:
    """How one rewrite of a recording fails to read as the recording (nothing if it does)."""
    raw = (REAL / rel).read_bytes()
    body = VARIANTS[variant][0](raw, lib.Frames(raw, _framing(rel)), rel.split("/")[0])
    if body is None:
        return []  # nothing to rewrite so (no terminal marker to put things after)
    failures = []
    for how, pieces in _feeds(rel, variant, body):
        result, requests = await _run(rel, pieces, Policy())
        got = _what(result, requests)
        if got != want:
            failures.append(f"{variant} ({how}): {_differences(want, got)}")
        if how == "cuts":
            continue  # the turn read these pieces with a `WireDecoder` already
        decoded = _decode(rel, pieces)
        if decoded != _DECODED[rel]:
            failures.append(f"{variant} ({how}), decoded alone: {decoded[:300]!r}")
    return failures


@pytest.mark.parametrize("rel", cases(_streamed()))  # a known defect: a strict xfail here too
async def test_every_rewrite_reads_as_the_recording(
    rel: str, autojump_clock: trio.testing.MockClock
) -> None:
    want = await _baseline(rel)
    failures = [
        f for variant in _applicable(rel) for f in await _rewrite_failures(rel, variant, want)
    ]
    assert not failures, f"{rel}:\n" + "\n".join(failures)


async def _refusal_failures(rel: str, variant: str) -> list[str]:
    """How one rewrite the rules refuse is not refused as they say (nothing if it is)."""
    raw = (REAL / rel).read_bytes()
    rewrite, error, requests = NEGATIVES[variant]
    body = rewrite(raw, lib.Frames(raw, _framing(rel)), rel.split("/")[0])
    if body is None:
        return []  # nothing to rewrite so (no such field, no terminal marker to cut before)
    seed = zlib.crc32(f"{rel}|{variant}".encode())
    pieces = lib.cut_points(body, seed, min(len(body) // 512, 40), 8)
    result, sent = await _run(rel, pieces, Policy(rescue=False))
    failed = result.outcome in (Outcome.FAILED, Outcome.INIT_FAILED)
    if not (isinstance(result.error, error) and failed and sent == requests):
        return [f"{variant}: {result.outcome.name}, {result.error!r}, {sent} requests"]
    decoded = _decode(rel, pieces)
    if decoded != error.__name__:
        return [f"{variant}, decoded alone: {decoded[:300]!r}"]
    if isinstance(result.error, MalformedFrameError):
        preview = result.error.frame_preview
        if result.error.not_json or not isinstance(preview, str) or len(preview) > 200:
            # valid JSON of the wrong shape is permanent, and its preview is bounded text
            return [f"{variant}: not_json {result.error.not_json}, preview {preview!r}"]
        _, sent = await _run(rel, pieces, Policy())  # the rescue, if anything; never a retry
        if sent > 2:
            return [f"{variant}: {sent} requests with the rescue on"]
    return []


@pytest.mark.parametrize("rel", [pytest.param(rel, id=rel) for rel in _streamed()])
async def test_every_rewrite_the_rules_refuse_fails_as_they_say(
    rel: str, autojump_clock: trio.testing.MockClock
) -> None:
    names = [n for n in NEGATIVES if n != "bad-utf8" or _framing(rel) == "ndjson"]
    failures = [f for name in names for f in await _refusal_failures(rel, name)]
    assert not failures, f"{rel}:\n" + "\n".join(failures)


def test_the_rewrites_cover_every_completing_recording() -> None:
    rels = _streamed()
    assert len(rels) >= 100  # the corpus is listed, not missed
    for rel in rels:
        names = _applicable(rel)
        assert {"unknown-fields", "cuts"} <= set(names), rel
        assert {"sse-fields", "after-terminal"} & set(names), rel
