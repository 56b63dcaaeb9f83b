"""OpenAI's Realtime API in text mode: the dialect on recorded-style sessions (GA and beta names),
and whole turns over a real WebSocket to a trio-websocket server on 127.0.0.1, through
`run_turn` and the CLI."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio_websocket
from rillet import (
    InvalidRequestError,
    Outcome,
    Policy,
    RateLimiter,
    TransportError,
    TurnRequest,
    run_turn,
    user,
)
from rillet._core._request import ToolSpec
from rillet.lowlevel import WireDecoder
from rillet.providers import OpenAIRealtimeDialect, Provider, Secret, provider_from_env
from rillet.transports.upstream import open_websocket_upstream

from ..wire_cases import entry_of, error_entry

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet import UniEvent

FIXTURES = Path(__file__).parent.parent / "fixtures" / "openai-realtime"
CASES = sorted(p.name.removesuffix(".jsonl") for p in FIXTURES.glob("*.jsonl"))
KEY = "sk-realtime-secret-000011112222"


def messages(case: str) -> list[bytes]:
    return [line for line in (FIXTURES / f"{case}.jsonl").read_bytes().splitlines() if line]


def expected(case: str) -> list[str]:
    entries = json.loads((FIXTURES / f"{case}.expected.json").read_text("utf-8"))
    return [json.dumps(e, ensure_ascii=False) for e in entries]


def decode(pieces: list[bytes]) -> list[str]:
    decoder = WireDecoder(OpenAIRealtimeDialect(), clock=lambda: 0)
    events: list[UniEvent] = []
    try:
        for piece in pieces:
            decoder.feed(piece, events)
            if decoder.grammar.stopped:
                break
        else:
            decoder.close(events)
    except Exception as exc:  # the entries name the error class
        return [entry_of(e) for e in events] + [error_entry(exc)]
    return [entry_of(e) for e in events]


@pytest.mark.parametrize("case", CASES)
def test_each_session_decodes_to_its_expected_entries(case: str) -> None:
    assert decode(messages(case)) == expected(case)


def test_the_cases_are_found() -> None:
    assert {"text", "text_beta", "max_tokens", "error", "failed", "tool_call"} <= set(CASES)


def test_events_after_response_done_are_not_read() -> None:
    extra = b'{"type": "response.output_text.delta", "item_id": "x", "delta": "late"}'
    assert decode([*messages("text"), extra]) == expected("text")


def test_an_unknown_event_is_skipped_and_a_wrong_shape_is_malformed() -> None:
    pieces = messages("text")
    assert decode([pieces[0], b'{"type": "response.audio.delta", "delta": "AAAA"}', *pieces[1:]])
    broken = decode([pieces[0], b'{"type": 5}'])
    assert broken[-1] == json.dumps({"type": "error", "error": "MalformedFrameError"})


def provider(base_url: str = "https://api.openai.com/v1", **fields: Any) -> Provider:
    return Provider(
        OpenAIRealtimeDialect(), base_url, "gpt-realtime", api_key=Secret(KEY), **fields
    )


def test_the_request_is_a_socket_and_three_kinds_of_client_event() -> None:
    request = TurnRequest(
        messages=[user("Say hello")],
        system_prompt="Be brief.",
        max_tokens=50,
        tools=[ToolSpec(name="get_weather", description="w", parameters={"type": "object"})],
    )
    http = OpenAIRealtimeDialect().build_request(request, provider())
    assert http.url == "wss://api.openai.com/v1/realtime?model=gpt-realtime"
    assert http.headers["authorization"] == f"Bearer {KEY}"
    assert http.body == b""
    events = [json.loads(m) for m in http.messages]
    assert [e["type"] for e in events] == [
        "session.update",
        "conversation.item.create",
        "response.create",
    ]
    session = events[0]["session"]
    assert session["type"] == "realtime"
    assert session["output_modalities"] == ["text"]
    assert session["instructions"] == "Be brief."
    assert session["max_output_tokens"] == 50
    assert session["tools"][0]["name"] == "get_weather"
    assert events[1]["item"] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Say hello"}],
    }
    assert KEY not in repr(http)


def test_the_beta_header_asks_for_the_beta_session_shape() -> None:
    beta = provider(headers={"OpenAI-Beta": "realtime=v1"})
    http = OpenAIRealtimeDialect().build_request(TurnRequest(messages=[user("x")]), beta)
    session = json.loads(http.messages[0])["session"]
    assert session == {"modalities": ["text"]}
    assert http.headers["OpenAI-Beta"] == "realtime=v1"


def test_the_registry_knows_the_kind() -> None:
    found = provider_from_env("openai-realtime", env={"OPENAI_API_KEY": KEY})
    assert isinstance(found.dialect, OpenAIRealtimeDialect)
    assert found.model == "gpt-realtime"
    assert found.api_key is not None
    assert found.api_key.reveal() == KEY


# --- a Realtime server on 127.0.0.1 -------------------------------------------------------------


@attrs.define
class Session:
    """What one client did: its handshake and the client events it sent."""

    path: str
    headers: dict[str, str]
    events: list[dict[str, Any]] = attrs.field(factory=list)
    closed_by_client: bool = False


@attrs.define
class RealtimeServer:
    """Answers session n with `script(n)`: the server messages to send once `response.create`
    came, or an int to refuse the handshake with that status; `cut` closes abnormally after
    that many messages."""

    script: Callable[[int], list[bytes] | int]
    cut: Callable[[int], int | None] = lambda n: None
    sessions: list[Session] = attrs.field(factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, request: trio_websocket.WebSocketRequest) -> None:
        n = len(self.sessions)
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        session = Session(request.path, headers)
        self.sessions.append(session)
        answer = self.script(n)
        if isinstance(answer, int):
            body = json.dumps({"error": {"message": "no", "type": "invalid_request_error"}})
            await request.reject(answer, body=body.encode())
            return
        ws = await request.accept()
        try:
            while True:
                event = json.loads(await ws.get_message())
                session.events.append(event)
                if event["type"] == "response.create":
                    break
            cut = self.cut(n)
            for i, message in enumerate(answer):
                if cut is not None and i == cut:
                    await ws.aclose(code=1011, reason="server error")
                    return
                await ws.send_message(message.decode())
            await ws.get_message()  # the session stays open until the client leaves
        except trio_websocket.ConnectionClosed:
            session.closed_by_client = True


@asynccontextmanager
async def realtime_server(
    script: Callable[[int], list[bytes] | int], **fields: Any
) -> AsyncIterator[RealtimeServer]:
    server = RealtimeServer(script, **fields)
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(
            trio_websocket.serve_websocket, server.handle, "127.0.0.1", 0, None
        )
        server.port = serving.port
        yield server
        nursery.cancel_scope.cancel()


REQUEST = TurnRequest(messages=[user("Say hello")])


async def test_a_turn_streams_over_a_real_websocket() -> None:
    async with realtime_server(lambda n: messages("text")) as server:
        with trio.fail_after(20):
            result = await run_turn(REQUEST, provider(server.base_url), limiter=RateLimiter())
    assert result.outcome is Outcome.COMPLETED
    assert result.text == "Hello! How can I help?"
    assert result.message.usage_metadata is not None
    assert result.message.usage_metadata.prompt_tokens == 25
    assert result.requests == 1
    (session,) = server.sessions
    assert session.path == "/v1/realtime?model=gpt-realtime"
    assert session.headers["authorization"] == f"Bearer {KEY}"
    assert [e["type"] for e in session.events] == [
        "session.update",
        "conversation.item.create",
        "response.create",
    ]
    assert session.closed_by_client  # the turn left once response.done came


async def test_an_explicit_websocket_upstream_carries_turns_too() -> None:
    async with (
        realtime_server(lambda n: messages("text_beta")) as server,
        open_websocket_upstream() as upstream,
    ):
        with trio.fail_after(20):
            first = await run_turn(REQUEST, provider(server.base_url), upstream=upstream)
            second = await run_turn(REQUEST, provider(server.base_url), upstream=upstream)
    assert first.text == second.text == "Hello! How can I help?"
    assert len(server.sessions) == 2


async def test_an_abnormal_close_is_retried_and_the_retry_completes() -> None:
    fast = Policy(random=lambda: 0.0, backoff_base=0.01)
    async with realtime_server(
        lambda n: messages("text"), cut=lambda n: 12 if n == 0 else None
    ) as server:
        with trio.fail_after(20):
            result = await run_turn(
                REQUEST, provider(server.base_url), policy=fast, limiter=RateLimiter()
            )
    assert result.outcome is Outcome.COMPLETED
    assert result.text == "Hello! How can I help?"
    assert result.requests == 2
    assert len(server.sessions) == 2


async def test_a_close_on_every_attempt_ends_as_a_transport_error() -> None:
    fast = Policy(random=lambda: 0.0, backoff_base=0.01, transport_retries=1, rescue=False)
    async with realtime_server(lambda n: messages("text"), cut=lambda n: 3) as server:
        with trio.fail_after(20):
            result = await run_turn(
                REQUEST, provider(server.base_url), policy=fast, limiter=RateLimiter()
            )
    assert result.outcome is Outcome.INIT_FAILED
    assert isinstance(result.error, TransportError)
    assert result.requests == 2


async def test_a_refused_handshake_is_the_dialects_error_and_not_retried() -> None:
    async with realtime_server(lambda n: 400) as server:
        with trio.fail_after(20):
            result = await run_turn(REQUEST, provider(server.base_url), limiter=RateLimiter())
    assert result.outcome is Outcome.INIT_FAILED
    assert isinstance(result.error, InvalidRequestError)
    assert result.requests == 1


async def test_an_error_event_ends_the_turn_without_retry() -> None:
    async with realtime_server(lambda n: messages("error")) as server:
        with trio.fail_after(20):
            result = await run_turn(REQUEST, provider(server.base_url), limiter=RateLimiter())
    assert isinstance(result.error, InvalidRequestError)
    assert result.requests == 1


async def test_a_silent_server_hits_the_initial_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    autojump_clock.autojump_threshold = 0.05  # real sockets, virtual deadlines
    silent = [b'{"type": "session.created", "session": {}}']  # then nothing
    policy = Policy(initial_event_timeout=5, transport_retries=0, rescue=False, random=lambda: 0.0)
    async with realtime_server(lambda n: silent) as server:
        result = await run_turn(
            REQUEST, provider(server.base_url), policy=policy, limiter=RateLimiter()
        )
    assert result.outcome is Outcome.EVENT_TIMEOUT
    assert result.total_time == pytest.approx(5, abs=0.2)


async def test_the_cli_runs_the_kind_against_the_local_server() -> None:
    async with realtime_server(lambda n: messages("text")) as server:
        env = {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": server.base_url, "PATH": "/usr/bin"}
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-m", "rillet", "run", "--provider", "openai-realtime", "hi"],
                capture_stdout=True,
                capture_stderr=True,
                env={**os.environ, **env},
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    assert "Hello! How can I help?" in done.stdout.decode()
    assert len(server.sessions) == 1
