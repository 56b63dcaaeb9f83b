"""Fuzzing, bounded: what no input may do to the decoders, the grammar and the server.

- The SSE and NDJSON decoders take any bytes cut anywhere: they raise only frame errors, and the
  bytes they hold never grow past their cap plus the chunk in hand.
- Every dialect's frame decoder, through `WireDecoder` (framing, dialect, grammar), takes random
  bytes and mutated recorded fixtures (tests/fixtures/providers/): only rillet's typed errors.
- The grammar takes random lane event sequences: only `StreamProtocolError`,
  `IncompleteStreamError`, `EmptyResponseError`, `ToolCallArgumentParseError` or a
  `ProviderError`; when it does not raise, what it released obeys the MMSP grammar.
- The server takes random request heads and bodies on loopback: never a 500, never a hang, and
  it still answers afterwards.

Examples are derandomized (the same ones every run) and capped so the module stays well under
30 s.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import TYPE_CHECKING

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rillet import (
    EmptyResponseError,
    FrameError,
    IncompleteStreamError,
    ProviderError,
    RilletError,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
)
from rillet._core._dialect import Provider, Secret
from rillet._core._events import TextDone, ToolCallDone, UniEvent
from rillet._core._grammar import Grammar
from rillet._core._lanes import (
    LaneEvent,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    Ping,
    ProviderErrorEvent,
    RawUsage,
)
from rillet.frames import NDJSONDecoder, SSEDecoder
from rillet.lowlevel import WireDecoder
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import open_loopback_provider

from ..fault_support import text_reply
from ..providers.test_fixtures import DIALECTS, dialect_for
from ..wire_cases import FIXTURES, cut_at

if TYPE_CHECKING:
    from collections.abc import Iterator

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the frame decoders ---------------------------------------------------------------------------

SSE_PIECES = st.sampled_from(
    [
        b"data: ",
        b"data:",
        b"event: x\n",
        b"id: 7\n",
        b"retry: 10\n",
        b": ping\n",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b'{"a": 1}',
        b"x" * 50,
        b"\xff",
        b"\xf0\x9f",
        b"\x00",
        b"\xef\xbb\xbf",
    ]
)
NDJSON_PIECES = st.sampled_from(
    [b'{"a": 1}', b"[1,", b"2]", b"\n", b"\r\n", b"\r", b" ", b'"', b"x" * 50, b"\xff", b"\xc3"]
)


def streams(pieces: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(pieces, max_size=60).map(b"".join) | st.binary(max_size=600)


@settings(FUZZ, max_examples=250)
@given(stream=streams(SSE_PIECES), cap=st.integers(1, 128), points=st.lists(st.integers(0, 700)))
def test_the_sse_decoder_raises_only_frame_errors_and_holds_at_most_a_frame(
    stream: bytes, cap: int, points: list[int]
) -> None:
    decoder = SSEDecoder(max_frame=cap)
    with contextlib.suppress(FrameError):
        for chunk in cut_at(stream, points):
            for event in decoder.feed(chunk):
                assert isinstance(event.data, str)
                assert len(event.data.encode("utf-8", "surrogatepass")) <= 3 * cap
            assert decoder._held_size <= cap + len(chunk)
        decoder.close()
        assert decoder._held_size == 0


@settings(FUZZ, max_examples=250)
@given(stream=streams(NDJSON_PIECES), cap=st.integers(1, 128), points=st.lists(st.integers(0, 700)))
def test_the_ndjson_decoder_raises_only_frame_errors_and_holds_at_most_a_line(
    stream: bytes, cap: int, points: list[int]
) -> None:
    decoder = NDJSONDecoder(max_frame=cap)
    with contextlib.suppress(FrameError):
        for chunk in cut_at(stream, points):
            for line in decoder.feed(chunk):
                assert line.strip()
                assert len(line.encode()) <= cap
            assert len(decoder._tail) + decoder._held_size <= cap + len(chunk)
        decoder.close()


# --- every dialect through WireDecoder ------------------------------------------------------------

WIRE_FILES = sorted(
    (folder, path.name)
    for folder in DIALECTS
    for path in (FIXTURES / folder).iterdir()
    if path.suffix in (".sse", ".ndjson", ".json") and not path.name.endswith(".expected.json")
)
JUNK = st.sampled_from(
    [
        b'"',
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"null",
        b"-1",
        b"1e309",
        b"9" * 30,
        b"true",
        b'"x"',
        b"\n",
        b"\n\n",
        b"data: ",
        b"event: error\n",
        b"\\ud800",
        b"NaN",
        b"\xff",
        b"[" * 2000,
    ]
)


@st.composite
def mutated(draw: st.DrawFn, folder: str) -> bytes:
    """A fixture of this dialect with a few bytes changed, removed, inserted or repeated."""
    names = [name for f, name in WIRE_FILES if f == folder]
    data = bytearray((FIXTURES / folder / draw(st.sampled_from(names))).read_bytes())
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.integers(0, 3))
        if kind == 0 and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == 1:
            del data[at : at + draw(st.integers(1, 40))]
        elif kind == 2:
            data[at:at] = draw(JUNK)
        else:
            start = draw(st.integers(0, len(data)))
            data[at:at] = data[start : start + draw(st.integers(1, 200))]
    return bytes(data)


def decode(folder: str, data: bytes, points: list[int]) -> None:
    """Through framing, dialect and grammar: only rillet's typed errors may come out."""
    dialect = dialect_for(folder)
    decoder = WireDecoder(dialect, clock=lambda: 0, stream=dialect.framing != "json")
    out: list[UniEvent] = []
    with contextlib.suppress(RilletError):
        for chunk in cut_at(data, points):
            decoder.feed(chunk, out)
        decoder.close(out)


@pytest.mark.parametrize("folder", sorted(DIALECTS))
@settings(FUZZ, max_examples=120)
@given(data=st.data(), points=st.lists(st.integers(0, 20_000), max_size=8))
def test_every_dialect_takes_mutated_fixtures_with_typed_errors_only(
    folder: str, data: st.DataObject, points: list[int]
) -> None:
    decode(folder, data.draw(mutated(folder)), points)


@pytest.mark.parametrize("folder", sorted(DIALECTS))
@settings(FUZZ, max_examples=60)
@given(
    prefix=st.sampled_from([b"", b"data: ", b"data: {", b'{"', b'data: {"choices": [']),
    body=st.binary(max_size=400),
    points=st.lists(st.integers(0, 400), max_size=6),
)
def test_every_dialect_takes_random_bytes_with_typed_errors_only(
    folder: str, prefix: bytes, body: bytes, points: list[int]
) -> None:
    decode(folder, prefix + body, points)


# --- the grammar ----------------------------------------------------------------------------------

ALLOWED = (
    StreamProtocolError,
    IncompleteStreamError,
    EmptyResponseError,
    ToolCallArgumentParseError,
    ProviderError,
)
KINDS = st.sampled_from(["text", "thinking", "tool_call", "inline_data", "embedding"])
INDEX = st.integers(0, 2)
VALUES = st.one_of(
    st.text(max_size=5),
    st.sampled_from(['{"a":', "1}", "{}", "[1]", "null", '"x"']),
    st.binary(max_size=4),
    st.lists(st.floats(allow_nan=False, width=32), max_size=3),
    st.none(),
    st.integers(),
)
FIDELITY = st.none() | st.sampled_from([{"signature": "s1"}, {"signature": "s2"}, {}])
USAGE = st.builds(
    RawUsage,
    cached_tokens=st.none() | st.integers(0, 9),
    prompt_tokens=st.none() | st.integers(0, 9),
    thoughts_tokens=st.none() | st.integers(0, 9),
    response_tokens=st.none() | st.integers(0, 9),
)
LANE_EVENTS: st.SearchStrategy[LaneEvent] = st.one_of(
    st.builds(MessageStart, id=st.sampled_from(["", "m1"]), model=st.sampled_from(["", "x"])),
    st.builds(
        PartStart,
        index=INDEX,
        kind=KINDS,
        name=st.sampled_from(["", "get_weather"]),
        call_id=st.sampled_from(["", "call_1"]),
        mime_type=st.sampled_from(["", "image/png"]),
    ),
    st.builds(PartDelta, index=INDEX, kind=KINDS, value=VALUES, fidelity=FIDELITY),
    st.builds(PartStop, index=st.none() | INDEX, kind=st.none() | KINDS),
    st.builds(
        MessageDelta,
        finish_reason=st.none() | st.sampled_from(["stop", "length", "tool_calls", "weird"]),
        usage=st.none() | USAGE,
    ),
    st.just(MessageStop()),
    st.just(Ping()),
    st.just(ProviderErrorEvent(ServerError("fuzz", "boom", in_stream=True))),
)
# sequences that mostly make sense, so the fuzzing reaches past the first refusal
WELL_FORMED_START: list[LaneEvent] = [
    MessageStart("m1", "x"),
    PartStart(index=0, kind="text"),
    PartDelta(0, "text", "Hi"),
]


@settings(FUZZ, max_examples=300)
@given(
    events=st.lists(LANE_EVENTS, max_size=25),
    lead=st.booleans(),
    close=st.booleans(),
    many=st.booleans(),
)
def test_the_grammar_raises_only_its_own_errors(
    events: list[LaneEvent], lead: bool, close: bool, many: bool
) -> None:
    grammar = Grammar("fuzz", clock=lambda: 0)
    sequence = [*WELL_FORMED_START, *events] if lead else events
    out: list[UniEvent] = []
    try:
        if many:
            grammar.feed_many(sequence, out)
        else:
            for event in sequence:
                grammar.feed(event, out)
        if close:
            out += grammar.close()
    except ALLOWED:
        return
    check_released(out)


def check_released(out: list[UniEvent]) -> None:
    """What a grammar released obeys MMSP: one item per delta event, groups that never
    interleave (a `.done` joins its own fragments), at most one stop, last."""
    stops = [i for i, e in enumerate(out) if e.event_type == "stop"]
    assert stops in ([], [len(out) - 1])
    texts: list[str] = []
    for event in out:
        if event.event_type == "stop":
            continue
        assert len(event.content_items) == 1
        item = event.content_items[0]
        name = type(item).__name__
        if name == "TextDelta":
            texts.append(item.text)  # type: ignore[union-attr]
        elif isinstance(item, TextDone):
            assert item.text == "".join(texts)
            texts = []
        elif isinstance(item, ToolCallDone):
            assert isinstance(item.arguments, dict)


# --- the server's request parsing -----------------------------------------------------------------


class _Background:
    """The server (and the loopback provider behind it) in a trio loop of its own thread, so
    plain sockets can talk to it from a Hypothesis test."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> _Background:
        self._thread.start()
        assert self._ready.wait(10), "the server did not start"
        return self

    def __exit__(self, *_: object) -> None:
        if self._token is not None and self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)

    async def _main(self) -> None:
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                self._token = trio.lowlevel.current_trio_token()
                script = [text_reply(["fuzz ", "reply"])]
                async with open_loopback_provider(script) as loopback:
                    provider = Provider(
                        dialect=OpenAIChatDialect(),
                        base_url=f"{loopback.url}/v1",
                        model="test-model",
                        api_key=Secret("sk-fuzz-0123456789"),
                    )
                    config = ServerConfig(
                        provider=provider,
                        port=0,
                        limits=Limits(head_timeout=5.0),
                    )
                    async with trio.open_nursery() as nursery:
                        self.url = await nursery.start(serve, config)
                        self._ready.set()
                        await trio.sleep_forever()
        except BaseException as exc:  # reported by the tests that use it
            self.error = exc
            self._ready.set()


@pytest.fixture(scope="module")
def server() -> Iterator[_Background]:
    with _Background() as background:
        assert background.error is None, background.error
        yield background


def exchange(url: str, data: bytes) -> bytes:
    """Send `data`, end the request side, read until the server closes (10 s at most)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with contextlib.suppress(OSError):  # the server may refuse before reading it all
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    return bytes(received)


def check_answer(raw: bytes) -> None:
    """Every response on the connection is well-formed HTTP/1.1 and none is a server error
    (a 501 for a transfer coding it does not implement is the protocol's own answer)."""
    rest = raw
    while rest:
        assert rest.startswith(b"HTTP/1.1 "), rest[:80]
        status = int(rest[9:12])
        # 501 is HTTP's answer to a transfer coding the server does not implement (h11's hint)
        assert status < 500 or status == 501, raw[:300]
        head, _, rest = rest.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            None,
        )
        if length is None:
            break  # a streamed answer: the rest is its body
        rest = rest[length:]


METHODS = st.sampled_from(["GET", "POST", "DELETE", "HEAD", "PUT", "OPTIONS", "G\x00T", "get"])
TARGETS = st.one_of(
    st.sampled_from(
        [
            "/",
            "/healthz",
            "/metrics",
            "/v1/models",
            "/v1/runs",
            "/v1/stream",
            "/v1/runs/abc/events",
            "/v1/runs/abc/ws",
            "/v1/runs/" + "a" * 24 + "/events?after=-1&token=x",
            "/%00/../..",
            "*",
            "http://evil.example/v1/runs",
        ]
    ),
    st.text(alphabet=st.characters(codec="latin-1"), max_size=40).map(lambda t: "/" + t),
)
HEADER_NAMES = st.sampled_from(
    [
        "Host",
        "Content-Type",
        "Content-Length",
        "Transfer-Encoding",
        "Origin",
        "Authorization",
        "Last-Event-ID",
        "Upgrade",
        "Connection",
        "Sec-WebSocket-Key",
        "Sec-WebSocket-Version",
        "Expect",
        "X-Junk",
    ]
)
HEADER_VALUES = st.one_of(
    st.sampled_from(
        [
            "127.0.0.1",
            "application/json",
            "chunked",
            "websocket",
            "Upgrade",
            "13",
            "100-continue",
            "Bearer x",
            "-1",
            "99999999999999999999",
            "0",
            "5",
        ]
    ),
    st.text(alphabet=st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=30),
)
JSON_BODIES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        return json.dumps(draw(JSON_BODIES)).encode()
    if kind == 2:
        prompt = json.dumps(draw(st.text(max_size=30)))  # lone surrogates come out escaped
        extra = draw(st.sampled_from(["", ', "messages": []', ', "model": 5', ', "tools": [1]']))
        return f'{{"prompt": {prompt}{extra}}}'.encode()
    return draw(st.sampled_from([b"[" * 5000, b'{"prompt": "' + b"x" * 5000 + b'"}', b"\xff\xfe"]))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(METHODS)
    target = draw(TARGETS)
    headers = draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6))
    body = draw(bodies())
    lines = [f"{method} {target} HTTP/1.1"]
    if draw(st.booleans()):
        lines.append("Host: 127.0.0.1")
    lines += [f"{name}: {value}" for name, value in headers]
    if draw(st.booleans()):
        lines.append(f"Content-Length: {len(body)}")
    head = "\r\n".join(lines) + "\r\n\r\n"
    return head.encode("latin-1") + body


@settings(FUZZ, max_examples=150)
@given(request=requests())
def test_random_requests_never_get_a_500_or_hang(server: _Background, request: bytes) -> None:
    check_answer(exchange(server.url, request))


@settings(FUZZ, max_examples=60)
@given(junk=st.binary(max_size=300))
def test_random_bytes_never_get_a_500_or_hang(server: _Background, junk: bytes) -> None:
    check_answer(exchange(server.url, junk))


def test_the_fuzzed_server_still_answers(server: _Background) -> None:
    answer = exchange(server.url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert server.error is None
