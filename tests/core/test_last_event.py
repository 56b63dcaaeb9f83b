"""The last SSE event of a reply without its blank line: read when its data is whole.

The event-stream standard discards an event still pending at end of input, and `SSEDecoder`
keeps that rule. But a reply that sent its terminal event whole (`data: [DONE]`, Anthropic's
`message_stop`, Responses' `response.completed`, Gemini's last chunk) and then ended without the
blank line after it has said everything: retrying it would pay for the same answer again. So at
end of input the wire decoder reads such an event when its data is whole (`[DONE]`, or JSON that
parses), as NDJSON reads a last line without its LF. An event cut inside its data is still a
truncation, but for a Chat Completions reply whose finish reason and usage both came before it:
that reply is whole without `[DONE]` (as servers that never send it end). Every SSE fixture that
completes is replayed with its last blank line, its last line end, or both taken off, and with
its last event cut short; CRLF too, in several chunkings.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest
from rillet import Outcome, Policy, TurnRequest, run_turn, user
from rillet._core._sse import SSEDecoder, SSEEvent
from rillet.providers import Provider
from rillet.transports.replay import ReplayTransport

from ..providers.test_fixtures import dialect_for
from ..wire_cases import cases, chunkings, expected, run, wire_path

if TYPE_CHECKING:
    from pathlib import Path

    import trio.testing

SSE_FOLDERS = ("anthropic-messages", "gemini", "openai-chat", "openai-responses")


def _completing() -> list[tuple[str, str]]:
    found = []
    for folder in SSE_FOLDERS:
        for case in cases(folder):
            path = wire_path(folder, case)
            if path.suffix != ".sse":
                continue
            if '"error"' in expected(folder, case)[-1]:
                continue  # a reply that ends in an error has no whole ending to keep
            found.append((folder, case))
    return found


COMPLETING = _completing()


def _endings(data: bytes) -> list[tuple[str, bytes]]:
    """The reply without its last blank line, without its last line end too, in CRLF."""
    assert data.endswith(b"\n\n")
    crlf = data.replace(b"\n", b"\r\n")
    return [
        ("no blank line", data[:-1]),
        ("no line end", data[:-2]),
        ("crlf, no blank line", crlf[:-2]),
        ("crlf, a lone CR", crlf[:-3]),
        ("crlf, no line end", crlf[:-4]),
    ]


def test_the_cases_cover_every_sse_dialect() -> None:
    assert {folder for folder, _ in COMPLETING} == set(SSE_FOLDERS)


@pytest.mark.parametrize(("folder", "case"), COMPLETING, ids=[f"{f}/{c}" for f, c in COMPLETING])
def test_a_last_event_without_its_blank_line_completes_the_reply(folder: str, case: str) -> None:
    dialect = dialect_for(folder)
    data = wire_path(folder, case).read_bytes()
    want = expected(folder, case)
    for ending, cut in _endings(data):
        for name, chunks in chunkings(cut):
            assert run(dialect, chunks) == want, f"{ending}, {name}"


def _ended_before(folder: str, data: bytes) -> bool:
    """Whether a Chat Completions reply's finish reason and usage both came before its last
    event (`[DONE]`): then it is whole without that event (servers that never send `[DONE]`
    end so)."""
    if folder != "openai-chat":
        return False
    finished = used = False
    for line in data.splitlines()[:-1]:
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            frame = json.loads(line[5:])
            choices = frame.get("choices") or [{}]
            finished = finished or bool(choices[0].get("finish_reason"))
            used = used or frame.get("usage") is not None
            used = used or (frame.get("x_groq") or {}).get("usage") is not None
    return finished and used


@pytest.mark.parametrize(("folder", "case"), COMPLETING, ids=[f"{f}/{c}" for f, c in COMPLETING])
def test_a_last_event_cut_inside_its_data_is_still_a_truncation(folder: str, case: str) -> None:
    dialect = dialect_for(folder)
    data = wire_path(folder, case).read_bytes().rstrip(b"\n")
    last_line = data[data.rfind(b"\n") + 1 :]
    assert last_line.startswith(b"data:")
    whole = _ended_before(folder, data)  # else the cut leaves the reply without its end
    for keep in (len(last_line) - 1, len(last_line) // 2, 7):
        cut = data[: len(data) - len(last_line) + keep]
        for name, chunks in chunkings(cut):
            got = run(dialect, chunks)
            if whole:
                assert got == expected(folder, case), f"{keep} bytes kept, {name}"
            else:
                assert '"IncompleteStreamError"' in got[-1], f"{keep} bytes kept, {name}"


def test_some_chat_replies_are_cut_where_their_end_had_not_come() -> None:
    """The test above still sees truncations of Chat Completions: replies whose usage (or finish
    reason) had not come when `[DONE]` was cut."""
    chat = [case for folder, case in COMPLETING if folder == "openai-chat"]
    cut = [c for c in chat if not _ended_before("openai-chat", _last_cut(c))]
    assert cut
    assert len(cut) < len(chat)


def _last_cut(case: str) -> bytes:
    return wire_path("openai-chat", case).read_bytes().rstrip(b"\n")


def test_the_decoder_itself_still_discards_what_is_pending() -> None:
    """`end_block` is the reader's choice; `close` alone keeps the standard's rule."""
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n") == [SSEEvent("a")]
    assert decoder.close() == []
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n\nevent: x\ndata: b\n")
    assert decoder.end_block() == [SSEEvent("b", "x")]
    assert decoder.offset == len(b"data: a\n\nevent: x\ndata: b\n")
    assert decoder.close() == []
    for tail in (b"data: b", b"data: b\r", b": a comment\ndata: b\n: keep-al"):
        decoder = SSEDecoder()
        decoder.feed(tail)
        assert decoder.end_block() == [SSEEvent("b")], tail
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n\n: only a comment")
    assert decoder.end_block() == []


async def test_one_request_for_a_reply_that_ends_without_its_blank_line(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The whole turn, retries and rescue on: the reply is complete, so it is asked for once."""
    recording = tmp_path / "text.sse"
    recording.write_bytes(wire_path("openai-chat", "text").read_bytes()[:-1])  # `[DONE]\n`
    transport = ReplayTransport(recording, chunk_size=64)
    provider = Provider(dialect_for("openai-chat"), "https://api.test/v1", "m")
    async with httpx.AsyncClient(transport=transport) as client:
        result = await run_turn(
            TurnRequest(messages=[user("hi")]), provider, client=client, policy=Policy()
        )
    assert result.outcome is Outcome.COMPLETED
    assert (result.requests, transport.requests) == (1, 1)
