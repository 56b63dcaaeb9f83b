"""The server's MMSP endpoints: `POST /v1/stream` (UniEvents as SSE `data:` lines ended by
`data: [DONE]`, errors as `{"error": {...}}`) and `GET /v1/models`.

The stream is read back with our `SSEDecoder` and `decode_uni_event`, and also through our own
MMSP client dialect, which checks it against the grammar once more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
import trio.testing
from rillet import IncompleteStreamError
from rillet._core._dialect import Provider, Secret
from rillet._core._events import UniEvent, decode_uni_event
from rillet._core._request import TurnRequest, user
from rillet._turn._api import open_turn, run_turn
from rillet.frames import SSEDecoder, SSEEvent
from rillet.providers._mmsp import MMSPDialect, error_from_wire, parse_model_list
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    sse,
    status_reply,
)

from ..server_support import (
    POLICY,
    PROVIDER_KEY,
    Served,
    chat_provider,
    dropped_then_ok,
    serving,
    text_reply,
)

if TYPE_CHECKING:
    import httpx
    from rillet.transports.testing import Script

HI = {"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}
WORDS = ["Bonjour", ", ", "le monde", " ✓"]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [HI], "config": {}, **fields}


async def stream(served: Served, payload: dict[str, Any] | None = None) -> httpx.Response:
    """`POST /v1/stream`, read whole."""
    return await served.client.post("/v1/stream", json=payload or body())


def frames(response: httpx.Response) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(response.content) + decoder.close()


def unstamped(events: list[UniEvent]) -> list[UniEvent]:
    """Events without their creation time (two runs of one reply differ only there)."""
    return [msgspec.structs.replace(e, created_at=0) for e in events]


async def reference_events(script: Script) -> list[UniEvent]:
    """The UniEvents a turn produces for `script`, run directly (no server)."""
    async with open_loopback_provider(script) as loopback:
        request = TurnRequest(messages=[user("Hi")])
        async with open_turn(request, chat_provider(loopback.url), policy=POLICY) as turn:
            items = [item async for item in turn.uni_events()]
    assert all(isinstance(item, UniEvent) for item in items)
    return [item for item in items if isinstance(item, UniEvent)]


# --- streaming ------------------------------------------------------------------------------------


async def test_the_stream_is_the_turns_uni_events_then_done() -> None:
    script = [text_reply(WORDS)]
    with trio.fail_after(5):
        expected = await reference_events(script)
        async with serving(script) as served:
            response = await stream(served)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = frames(response)
    assert events[-1].data == "[DONE]"
    got = [decode_uni_event(e.data) for e in events[:-1]]
    assert unstamped(got) == unstamped(expected)
    assert got[-1].event_type == "stop"
    # one `data:` line per event: no `id`, no `event` name, nothing else on the wire
    assert all(e.event == "message" and e.id == "" for e in events)
    assert response.content.count(b"\n\n") == len(events)


async def test_our_mmsp_client_reads_the_server_like_any_mmsp_server() -> None:
    with trio.fail_after(5):
        async with serving([text_reply(WORDS)]) as served:
            provider = Provider(MMSPDialect(), f"{served.url}/v1", "gpt-4o-mini")
            result = await run_turn(TurnRequest(messages=[user("Hi")]), provider, policy=POLICY)
    assert result.ok
    assert result.text == "".join(WORDS)
    assert result.attempts == 1


async def test_the_server_key_is_required_when_set() -> None:
    key = "server-key-0123456789"
    with trio.fail_after(5):
        async with serving(api_key=Secret(key)) as served:
            refused = await stream(served)
            models = await served.client.get("/v1/models")
            provider = Provider(MMSPDialect(), f"{served.url}/v1", "gpt-4o-mini", Secret(key))
            result = await run_turn(TurnRequest(messages=[user("Hi")]), provider, policy=POLICY)
            requests = len(served.loopback.requests)
    assert refused.status_code == models.status_code == 401
    assert refused.json()["error"]["type"] == "AuthenticationError"
    assert result.ok
    assert requests == 1  # only the keyed turn reached the provider


async def test_models_are_listed_in_openais_shape() -> None:
    with trio.fail_after(5):
        async with serving(models=["gpt-4o-mini", "gpt-4o"]) as served:
            listed = await served.client.get("/v1/models")
            other = await stream(served, body(model="gpt-4o"))
            unknown = await stream(served, body(model="nope"))
            sent = served.loopback.requests[-1].body
    assert listed.status_code == 200
    data = listed.json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["gpt-4o-mini", "gpt-4o"]
    assert all(m["object"] == "model" for m in data["data"])
    assert parse_model_list(listed.content) == ["gpt-4o-mini", "gpt-4o"]
    assert other.status_code == 200
    assert msgspec.json.decode(sent)["model"] == "gpt-4o"  # the model asked for is used
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (b"{not json", 400),
        (msgspec.json.encode({"messages": [HI]}), 400),  # no model
        (msgspec.json.encode(body(messages=[])), 400),
        (msgspec.json.encode(body(config={"max_tokens": "many"})), 400),
    ],
)
async def test_bad_requests_are_refused_before_anything_is_sent(
    payload: bytes, status: int
) -> None:
    with trio.fail_after(5):
        async with serving() as served:
            response = await served.client.post(
                "/v1/stream", content=payload, headers={"content-type": "application/json"}
            )
            requests = len(served.loopback.requests)
    assert response.status_code == status
    assert response.json()["error"]["type"] == "InvalidRequestError"
    assert requests == 0


# --- errors ---------------------------------------------------------------------------------------


async def test_an_upstream_refusal_is_an_http_error_without_the_providers_words() -> None:
    leak = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    with trio.fail_after(5):
        async with serving([status_reply(401, body=leak)], provider_key=PROVIDER_KEY) as served:
            response = await stream(served)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "AuthenticationError"
    assert error["status"] == 401
    assert PROVIDER_KEY not in response.text
    assert "Incorrect API key" not in response.text


async def test_an_invalid_request_keeps_the_providers_reason_but_never_its_key() -> None:
    said = {"error": {"message": f"max_tokens too large (key {PROVIDER_KEY})", "type": "x"}}
    with trio.fail_after(5):
        async with serving([status_reply(400, body=said)], provider_key=PROVIDER_KEY) as served:
            response = await stream(served)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "InvalidRequestError"
    assert "max_tokens too large" in error["message"]
    assert PROVIDER_KEY not in response.text


async def test_a_rate_limited_upstream_is_429_with_its_wait() -> None:
    with trio.fail_after(5):
        async with serving([status_reply(429, retry_after=3600)]) as served:
            response = await stream(served)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3600"
    error = response.json()["error"]
    assert error["type"] == "RateLimitError"
    assert error["retry_after"] == 3600


async def test_an_error_after_the_stream_began_is_one_event_then_done() -> None:
    ok = openai_text_stream(WORDS[:2], usage=False, done=False)
    head = b"".join(f + b"\n\n" for f in ok.split(b"\n\n")[:3])  # the role frame and two texts
    refused = sse({"error": {"message": "content policy", "type": "invalid_request_error"}})
    with trio.fail_after(5):
        async with serving([Reply(chunks=(head, refused))]) as served:
            response = await stream(served)
    assert response.status_code == 200
    events = frames(response)
    assert events[-1].data == "[DONE]"
    deltas = [decode_uni_event(e.data) for e in events[:-2]]
    assert [d.content_items[0].text for d in deltas] == WORDS[:2]  # type: ignore[union-attr]
    error = msgspec.json.decode(events[-2].data)["error"]
    assert error["type"] == "InvalidRequestError"


async def test_a_retry_after_events_were_sent_ends_the_stream_incomplete() -> None:
    words = ["one ", "two ", "three"]
    with trio.fail_after(5):
        async with serving(dropped_then_ok(words, 2)) as served:
            response = await stream(served)
            requests = len(served.loopback.requests)
    events = frames(response)
    assert events[-1].data == "[DONE]"
    sent = [decode_uni_event(e.data) for e in events[:-2]]
    assert [s.content_items[0].text for s in sent] == words[:2]  # type: ignore[union-attr]
    error = msgspec.json.decode(events[-2].data)["error"]
    assert error["type"] == "IncompleteStreamError"
    # an MMSP client reads it as the retryable error it is
    assert isinstance(error_from_wire(error, in_stream=True), IncompleteStreamError)
    assert requests == 2  # the server's own retry had begun; it was cancelled


async def test_a_reply_slow_to_start_gets_its_head_and_keep_alives_then_streams(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.02
    with trio.fail_after(300):
        async with serving([text_reply(WORDS, headers_delay=100)]) as served:
            start = trio.current_time()
            async with served.client.stream("POST", "/v1/stream", json=body()) as response:
                head_at = trio.current_time() - start
                decoder = SSEDecoder()
                events: list[SSEEvent] = []
                async for chunk in response.aiter_raw():
                    events += decoder.feed(chunk)
    assert response.status_code == 200
    assert head_at == pytest.approx(15, abs=0.5)  # the head once the heartbeat is due
    assert decoder.comments == 5  # at 30, 45, 60, 75 and 90 s
    assert events[-1].data == "[DONE]"
    assert decode_uni_event(events[-2].data).event_type == "stop"


async def test_a_client_that_leaves_cancels_its_turn() -> None:
    script = [text_reply([f"{n} " for n in range(500)], chunk_delay=0.01)]
    with trio.fail_after(5):
        async with serving(script) as served:
            async with served.client.stream("POST", "/v1/stream", json=body()) as response:
                with trio.CancelScope() as cut:  # leave after the first bytes
                    async for _ in response.aiter_raw():
                        cut.cancel()
            # the provider's connection closes once the turn is over (nothing to wait on but it)
            while served.loopback.open_connections:  # noqa: ASYNC110
                await trio.sleep(0.01)
            metrics = (await served.client.get("/metrics.json")).json()
    assert metrics["runs_active"] == 0
