"""Resume, not retry (`OpenAIResponsesDialect(resume=True)`): a Responses stream in OpenAI's
background mode that breaks mid-answer is continued by the provider after the last event read
(`GET /responses/{id}?stream=true&starting_after=N`), with no reset and no fragment twice or
missing; when it cannot be (the response is gone) the turn starts over as before; a reply
nobody will read (the attempt failed, the turn was cancelled) is cancelled at the provider.

The provider is a loopback server playing a real recorded background-mode stream of OpenAI's
(`openai-background-mode-stream.sse`), cut mid-event, and serving its resumption from the same
events, as OpenAI's resume serves them: every event after the number asked for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._policy import Policy
from rillet._core._runevents import AnswerDelta, AttemptResetEvent, RunEvent, StatusEvent
from rillet._turn._api import open_turn, run_turn
from rillet._turn._turn import CallbackSink
from rillet.providers import OpenAIResponsesDialect
from rillet.transports.testing import RecordedRequest, Reply, open_loopback_provider, status_reply

from ..handler_support import REQUEST

RECORDED = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "real"
    / "openai-responses"
    / "openai-background-mode-stream.sse"
).read_bytes()
EVENTS = [block + b"\n\n" for block in RECORDED.split(b"\n\n") if block.strip()]
TEXT = "2 + 2 equals 4."
POLICY = Policy(backoff_base=0.01, random=lambda: 0.0)


def _number(event: bytes) -> int:
    data = event.split(b"data: ", 1)[1]
    return int(json.loads(data).get("sequence_number", 0))


RESPONSE_ID = json.loads(EVENTS[0].split(b"data: ", 1)[1])["response"]["id"]
CUT_AFTER = 8  # the stream breaks halfway through the event after this one
_kept = b"".join(e for e in EVENTS if _number(e) <= CUT_AFTER)
BROKEN = Reply(chunks=(RECORDED,), drop_after_bytes=len(_kept) + 30)


def _after(path: str) -> int:
    found = re.search(r"starting_after=(\d+)", path)
    assert found is not None, path
    return int(found.group(1))


def _resumed(after: int) -> Reply:
    return Reply(chunks=tuple(e for e in EVENTS if _number(e) > after))


def _provider(url: str) -> Provider:
    return Provider(
        OpenAIResponsesDialect(resume=True),
        f"{url}/v1",
        "gpt-4o",
        api_key=Secret("sk-loopback-0123456789abcdef"),
    )


async def _run(script: Any) -> tuple[Any, list[RunEvent], list[RecordedRequest]]:
    """A turn against the scripted provider: its result, its run events, the requests."""
    seen: list[RunEvent] = []
    with trio.fail_after(10):
        async with open_loopback_provider(script) as server:
            result = await run_turn(
                REQUEST,
                _provider(server.url),
                policy=POLICY,
                sinks=[CallbackSink(on_run_event=seen.append)],
            )
    return result, seen, server.requests


def _texts(events: list[RunEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, AnswerDelta))


async def test_a_broken_stream_is_continued_after_its_last_event_without_a_reset() -> None:
    def script(request: RecordedRequest, _: int) -> Reply:
        if request.method == "GET":
            return _resumed(_after(request.path))
        return BROKEN

    result, seen, requests = await _run(script)
    assert result.ok
    assert result.text == TEXT  # every fragment once
    asked, resumed = requests
    body = msgspec.json.decode(asked.body)
    assert (body["background"], body["store"], body["stream"]) == (True, True, True)
    assert resumed.method == "GET"
    assert resumed.path == f"/v1/responses/{RESPONSE_ID}?stream=true&starting_after={CUT_AFTER}"
    assert resumed.headers["authorization"] == "Bearer sk-loopback-0123456789abcdef"
    assert not [e for e in seen if isinstance(e, AttemptResetEvent)]
    (status,) = [e for e in seen if isinstance(e, StatusEvent) and e.phase == "resuming"]
    assert status.reason_code == "connection_lost"
    assert _texts(seen) == TEXT
    assert result.requests == 2


async def test_a_response_that_cannot_be_continued_starts_over_and_is_cancelled() -> None:
    def script(request: RecordedRequest, n: int) -> Reply:
        if request.method == "GET":  # gone: expired, or never kept
            error = {"message": "Response not found", "type": "invalid_request_error"}
            return status_reply(404, body={"error": error})
        if request.path.endswith("/cancel"):
            return Reply(chunks=(b"{}",), content_type="application/json")
        return BROKEN if n == 0 else Reply(chunks=(RECORDED,))

    result, seen, requests = await _run(script)
    assert result.ok
    assert result.text == TEXT
    paths = [(r.method, r.path.split("?")[0]) for r in requests]
    assert paths[:3] == [
        ("POST", "/v1/responses"),
        ("GET", f"/v1/responses/{RESPONSE_ID}"),
        ("POST", f"/v1/responses/{RESPONSE_ID}/cancel"),  # the first reply, nobody reads it
    ]
    assert paths[3] == ("POST", "/v1/responses")  # started over
    assert [e for e in seen if isinstance(e, AttemptResetEvent)]  # with its reset


async def test_a_cancelled_turn_cancels_the_reply_at_the_provider() -> None:
    slow = Reply(chunks=tuple(EVENTS), chunk_delay=0.2)

    def script(request: RecordedRequest, _: int) -> Reply:
        if request.path.endswith("/cancel"):
            return Reply(chunks=(b"{}",), content_type="application/json")
        return slow

    with trio.fail_after(10):
        async with open_loopback_provider(script) as server:
            async with open_turn(REQUEST, _provider(server.url), policy=POLICY) as turn:
                async for event in turn.run_events():
                    if isinstance(event, AnswerDelta):
                        turn.cancel()
                        break
            with trio.fail_after(3):
                while not [r for r in server.requests if r.path.endswith("/cancel")]:  # noqa: ASYNC110
                    await trio.sleep(0.01)
    cancel = [r for r in server.requests if r.path.endswith("/cancel")]
    assert cancel[0].path == f"/v1/responses/{RESPONSE_ID}/cancel"
    assert cancel[0].method == "POST"


def test_resume_is_off_unless_asked_for() -> None:
    provider = Provider(OpenAIResponsesDialect(), "https://api.openai.com/v1", "gpt-4o")
    body: dict[str, Any] = msgspec.json.decode(
        provider.dialect.build_request(REQUEST, provider, stream=True).body
    )
    assert "background" not in body
    assert body["store"] is False


async def _run_with(script: Any, **kept: Any) -> tuple[Any, list[RecordedRequest]]:
    from rillet._turn._options import RunOptions
    from rillet._turn._turn import run_one_turn

    with trio.fail_after(10):
        async with open_loopback_provider(script) as server:
            result = await run_one_turn(
                REQUEST, _provider(server.url), options=RunOptions(policy=POLICY), **kept
            )
    return result, server.requests


async def test_a_kept_reply_is_read_again_from_its_start_instead_of_asked_anew() -> None:
    def script(request: RecordedRequest, _: int) -> Reply:
        assert request.method == "GET"  # never asked anew
        return Reply(chunks=(RECORDED,))

    result, requests = await _run_with(script, replay=RESPONSE_ID)
    assert result.ok
    assert result.text == TEXT
    (read,) = requests
    assert read.path == f"/v1/responses/{RESPONSE_ID}?stream=true"  # every event, from 0
    assert result.requests == 1


async def test_a_kept_reply_that_cannot_be_read_is_asked_anew_at_once() -> None:
    def script(request: RecordedRequest, _: int) -> Reply:
        if request.method == "GET":
            error = {"message": "Response not found", "type": "invalid_request_error"}
            return status_reply(404, body={"error": error})
        return Reply(chunks=(RECORDED,))

    result, requests = await _run_with(script, replay="resp_gone")
    assert result.ok
    assert result.text == TEXT
    assert [r.method for r in requests] == ["GET", "POST"]


async def test_the_id_of_the_reply_the_provider_keeps_is_told_once() -> None:
    told: list[str] = []
    result, _ = await _run_with(lambda *_: Reply(chunks=(RECORDED,)), on_kept=told.append)
    assert result.ok
    assert told == [RESPONSE_ID]
