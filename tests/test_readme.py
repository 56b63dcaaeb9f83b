"""The README as a new user copies it.

Every ```python block runs as written, in a subprocess, against the loopback provider on
127.0.0.1 (each provider's `*_API_KEY` / `*_BASE_URL` pointing at it), or against what the block
needs: the MCP server it starts itself, uvicorn serving its app, a rillet server for the OpenAI
SDK. Each check asserts what the text around its block promises: the output, the requests sent.
The command lines of the ```sh blocks run as shown, through `sh`, with `rillet` on the PATH
(`tests/test_readme_commands.py`); a line that is not run says why.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from rillet.frames import SSEDecoder
from rillet.providers import OpenAIChatDialect, Provider
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import open_loopback_provider, status_reply

from .readme_support import (
    ANTHROPIC_TEXT,
    TEXT,
    WAIT,
    blocks,
    bodies,
    fixture_text,
    provider_env,
    provider_reply,
    server_process,
)

if TYPE_CHECKING:
    import subprocess

    from rillet.transports.testing import RecordedRequest

PYTHON_BLOCKS = blocks("python")
ANTHROPIC = fixture_text(ANTHROPIC_TEXT)


async def run_python(
    code: str, cwd: Path, env: dict[str, str], *, python: str = sys.executable
) -> subprocess.CompletedProcess[bytes]:
    """`code` as a program of its own; it must exit 0."""
    done = await trio.run_process(
        [python, "-c", code],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done


async def run_against_provider(
    code: str, cwd: Path
) -> tuple[subprocess.CompletedProcess[bytes], list[RecordedRequest]]:
    async with open_loopback_provider(provider_reply) as provider:
        done = await run_python(code, cwd, provider_env(provider.url))
        return done, list(provider.requests)


# --- the checks, one per block, in the README's order -----------------------------------------


async def check_imports(code: str, tmp_path: Path) -> None:
    """Installing: the modules named exist and import cleanly."""
    done, requests = await run_against_provider(code, tmp_path)
    assert (done.stdout, done.stderr) == (b"", b"")
    assert requests == []
    import rillet

    assert rillet.__version__ == importlib.metadata.version("rillet")


async def check_embedding(code: str, tmp_path: Path) -> None:
    """The answer printed fragment by fragment, then the outcome and the usage."""
    done, requests = await run_against_provider(code, tmp_path)
    lines = done.stdout.decode().splitlines()
    assert lines[0] == ANTHROPIC
    assert lines[1].startswith("Completed UsageMetadata(")
    assert len(lines) == 2
    assert "TextDelta(" not in done.stdout.decode()  # the text, not the event objects
    (sent,) = bodies(requests)
    assert sent["max_tokens"] == 400
    assert sent["messages"][-1]["content"][0]["text"] == "Why is the sky blue?"
    # the same program with a key the provider refuses fails, saying why, and exits 1
    refusal = {"type": "error", "error": {"type": "authentication_error", "message": "invalid"}}
    async with open_loopback_provider([status_reply(401, body=refusal)]) as provider:
        failed = await trio.run_process(
            [sys.executable, "-c", code],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=provider_env(provider.url),
            cwd=tmp_path,
        )
    assert failed.returncode == 1
    assert "Completed" not in failed.stdout.decode()
    assert failed.stderr.decode() == (
        "rillet: authentication failed (401): invalid — check the API key (--api-key)\n"
    )


async def check_events(code: str, tmp_path: Path) -> None:
    """The run events' deltas, the outcome and attempts, a JSONL log, then the same turn as a
    block with reasoning."""
    done, requests = await run_against_provider(code, tmp_path)
    assert done.stdout.decode().splitlines() == [ANTHROPIC, "Completed 1", ANTHROPIC]
    assert len(requests) == 2
    log = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert log[0]["type"] == "run.started"
    assert log[-1]["type"] == "run.done"
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert "".join(e["delta"] for e in log if e["type"] == "answer.delta") == ANTHROPIC


async def check_agent(code: str, tmp_path: Path) -> None:
    """The agent offers both tools (schemas from the docstrings), runs the one called, sends
    its result back and prints the status and the answer; the backup is never asked."""
    done, requests = await run_against_provider(code, tmp_path)
    assert done.stdout.decode() == f"completed {ANTHROPIC}\n"
    assert [r.path for r in requests] == ["/v1/messages", "/v1/messages"]
    first, second = bodies(requests)
    assert first["system"] == "Be brief."
    tools = {t["name"]: t for t in first["tools"]}
    assert list(tools) == ["get_weather", "forget_city"]
    assert tools["get_weather"]["description"] == "Today's weather in a city."
    city = tools["get_weather"]["input_schema"]["properties"]["city"]
    assert city["description"] == "the city's name."
    assert tools["forget_city"]["description"] == "Remove a city from the saved list."
    results = [
        block
        for message in second["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert [r["tool_use_id"] for r in results] == ["toolu_1"]
    assert "sunny, 22 °C" in json.dumps(results[0]["content"], ensure_ascii=False)


async def sse_run_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The run events of a whole SSE response, each checked against its frame's id."""
    decoder = SSEDecoder()
    events: list[dict[str, Any]] = []
    async for chunk in response.aiter_bytes():
        for frame in decoder.feed(chunk):
            event = json.loads(frame.data)
            assert frame.id == str(event["seq"])
            events.append(event)
    return events


async def hang_up_after_first_delta(url: str, target: str) -> bytes:
    """GET `target` on a socket of its own, read until the first answer delta, hang up."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    received = bytearray()
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        while b'"answer.delta"' not in received:
            data = await stream.receive_some(65536)
            assert data, received
            received += data
    return bytes(received)


async def check_asyncio(code: str, tmp_path: Path) -> None:
    """The Starlette app under uvicorn streams a turn's run events as SSE, `id` the seq; a
    client that hangs up cancels the turn and closes the provider's response."""
    (tmp_path / "app.py").write_text(code, encoding="utf-8")
    argv = [sys.executable, "-m", "uvicorn", "app:app", "--port", "0"]
    async with open_loopback_provider(provider_reply) as provider:
        env = provider_env(provider.url)
        listening = rb"Uvicorn running on (http://127\.0\.0\.1:\d+)"
        async with (
            server_process(argv, env=env, cwd=tmp_path, listening=listening) as url,
            httpx.AsyncClient(base_url=url, timeout=None) as client,
        ):
            async with client.stream("GET", "/chat", params={"q": "Why?"}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                events = await sse_run_events(response)
            partial = await hang_up_after_first_delta(url, "/chat?q=hang+up")
            await provider.wait_connections_closed()  # the turn closed the provider's response
        sent = bodies(provider.requests)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "run.started"
    assert events[0]["provider"] == "anthropic"
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "completed"
    assert "".join(e["delta"] for e in events if e["type"] == "answer.delta") == ANTHROPIC
    assert partial.startswith(b"HTTP/1.1 200 ")
    assert b'"type":"run.started"' in partial
    assert [s["messages"][0]["content"][0]["text"] for s in sent] == ["Why?", "hang up"]


async def check_mcp(code: str, tmp_path: Path) -> None:
    """The example starts `python -m rillet.mcp --provider anthropic` itself, prints the run
    events' deltas, then the tool's answer: the same text."""
    done, requests = await run_against_provider(code, tmp_path)
    assert done.stdout.decode() == f"{ANTHROPIC}\n{ANTHROPIC}\n"
    (sent,) = bodies(requests)
    assert sent["model"] == "claude-sonnet-4-5"
    assert sent["messages"][-1]["content"][0]["text"] == "Why is the sky blue?"


async def run_against_server(
    code: str, tmp_path: Path, python: Path, served: str
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
    """An SDK's example run by `python` against a rillet server (its URL in the example is
    `served`) with a provider of OpenAI's wire behind it; what it printed, and what the
    provider was sent."""
    async with open_loopback_provider(provider_reply) as provider:
        upstream = Provider(OpenAIChatDialect(), f"{provider.url}/v1", "gpt-4.1-mini")
        config = ServerConfig(provider=upstream, port=0)
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve, config))
            assert served in code
            local = code.replace(served, url + served.removeprefix("http://127.0.0.1:8787"))
            done = await run_python(local, tmp_path, provider_env(provider.url), python=str(python))
            nursery.cancel_scope.cancel()
        (sent,) = bodies(provider.requests)
    return done, sent


async def check_openai_sdk(code: str, tmp_path: Path) -> None:
    """The OpenAI SDK, pointed at a rillet server, streams the server provider's answer."""
    from .server.test_openai_interop import sdk_python

    python = sdk_python()  # skips, saying why, when the SDK's virtualenv cannot be made
    done, sent = await run_against_server(code, tmp_path, python, "http://127.0.0.1:8787/v1")
    assert done.stdout.decode() == TEXT
    assert sent["model"] == "gpt-4.1-mini"
    assert sent["messages"] == [{"role": "user", "content": "Hello"}]
    assert sent["stream"] is True


async def check_openai_responses(code: str, tmp_path: Path) -> None:
    """The OpenAI SDK's Responses client, pointed at a rillet server, streams the server
    provider's answer (a provider of the Chat Completions wire)."""
    from .server.test_openai_interop import sdk_python

    python = sdk_python()  # skips, saying why, when the SDK's virtualenv cannot be made
    done, sent = await run_against_server(code, tmp_path, python, "http://127.0.0.1:8787/v1")
    assert done.stdout.decode() == TEXT
    assert sent["model"] == "gpt-4.1-mini"
    assert sent["messages"] == [{"role": "user", "content": "Hello"}]


async def check_anthropic_sdk(code: str, tmp_path: Path) -> None:
    """Anthropic's SDK, pointed at a rillet server, streams the answer of a provider of
    OpenAI's wire behind it."""
    from .server.test_anthropic_interop import sdk_python

    python = sdk_python()  # skips, saying why, when the SDK's virtualenv cannot be made
    done, sent = await run_against_server(code, tmp_path, python, "http://127.0.0.1:8787")
    assert done.stdout.decode() == TEXT
    assert sent["model"] == "gpt-4.1-mini"
    assert sent["messages"] == [{"role": "user", "content": "Hello"}]
    assert sent["max_completion_tokens"] == 1024


async def check_tracing(code: str, tmp_path: Path) -> None:
    """The attempt, then the turn holding it, then the application's own span around it."""
    done, requests = await run_against_provider(code, tmp_path)
    assert len(requests) == 1
    attempt, turn, outer = done.stdout.decode().splitlines()
    assert attempt == "attempt 1 None"
    name, tokens = turn.rsplit(" ", 1)
    assert name.startswith("chat claude")
    assert int(tokens) > 0
    assert outer == "answer a question None"


Check = Callable[[str, Path], Awaitable[None]]


async def check_cost(code: str, tmp_path: Path) -> None:
    """The usage by kind and its exact cost (the recorded reply: 12 input tokens, 27 output),
    and the reply capped at the tokens the rest of `max_cost` buys."""
    from decimal import Decimal

    done, requests = await run_against_provider(code, tmp_path)
    lines = done.stdout.decode().splitlines()
    assert lines[0] == (
        "completed TokenUsage(input=12, cache_read=0, cache_write=0, output=27, reasoning=None)"
    )
    assert Decimal(lines[1]) == (12 * Decimal(3) + 27 * Decimal(15)) / 10**6
    (sent,) = bodies(requests)
    assert 3000 < sent["max_tokens"] < Decimal("0.05") / Decimal(15) * 10**6  # what $0.05 buys


PYTHON_CHECKS: list[tuple[str, Check]] = [
    ("Installing", check_imports),
    ("Embedding it", check_embedding),
    ("Embedding it", check_events),
    ("Agents", check_agent),
    ("Tracing", check_tracing),
    ("From asyncio", check_asyncio),
    ("As an MCP server", check_mcp),
    ("The handler's defaults", check_cost),
    ("The server", check_openai_sdk),
    ("The server", check_openai_responses),
    ("The server", check_anthropic_sdk),
]


def test_every_python_block_of_the_readme_has_its_check() -> None:
    """A block added to the README must get its check here."""
    assert len(PYTHON_BLOCKS) == 11
    assert [title for title, _ in PYTHON_BLOCKS] == [title for title, _ in PYTHON_CHECKS]


@pytest.mark.slow
@pytest.mark.parametrize(
    "number",
    range(len(PYTHON_BLOCKS)),
    ids=[
        f"{n}-{PYTHON_CHECKS[n][1].__name__ if n < len(PYTHON_CHECKS) else 'unchecked'}"
        for n in range(len(PYTHON_BLOCKS))
    ],
)
async def test_each_python_block_runs_as_written_and_does_what_its_text_says(
    number: int, tmp_path: Path
) -> None:
    assert number < len(PYTHON_CHECKS), "a README block without a check in PYTHON_CHECKS"
    title, code = PYTHON_BLOCKS[number]
    expected_title, check = PYTHON_CHECKS[number]
    assert title == expected_title
    with trio.fail_after(WAIT):
        await check(code, tmp_path)
