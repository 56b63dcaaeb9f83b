"""Upstream transports of rillet's own: the handler speaks the `Upstream` protocol only; HTTP on
httpx, replay, in-memory and an application's own transport (a local process's stdout) all
carry a turn through the same pipeline."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import httpx
import pytest
import trio
import trio.testing
from rillet import (
    Outcome,
    Policy,
    RateLimiter,
    TransportError,
    TurnRequest,
    UpstreamError,
    encode_json,
    run_turn,
    user,
)
from rillet._turn import _handler as handler_module
from rillet.providers import AnthropicDialect, OpenAIChatDialect, Provider
from rillet.transports.replay import ReplayTransport
from rillet.transports.testing import openai_text_stream, split
from rillet.transports.upstream import HttpUpstream, MemoryExchange, MemoryReply, MemoryUpstream

from ..wire_cases import FIXTURES

if TYPE_CHECKING:
    from rillet._core._dialect import HttpRequest

REQUEST = TurnRequest(messages=[user("Say something")])
SSE = {"content-type": "text/event-stream"}
FRAGMENTS = ["Hello", ", ", "world", "."]


def provider() -> Provider:
    return Provider(OpenAIChatDialect(), "http://upstream.invalid/v1", "m")


def policy(**fields: object) -> Policy:
    base: dict[str, object] = {"random": lambda: 0.0, "wall_clock": lambda: 0.0}
    return Policy(**(base | fields))  # type: ignore[arg-type]


def test_the_handler_imports_no_http_client() -> None:
    tree = ast.parse(inspect.getsource(handler_module))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert "httpx" not in imported
    assert "h11" not in imported


async def test_a_memory_upstream_carries_a_whole_turn() -> None:
    stream = openai_text_stream(FRAGMENTS)
    upstream = MemoryUpstream([MemoryReply(split(stream, 9), headers=SSE)])
    result = await run_turn(REQUEST, provider(), upstream=upstream, limiter=RateLimiter())
    assert result.outcome is Outcome.COMPLETED
    assert result.text == "Hello, world."
    assert len(upstream.requests) == 1
    sent = upstream.requests[0]
    assert sent.url == "http://upstream.invalid/v1/chat/completions"
    assert json.loads(sent.body)["stream"] is True
    assert all(exchange.closed for exchange in upstream.exchanges)


async def test_a_transport_failure_is_retried_as_transport_shaped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream = openai_text_stream(FRAGMENTS)
    good = MemoryReply(split(stream, 9), headers=SSE)

    @attrs.define
    class Flaky(MemoryUpstream):
        async def open(self, request: HttpRequest) -> MemoryExchange:
            if not self.requests:
                self.requests.append(request)
                raise UpstreamError("ConnectError", "refused")
            return await super().open(request)

    upstream = Flaky([good])
    result = await run_turn(
        REQUEST, provider(), upstream=upstream, policy=policy(), limiter=RateLimiter()
    )
    assert result.outcome is Outcome.COMPLETED
    assert result.requests == 2
    assert result.text == "Hello, world."


async def test_an_upstream_error_ends_a_turn_as_a_transport_error() -> None:
    class Refusing:
        async def open(self, request: HttpRequest) -> object:
            raise UpstreamError("ConnectError", "refused")

        async def aclose(self) -> None:
            pass

    result = await run_turn(
        REQUEST,
        provider(),
        upstream=Refusing(),  # type: ignore[arg-type]
        policy=policy(transport_retries=0, rescue=False),
        limiter=RateLimiter(),
    )
    assert result.outcome is Outcome.INIT_FAILED
    assert isinstance(result.error, TransportError)
    assert result.error.kind == "ConnectError"


async def test_an_error_status_reaches_the_dialect_through_any_upstream() -> None:
    body = b'{"error": {"message": "bad", "type": "invalid_request_error"}}'
    upstream = MemoryUpstream(
        [MemoryReply([body], status=400, headers={"Content-Type": "application/json"})]
    )
    result = await run_turn(REQUEST, provider(), upstream=upstream, limiter=RateLimiter())
    assert result.outcome is Outcome.INIT_FAILED
    assert result.requests == 1  # permanent: never retried
    assert "bad" in str(result.error)


async def test_the_rescue_goes_through_the_upstream_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Rescued."},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    upstream = MemoryUpstream(
        [
            MemoryReply([b"data: {not json\n\n"], headers=SSE),
            MemoryReply([body], headers={"content-type": "application/json"}),
        ]
    )
    result = await run_turn(
        REQUEST, provider(), upstream=upstream, policy=policy(transport_retries=0)
    )
    assert result.outcome is Outcome.RESCUED
    assert result.text == "Rescued."
    assert json.loads(upstream.requests[1].body).get("stream") in (None, False)


async def test_replay_as_an_upstream_matches_replay_through_httpx() -> None:
    path = FIXTURES / "anthropic-messages" / "tool_use.sse"
    prov = Provider(AnthropicDialect(), "http://replay.invalid", "replay")
    fast = Policy(transport_retries=0, rescue=False)
    direct = await run_turn(
        REQUEST, prov, upstream=ReplayTransport(path, chunk_size=7), policy=fast
    )
    transport = ReplayTransport(path, chunk_size=7)
    async with httpx.AsyncClient(transport=transport) as client:
        via_httpx = await run_turn(REQUEST, prov, client=client, policy=fast)
    assert direct.outcome is via_httpx.outcome is Outcome.COMPLETED
    assert [encode_json(i) for i in direct.message.content_items] == [
        encode_json(i) for i in via_httpx.message.content_items
    ]
    assert transport.requests == 1


async def test_a_caller_client_is_wrapped_and_left_open() -> None:
    stream = openai_text_stream(FRAGMENTS)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=stream)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    async with client:
        result = await run_turn(REQUEST, provider(), client=client, limiter=RateLimiter())
        assert result.text == "Hello, world."
        assert not client.is_closed


async def test_an_own_http_upstream_closes_its_client() -> None:
    upstream = HttpUpstream()
    assert upstream.owns_client
    await upstream.aclose()
    assert upstream.client.is_closed
    borrowed = HttpUpstream.wrapping(httpx.AsyncClient())
    await borrowed.aclose()
    assert not borrowed.client.is_closed
    await borrowed.client.aclose()


async def test_a_cancelled_turn_closes_its_exchange(autojump_clock: trio.testing.MockClock) -> None:
    stream = openai_text_stream(FRAGMENTS)
    upstream = MemoryUpstream([MemoryReply(split(stream, 9), headers=SSE, delay=1.0)])
    with trio.move_on_after(2.5):
        await run_turn(REQUEST, provider(), upstream=upstream, limiter=RateLimiter())
    assert upstream.exchanges
    assert upstream.exchanges[0].closed


# --- an application's own transport: a model served by a local process on its stdout -----------


@attrs.define
class ProcessExchange:
    """A child process's stdout as the reply; killing the process ends the exchange."""

    process: trio.Process
    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=lambda: dict(SSE))

    async def receive(self) -> bytes:
        assert self.process.stdout is not None
        try:
            return bytes(await self.process.stdout.receive_some(65536))
        except trio.ClosedResourceError as exc:
            raise UpstreamError("ClosedResourceError") from exc

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            assert self.process.stdout is not None
            await self.process.stdout.aclose()


@attrs.define
class ProcessUpstream:
    """Runs `script` with the request's body on its command line; its stdout is the reply."""

    script: str
    exchanges: list[ProcessExchange] = attrs.field(factory=list)

    async def open(self, request: HttpRequest) -> ProcessExchange:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", self.script, request.body.decode()],
            stdout=subprocess.PIPE,
        )
        exchange = ProcessExchange(process)
        self.exchanges.append(exchange)
        return exchange

    async def aclose(self) -> None:
        pass


SERVE = """
import json, sys
words = json.loads(sys.argv[1])["messages"][0]["content"].split()
from rillet.transports.testing import openai_text_stream
sys.stdout.buffer.write(openai_text_stream([w + " " for w in words]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX child process")
async def test_a_user_defined_transport_serves_a_turn_from_a_local_process() -> None:
    upstream = ProcessUpstream(SERVE)
    request = TurnRequest(messages=[user("echo these four words")])
    result = await run_turn(request, provider(), upstream=upstream, limiter=RateLimiter())
    assert result.outcome is Outcome.COMPLETED
    assert result.text == "echo these four words "
    assert upstream.exchanges[0].process.returncode is not None
