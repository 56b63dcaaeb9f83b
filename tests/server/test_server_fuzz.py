"""A seeded fuzzer against a real server: valid requests to every route, mutated, sent over raw
sockets, and what must hold whatever the bytes.

The server runs on 127.0.0.1 with the loopback provider behind it, a server key, and short
timeouts (`LIMITS`), so that a case costs at most a few of them. Each case starts from a valid
request to one route and takes a few mutations (`fuzz_cases`): bytes flipped,
inserted or deleted in the head, headers dropped, doubled or given absurd values, wrong methods
and versions, bodies truncated, oversized, not JSON or JSON of the wrong shape at any field,
random chunked framings, pipelined requests, writes cut anywhere, and for a WebSocket random
frames after the handshake. Whatever came, every connection must get, within `CASE_DEADLINE`:

1. well-formed HTTP/1.1 responses (status line, header lines, a body its `Content-Length` or
   chunked framing accounts for, or one ending at a `connection: close`; after a 101, server
   frames RFC 6455 allows), or a clean close;
2. no 5xx but those the server documents (501, 503, 505), and no log line at ERROR or with a
   traceback;
3. error bodies that are JSON `{"error": {...}}`, sent `X-Content-Type-Options: nosniff`,
   quoting at most 80 characters of what the client sent;

and after the run `/healthz` answers at once, with no connection, subscriber, run or task left.

Each case's random source is `Random(f"{seed}:{case}")`: the same bytes every run. A failure
prints the seed, the case and the exact bytes sent; `RILLET_FUZZ_SEED`, `RILLET_FUZZ_CASES` and
`RILLET_FUZZ_CASE` (one case alone) reproduce it.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import time
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
from rillet._core._dialect import Secret
from rillet.transports.server import Limits

from ..fuzz_cases import KEY, MAX_BODY, TEMPLATES, Case, Context, close_frame, make_case
from ..server_support import act, serving, text_reply
from .test_reliability_hostile import open_fds

if TYPE_CHECKING:
    from pathlib import Path

    from rillet.transports.testing import RecordedRequest, Reply

    from ..server_support import Served

SEED = int(os.environ.get("RILLET_FUZZ_SEED", "20261201"))
CASES = int(os.environ.get("RILLET_FUZZ_CASES", "400"))
ONLY = os.environ.get("RILLET_FUZZ_CASE")  # one case's number: rerun it alone
LIMITS = Limits(
    max_body=MAX_BODY,
    head_timeout=0.5,
    write_timeout=2.0,
    close_timeout=0.3,
    heartbeat=0.5,
    ws_burst=20,
)
CASE_DEADLINE = 6.0  # seconds: past every server timeout a case can meet, a few times over
ALLOWED_5XX = frozenset({501, 503, 505})  # not implemented, at capacity, HTTP version
MAX_ECHO = 80
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


# --- one exchange ---------------------------------------------------------------------------------


@attrs.define
class Exchange:
    """What came back on a case's connection, and how it ended (`eof`, `reset`, `timeout`)."""

    received: bytearray = attrs.field(factory=bytearray)
    ended: str = "timeout"
    seconds: float = 0.0


_UPGRADED = re.compile(rb"(?:^|\n)HTTP/1\.1 101 [^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n")


def after_101(data: bytes) -> bytes | None:
    """What the server sent after a 101's head (its frames), None before a whole 101."""
    upgraded = _UPGRADED.search(data)
    return None if upgraded is None else data[upgraded.end() :]


def _closes(data: bytes) -> bool:
    """Whether the server's frames after a 101 hold a close frame."""
    frames, _ = server_frames(data)
    return any(opcode == 0x8 for opcode, _, _ in frames)


_UPGRADE_WAIT = 2.0  # seconds the client waits for its upgrade to be answered


async def play(url: str, case: Case) -> Exchange:
    """Send the case's bytes (after a 101, its frames, then a close, and an answer to the
    server's close); read until the server closes, or `CASE_DEADLINE`."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    out = Exchange()
    upgrades = [draft for draft in case.requests if draft.ws_key is not None]
    started = time.perf_counter()
    stream = await trio.open_tcp_stream(host, int(port))
    lock = trio.Lock()
    upgraded = trio.Event()
    closed = False  # a close frame went out
    gone = (trio.BrokenResourceError, trio.ClosedResourceError)

    async def send(data: bytes, *, eof: bool = False) -> None:
        async with lock:
            if data:
                await stream.send_all(data)
            if eof:
                await stream.send_eof()

    async def close() -> None:
        nonlocal closed
        if not closed:
            closed = True
            await send(close_frame(1000))

    async def writer() -> None:
        try:
            pos = 0
            for size in case.pieces:
                await send(case.wire[pos : pos + size])
                pos += size
                await trio.sleep(0.001)
            await send(case.wire[pos:])
            if upgrades:
                with trio.move_on_after(_UPGRADE_WAIT):
                    await upgraded.wait()
                if upgraded.is_set():  # the first upgrade asked for is the one answered
                    for frame in upgrades[0].frames:
                        await send(frame)
                    await trio.sleep(0.1)  # what the frames make the server do, it does
                    await close()  # a live run's session ends so
            if case.half_close:
                await send(b"", eof=True)
        except gone:
            pass

    async def reader(scope: trio.CancelScope) -> None:
        try:
            while data := await stream.receive_some(65536):
                out.received += data
                frames = after_101(bytes(out.received)) if upgrades else None
                if frames is not None:
                    upgraded.set()
                    if not closed and _closes(frames):
                        with contextlib.suppress(*gone):
                            await close()  # the answer to the server's close
            out.ended = "eof"
        except gone:
            out.ended = "reset"
        scope.cancel()

    with trio.move_on_after(CASE_DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, nursery.cancel_scope)
            nursery.start_soon(writer)
    out.seconds = time.perf_counter() - started
    await trio.aclose_forcefully(stream)
    return out


# --- what must hold -------------------------------------------------------------------------------

_STATUS = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) ([\x20-\x7e]*)\r\n")
_VALUE = rb"[\x21-\x7e\x80-\xff](?:[\x20-\x7e\x80-\xff\t]*[\x21-\x7e\x80-\xff])?"
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(" + _VALUE + rb")?[ \t]*\r\n")
_CLOSE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


class Malformed(Exception):
    """What came back is not HTTP/1.1 (or WebSocket) as a server may send it."""


@attrs.define
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def get(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


def server_frames(data: bytes) -> tuple[list[tuple[int, bytes, bool]], bytes]:
    """The server's frames in `data` (opcode, payload, fin) and what is left of a frame cut
    short. Raises `Malformed` for a frame a server must not send."""
    frames, pos = [], 0
    while pos + 2 <= len(data):
        b0, b1 = data[pos], data[pos + 1]
        if b1 & 0x80:
            raise Malformed("a masked server frame")
        if b0 & 0x70:
            raise Malformed("a server frame with RSV bits")
        size, at = b1 & 0x7F, pos + 2
        if size == 126:
            if at + 2 > len(data):
                break
            size, at = struct.unpack_from("!H", data, at)[0], at + 2
        elif size == 127:
            if at + 8 > len(data):
                break
            size, at = struct.unpack_from("!Q", data, at)[0], at + 8
        if at + size > len(data):
            break
        frames.append((b0 & 0x0F, data[at : at + size], bool(b0 & 0x80)))
        pos = at + size
    return frames, data[pos:]


def check_frames(data: bytes) -> None:
    """The server's side of a WebSocket: whole frames it may send, nothing after its close."""
    frames, rest = server_frames(data)
    if rest:
        raise Malformed(f"a server frame cut short: {rest[:40]!r}")
    for n, (opcode, payload, fin) in enumerate(frames):
        if opcode not in (0x1, 0x2, 0x8, 0x9, 0xA):
            raise Malformed(f"server opcode {opcode:#x}")
        if not fin:
            raise Malformed("a fragmented server message")
        if opcode >= 0x8 and len(payload) > 125:
            raise Malformed("a server control frame over 125 bytes")
        if opcode == 0x1:
            json.loads(payload.decode("utf-8"))  # run events are JSON
        if opcode == 0x8:
            if len(payload) == 1:
                raise Malformed("a one-byte close payload")
            if payload:
                code = struct.unpack("!H", payload[:2])[0]
                if code not in _CLOSE_CODES and not 3000 <= code <= 4999:
                    raise Malformed(f"server close code {code}")
                payload[2:].decode("utf-8")
            if n != len(frames) - 1:
                raise Malformed("frames after the server's close")


def _chunked(data: bytes, pos: int) -> tuple[bytes, int]:
    body = bytearray()
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            raise Malformed("a chunked body cut short")
        line = data[pos:end].split(b";")[0]
        if not re.fullmatch(rb"[0-9a-fA-F]{1,16}", line):
            raise Malformed(f"a bad chunk size {line[:20]!r}")
        size, pos = int(line, 16), end + 2
        if size == 0:
            if data[pos : pos + 2] != b"\r\n":
                raise Malformed("a chunked body without its last CRLF")
            return bytes(body), pos + 2
        if pos + size + 2 > len(data):
            raise Malformed("a chunk cut short")
        if data[pos + size : pos + size + 2] != b"\r\n":
            raise Malformed("a chunk without its CRLF")
        body += data[pos : pos + size]
        pos += size + 2


def parse_responses(data: bytes, methods: list[bytes]) -> tuple[list[Response], bytes | None]:
    """The responses in `data`, and the bytes after a 101 (None without one). Raises
    `Malformed`."""
    out: list[Response] = []
    pos, index = 0, 0
    while pos < len(data):
        status_line = _STATUS.match(data, pos)
        if status_line is None:
            raise Malformed(f"no status line at byte {pos}: {data[pos : pos + 60]!r}")
        status, pos = int(status_line[1]), status_line.end()
        headers = []
        while not data.startswith(b"\r\n", pos):
            field = _FIELD.match(data, pos)
            if field is None:
                raise Malformed(f"a bad header line: {data[pos : pos + 60]!r}")
            headers.append((field[1].lower(), field[2] or b""))
            pos = field.end()
        pos += 2
        response = Response(status, headers, b"")
        out.append(response)
        if status == 101:
            return out, data[pos:]
        if status < 200:
            continue
        method = methods[index] if index < len(methods) else b"GET"
        index += 1
        lengths = [v for n, v in headers if n == b"content-length"]
        coding = response.get(b"transfer-encoding")
        if len(lengths) > 1 or (lengths and coding is not None):
            raise Malformed("a response framed two ways")
        bodiless = data[pos:] == b"" or data.startswith(b"HTTP/1.1 ", pos)
        if status in (204, 304) or (method == b"HEAD" and bodiless):
            pass
        elif coding is not None:
            if coding.lower() != b"chunked":
                raise Malformed(f"transfer-encoding {coding!r}")
            response.body, pos = _chunked(data, pos)
        elif lengths:
            if not lengths[0].isdigit():
                raise Malformed(f"content-length {lengths[0]!r}")
            end = pos + int(lengths[0])
            if end > len(data):
                raise Malformed("a body shorter than its content-length")
            response.body, pos = data[pos:end], end
        elif b"close" in (response.get(b"connection") or b"").lower():
            response.body, pos = data[pos:], len(data)
        else:
            raise Malformed("a body with no framing on a connection kept open")
        if b"close" in (response.get(b"connection") or b"").lower() and pos < len(data):
            raise Malformed("bytes after a response that closes the connection")
    return out, None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def sent_texts(case: Case) -> list[str]:
    """What the client sent, as text a reply could quote it from."""
    texts = [case.wire.decode("latin-1"), case.wire.decode("utf-8", "replace")]
    for draft in case.requests:
        with contextlib.suppress(ValueError, RecursionError):
            texts.append("\x00".join(_strings(json.loads(draft.body))))
    return texts


def echo(reply: Any, texts: list[str]) -> str | None:
    """A run of more than `MAX_ECHO` characters of the client's input in a reply, if any."""
    for value in _strings(reply):
        for start in range(len(value) - MAX_ECHO):
            window = value[start : start + MAX_ECHO + 1]
            if any(window in text for text in texts):
                return window
    return None


def check_response(response: Response, case: Case, texts: list[str]) -> None:
    """Properties 2 and 3 for one response. Raises `Malformed`."""
    status, ctype = response.status, response.get(b"content-type") or b""
    if status >= 500 and status not in ALLOWED_5XX:
        raise Malformed(f"status {status}: {response.body[:200]!r}")
    sniffable = status >= 400 or ctype.startswith(b"text/event-stream")
    if sniffable and response.get(b"x-content-type-options") != b"nosniff":
        raise Malformed(f"a {status} without x-content-type-options: nosniff")
    if status < 400:
        if ctype == b"application/json" and response.body:
            json.loads(response.body)
        return
    if ctype != b"application/json":
        raise Malformed(f"a {status} of type {ctype!r}")
    if not response.body:
        return  # a HEAD's answer
    try:
        reply = json.loads(response.body)
    except ValueError:
        raise Malformed(f"a {status} whose body is not JSON: {response.body[:100]!r}") from None
    error = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise Malformed(f"a {status} without an error object: {response.body[:100]!r}")
    quoted = echo(reply, texts)
    if quoted is not None:
        raise Malformed(f"a {status} quotes {len(quoted)}+ characters of the request: {quoted!r}")


_SANE = frozenset(TEMPLATES) - {"model", "approval"}  # their templates may name what is not there


def check_exchange(case: Case, exchange: Exchange) -> None:
    """Property 1 (and 2, 3 through `check_response`) for one case. Raises `Malformed`."""
    if exchange.ended == "timeout":
        raise Malformed(f"neither answered nor closed within {CASE_DEADLINE} s")
    data = bytes(exchange.received)
    responses, upgraded = parse_responses(data, [d.method for d in case.requests])
    texts = sent_texts(case)
    for response in responses:
        check_response(response, case, texts)
    if upgraded is not None:  # the key as sent, mutated or not
        keys = re.findall(rb"(?im)^sec-websocket-key:[ \t]*(.*?)[ \t]*\r$", case.wire)
        accepts = {base64.b64encode(hashlib.sha1(key + _GUID).digest()) for key in keys}
        if responses[-1].get(b"sec-websocket-accept") not in accepts:
            raise Malformed("a 101 with the wrong sec-websocket-accept")
        check_frames(upgraded)
    final = [r for r in responses if r.status >= 200]
    spoiled = set(case.mutations) - {"split", "kept_open"}  # a valid request's bytes are whole
    if not spoiled and case.route in _SANE and final and final[0].status >= 400:
        raise Malformed(f"a valid request answered {final[0].status}: {final[0].body[:200]!r}")


# --- the run --------------------------------------------------------------------------------------


def task_count() -> int:
    """Tasks alive in this trio run."""

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(c) for n in task.child_nurseries for c in n.child_tasks)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    return count(root)


def _first_status(exchange: Exchange) -> str:
    """The first final status on the connection, or how it ended without one."""
    for match in re.finditer(rb"HTTP/1\.1 ([0-9]{3}) ", bytes(exchange.received)):
        if match[1] != b"100":
            return match[1].decode()
    return exchange.ended


def _bad_record(record: logging.LogRecord) -> bool:
    """A log line that means a bug: an error, a traceback, an exception named."""
    text = record.getMessage()
    return (
        record.levelno >= logging.ERROR
        or record.exc_info is not None
        or "Traceback" in text
        or (record.levelno >= logging.WARNING and "Exception" in text)
    )


def report(case: Case, exchange: Exchange, problems: list[str], saved: str) -> str:
    """A failed case, with what reproduces it."""
    frames = b"".join(case.requests[0].frames)
    sent = (
        repr(case.wire) if len(case.wire) <= 2000 else f"{case.wire[:2000]!r}... (whole in {saved})"
    )
    lines = [
        f"case {case.number} of seed {SEED} (rerun: RILLET_FUZZ_SEED={SEED} "
        f"RILLET_FUZZ_CASE={case.number}), route {case.route}, mutations {case.mutations}:",
        *(f"  - {p}" for p in problems),
        f"  sent {len(case.wire)} bytes in writes {case.pieces or 'whole'}: {sent}",
    ]
    if frames:
        lines.append(f"  then frames: {frames[:500]!r}")
    lines.append(
        f"  received ({exchange.ended}, {exchange.seconds:.2f} s): "
        f"{bytes(exchange.received[:1500])!r}"
    )
    return "\n".join(lines)


async def settle(served: Served, within: float = 5.0) -> dict[str, Any]:
    """`/metrics.json` once the server holds nothing but the test's own connection (or
    `within` seconds passed)."""
    deadline = trio.current_time() + within
    while True:
        metrics: dict[str, Any] = (await served.client.get("/metrics.json")).json()
        idle = (
            metrics["connections"] <= 1
            and not metrics["runs_active"]
            and not metrics["subscribers"]
        )
        if (idle and not metrics["runs_queued"]) or trio.current_time() > deadline:
            return metrics
        await trio.sleep(0.05)


def script(request: RecordedRequest, _: int) -> Reply:
    """A run asked to `stall` goes silent after its first words and never ends (a live run for
    the WebSocket cases); any other completes at once."""
    if b"stall" in request.body:
        return text_reply(["Hel", "lo"], stall_after=3)
    return text_reply()


@pytest.mark.slow
async def test_no_request_breaks_the_server(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="rillet.transports.server")
    numbers = [int(ONLY)] if ONLY else range(CASES)
    failures: list[str] = []
    seen_statuses: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    with trio.fail_after(300):
        async with serving(script, api_key=Secret(KEY), limits=LIMITS) as served:
            served.client.headers["authorization"] = f"Bearer {KEY}"
            runs = [await served.start() for _ in range(3)]
            for run in runs:
                await served.wait_for(run["run_id"])
            live = [await served.start("stall") for _ in range(2)]
            ctx = Context(
                host=served.url.removeprefix("http://").encode(),
                runs=[(run["run_id"], run["token"]) for run in runs],
                live=[(run["run_id"], run["token"]) for run in live],
            )
            await settle(served)
            tasks, fds = task_count(), open_fds()
            for number in numbers:
                case = make_case(ctx, SEED, number)
                seen = len(caplog.records)
                exchange = await play(served.url, case)
                seen_statuses[case.route][_first_status(exchange)] += 1
                problems = []
                try:
                    check_exchange(case, exchange)
                except (Malformed, ValueError) as exc:  # JSON and UTF-8 errors too
                    problems.append(f"{type(exc).__name__}: {exc}")
                problems += [
                    f"log {r.levelname}: {r.getMessage()[:300]}"
                    for r in caplog.records[seen:]
                    if _bad_record(r)
                ]
                if problems:
                    saved = tmp_path / f"case-{number}.bin"
                    saved.write_bytes(case.wire + b"".join(case.requests[0].frames))
                    failures.append(report(case, exchange, problems, str(saved)))
            started = time.perf_counter()
            health = await served.client.get("/healthz")
            health_s = time.perf_counter() - started
            for run in live:
                await served.client.delete(f"/v1/runs/{run['run_id']}", headers=act(run))
            metrics = await settle(served)
            await trio.sleep(0.1)  # the last connections' tasks end after their counts
            tasks_after, fds_after = task_count(), open_fds()
            hub = served.hub.statistics()
    for route, statuses in sorted(seen_statuses.items()):  # what the cases reached (-s shows it)
        print(f"{route}: {dict(statuses.most_common())}")
    assert not failures, f"{len(failures)} of {len(numbers)} cases failed:\n\n" + "\n\n".join(
        failures[:8]
    )
    assert health.status_code == 200
    assert health_s < 1.0
    assert metrics["connections"] == 1  # the test's own client
    assert metrics["runs_active"] == metrics["runs_queued"] == metrics["subscribers"] == 0
    assert hub["subscribers"] == 0
    assert tasks_after <= tasks, (tasks, tasks_after)
    assert fds_after <= fds, (fds, fds_after)
