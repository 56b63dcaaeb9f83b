"""The README's command lines, run as shown: through `sh`, with the installed `rillet` first on
the PATH, each provider's `*_API_KEY` / `*_BASE_URL` pointing at the loopback provider, stdin a
pipe (not a terminal) and the working directory a scratch one holding `prompt.txt` and `tests/`.
Each check asserts what the line's comment and text promise. A line that is not run here says
why (and where it is run instead); a line added to the README must be added to `COMMANDS`.
And the README's tables of defaults, read against the code's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import rillet
import trio
from rillet import Policy
from rillet.transports.server import Limits
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    Script,
    fixture_reply,
    open_loopback_provider,
    status_reply,
)

from .cli.test_cli_agents import ANSWER, tool_messages
from .readme_support import (
    ANTHROPIC_TEXT,
    FIXTURES,
    GEMINI_TEXT,
    KEYS,
    ROOT,
    TEXT,
    WAIT,
    bodies,
    command_lines,
    fixture_text,
    provider_env,
    provider_reply,
    sections,
    server_process,
)

if TYPE_CHECKING:
    from pathlib import Path

PROMPT = "Why is the sky blue?\n"
Done = subprocess.CompletedProcess[bytes]
Check = Callable[[Done, list[RecordedRequest]], None]


def _events(done: Done) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def check_question(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == TEXT + "\n"
    (sent,) = bodies(requests)
    assert requests[0].path == "/v1/chat/completions"
    assert sent["model"] == "gpt-4.1-mini"  # openai's default model
    assert sent["messages"] == [{"role": "user", "content": "question"}]
    assert sent["stream"] is True


def check_gemini_from_stdin(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == fixture_text(GEMINI_TEXT) + "\n"
    (sent,) = bodies(requests)
    assert requests[0].path.startswith("/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert sent["contents"][0]["parts"][0]["text"].strip() == PROMPT.strip()
    assert "thinkingConfig" in sent["generationConfig"]


def check_jsonl(done: Done, requests: list[RecordedRequest]) -> None:
    events = _events(done)
    assert events[0]["type"] == "run.started"
    assert events[-1] == {**events[-1], "type": "run.done", "status": "completed"}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert "".join(e["delta"] for e in events if e["type"] == "answer.delta") == TEXT


def check_uni_jsonl(done: Done, requests: list[RecordedRequest]) -> None:
    events = _events(done)
    assert events[-1]["event_type"] == "stop"
    assert {e["role"] for e in events} == {"assistant"}
    items = [i for e in events for i in e["content_items"]]
    assert "".join(i["text"] for i in items if i["type"] == "text.delta") == TEXT


def check_no_stream(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == TEXT + "\n"
    (sent,) = bodies(requests)
    assert sent.get("stream") is False


def check_weather_tool(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == "".join(ANSWER) + "\n"
    assert '⚙ get_weather(city="Paris") … done ' in done.stderr.decode()
    assert len(requests) == 2
    assert tool_messages(requests[1]) == ["18 °C, light rain in Paris"]


def check_approval_without_input(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.returncode == 3
    events = _events(done)
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "approval_required"
    asked = [e for e in events if e["type"] == "approval.required"]
    assert [e["name"] for e in asked] == ["delete_file"]
    assert len(requests) == 1  # the tool never ran, so no second step


def check_fallback(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == fixture_text(ANTHROPIC_TEXT) + "\n"
    paths = [r.path for r in requests]
    assert paths[-1] == "/v1/messages"  # anthropic, the chain's next provider, answered
    assert set(paths[:-1]) == {"/v1/chat/completions"}  # openai failed first, retries and all
    assert "gpt-4o-mini" not in {b.get("model") for b in bodies(requests)}  # never needed


def check_replay(done: Done, requests: list[RecordedRequest]) -> None:
    wire = FIXTURES / "anthropic-messages" / "tool_use.sse"
    assert done.stdout.decode() == fixture_text(wire) + "\n"
    assert "→ calling get_weather" in done.stderr.decode()
    assert requests == []


def check_providers(done: Done, requests: list[RecordedRequest]) -> None:
    out = done.stdout.decode()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert {"openai", "anthropic", "gemini", "ollama", "mmsp"} <= set(rows)
    for kind, masked in (("openai", "…cdef"), ("anthropic", "…6789")):
        assert masked in rows[kind]
        assert rows[kind].endswith("ready")
    assert not any(key in out for key in KEYS.values())  # keys masked
    assert requests == []


def check_version(done: Done, requests: list[RecordedRequest]) -> None:
    assert done.stdout.decode() == f"rillet {rillet.__version__}\n"


def _openai_fails(request: RecordedRequest, number: int) -> Reply:
    if request.path == "/v1/chat/completions":
        return status_reply(500)
    return fixture_reply(ANTHROPIC_TEXT)


# each line of the README's ```sh blocks: its check (and the provider's script), or why not here
COMMANDS: dict[str, tuple[Check, Script] | str] = {
    "make demo": "runs until Ctrl-C; tests/cli/test_cli.py runs `rillet demo --keep-serving`",
    "make test": "the whole suite, this file included",
    "pip install rillet": "installs from the package index",
    "pip install 'rillet[redis]'": "installs from the package index",
    "pip install 'rillet[mcp]'": "installs from the package index",
    "pip install 'rillet[metrics]'": "installs from the package index",
    "pip install 'rillet[otel]'": "installs from the package index",
    "pip install 'rillet[azure]'": "installs from the package index",
    'rillet run "weather in Paris?" --tools demo': (check_weather_tool, provider_reply),
    'rillet run "delete notes.txt" --tools demo': (
        "asks on a terminal: tests/cli/test_cli_agents.py answers it on a pty"
    ),
    'rillet run "delete notes.txt" --tools demo --no-input --output jsonl': (
        check_approval_without_input,
        provider_reply,
    ),
    "rillet serve --tools demo": "test_serve_tools_demo_and_the_curl_line_answer_an_approval",
    'curl -s localhost:8787/v1/runs -H "content-type: application/json" -d '
    '\'{"messages": [{"role": "user", "content": "Hi"}]}\'': (
        "test_the_runs_api_curl_line_starts_a_run"
    ),
    "curl -X POST localhost:8787/v1/runs/$RUN/approvals/$APPROVAL -H "
    '"authorization: Bearer $ACT_TOKEN" -H "content-type: application/json" -d '
    "'{\"approve\": true}'": "test_serve_tools_demo_and_the_curl_line_answer_an_approval",
    "python -m rillet.mcp --provider anthropic": "the MCP example in tests/test_readme.py starts "
    "exactly this server",
    'rillet run "question"': (check_question, provider_reply),
    "rillet run - < prompt.txt --provider gemini --model gemini-2.5-flash --thinking low": (
        check_gemini_from_stdin,
        provider_reply,
    ),
    'rillet run "question" --output jsonl': (check_jsonl, provider_reply),
    'rillet run "question" --output uni-jsonl': (check_uni_jsonl, provider_reply),
    'rillet run "question" --no-stream': (check_no_stream, provider_reply),
    'rillet run "question" --fallback anthropic,openai:gpt-4o-mini': (
        check_fallback,
        _openai_fails,
    ),
    "rillet serve": "runs until Ctrl-C; tests/server/test_server.py serves the same config",
    "rillet replay tests/fixtures/providers/anthropic-messages/tool_use.sse": (
        check_replay,
        provider_reply,
    ),
    "rillet providers": (check_providers, provider_reply),
    "rillet demo": "takes seconds of paced turns; tests/cli/test_cli.py runs it to completion",
    "rillet bench --quick": "the benchmarks take minutes; tests/cli/test_bench_cli.py runs a "
    "smaller run of the same command",
    "rillet --version": (check_version, provider_reply),
}
RUN = [line for line, check in COMMANDS.items() if not isinstance(check, str)]


def test_every_command_line_of_the_readme_is_checked_or_says_why_not() -> None:
    found = [line for _, line in command_lines()]
    assert sorted(set(found)) == sorted(COMMANDS)
    assert len(RUN) == 11


async def run_line(line: str, script: Script, cwd: Path) -> tuple[Done, list[RecordedRequest]]:
    (cwd / "prompt.txt").write_text(PROMPT, encoding="utf-8")
    (cwd / "tests").symlink_to(ROOT / "tests")
    async with open_loopback_provider(script) as provider:
        done = await trio.run_process(
            ["sh", "-c", line],
            stdin=b"",  # a pipe, not a terminal
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=provider_env(provider.url),
            cwd=cwd,
        )
        return done, list(provider.requests)


@pytest.mark.slow
@pytest.mark.parametrize("line", RUN)
async def test_each_command_line_does_what_its_comment_says(line: str, tmp_path: Path) -> None:
    entry = COMMANDS[line]
    assert not isinstance(entry, str)
    check, script = entry
    with trio.fail_after(WAIT):
        done, requests = await run_line(line, script, tmp_path)
    if done.returncode != 3:  # the one line whose promise is exit code 3
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    check(done, requests)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's line needs curl")
async def test_serve_tools_demo_and_the_curl_line_answer_an_approval(tmp_path: Path) -> None:
    (curl,) = [line for _, line in command_lines() if line.startswith("curl -X POST")]
    argv = ["rillet", "serve", "--tools", "demo", "--port", "0"]  # the README's, on a free port
    with trio.fail_after(WAIT):
        async with open_loopback_provider(provider_reply) as provider:
            env = provider_env(provider.url)
            argv[0] = shutil.which("rillet", path=env["PATH"]) or "rillet"
            listening = rb"serving on (http://127\.0\.0\.1:\d+)"
            async with (
                server_process(argv, env=env, cwd=tmp_path, listening=listening) as url,
                httpx.AsyncClient(base_url=url, timeout=None) as client,
            ):
                run = (await client.post("/v1/runs", json={"prompt": "delete notes.txt"})).json()
                approval = await _approval_id(client, run)
                port = url.rsplit(":", 1)[1]
                line = curl.replace("localhost:8787", f"127.0.0.1:{port}")
                env.update(RUN=run["run_id"], APPROVAL=approval, ACT_TOKEN=run["act_token"])
                first, again = [
                    await trio.run_process(["sh", "-c", line], capture_stdout=True, env=env)
                    for _ in range(2)
                ]
                events = await _all_events(client, run)
    assert json.loads(first.stdout)["decision"] == "approved"
    assert json.loads(again.stdout)["error"]["type"] == "approval_not_waiting"  # the 409
    types = [e["type"] for e in events]
    assert types.index("approval.resolved") < types.index("tool.completed")
    assert events[-1]["status"] == "completed"
    assert "".join(e["delta"] for e in events if e["type"] == "answer.delta") == "".join(ANSWER)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's line needs curl")
async def test_the_runs_api_curl_line_starts_a_run(tmp_path: Path) -> None:
    (curl,) = [line for _, line in command_lines() if line.startswith("curl -s")]
    with trio.fail_after(WAIT):
        async with open_loopback_provider(provider_reply) as provider:
            env = provider_env(provider.url)
            argv = [shutil.which("rillet", path=env["PATH"]) or "rillet", "serve", "--port", "0"]
            listening = rb"serving on (http://127\.0\.0\.1:\d+)"
            async with (
                server_process(argv, env=env, cwd=tmp_path, listening=listening) as url,
                httpx.AsyncClient(base_url=url, timeout=None) as client,
            ):
                line = curl.replace("localhost:8787", f"127.0.0.1:{url.rsplit(':', 1)[1]}")
                done = await trio.run_process(["sh", "-c", line], capture_stdout=True, env=env)
                run = json.loads(done.stdout)
                events = await _all_events(client, run)
    assert {"run_id", "token", "act_token", "events_url", "ws_url"} <= set(run)
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "completed"
    sent = json.loads(provider.requests[0].body)
    assert sent["messages"][-1] == {"role": "user", "content": "Hi"}


async def _approval_id(client: httpx.AsyncClient, run: dict[str, str]) -> str:
    while True:
        for event in await _events_so_far(client, run):
            if event["type"] == "approval.required":
                return str(event["approval_id"])
        await trio.sleep(0.05)


async def _events_so_far(client: httpx.AsyncClient, run: dict[str, str]) -> list[Any]:
    """The run's events up to now: its SSE log, read until the server has sent what it holds."""
    events: list[Any] = []
    with trio.move_on_after(0.5):
        async with client.stream("GET", run["events_url"]) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
    return events


async def _all_events(client: httpx.AsyncClient, run: dict[str, str]) -> list[Any]:
    reply = await client.get(run["events_url"])  # the whole run, once it is done
    return [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]


# --- the tables ---------------------------------------------------------------------------------


def _table(title: str) -> dict[str, str]:
    (text,) = [text for t, text in sections() if t == title]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", text, flags=re.MULTILINE)
    return {name: value for name, value in rows if not set(name) <= {"-", "|"}}


def test_the_handlers_defaults_table_is_policys_defaults() -> None:
    p = Policy()
    rows = _table("The handler's defaults")
    deadlines = (
        f"{p.initial_event_timeout:g} s to the first event, {p.per_event_timeout:g} s between "
        f"events, {p.total_timeout:g} s in all"
    )
    assert rows["deadlines"] == deadlines
    assert rows["consecutive timeouts"] == (
        f"{p.max_consecutive_timeouts} ({p.max_empty_timeouts} while no event ever came)"
    )
    (transport,) = [v for k, v in rows.items() if k.startswith("transport retries")]
    assert transport == (
        f"{p.transport_retries}, backoff {p.backoff_base:g} s doubling to {p.backoff_max:g} s, "
        f"jitter {p.jitter * 100:g} %"
    )
    (limited,) = [v for k, v in rows.items() if k.startswith("rate-limit retries")]
    assert limited.startswith(f"{p.rate_limit_retries}, ")
    assert f"else {p.retry_after_default:g} s; at most {p.retry_after_max:g} s" in limited
    assert p.rescue
    assert rows["rescue"] == "one non-streaming request when streaming is hopeless"
    assert p.requests_per_minute == 0
    assert rows["proactive limiter"].startswith("off;")
    assert rows["channels between actors"].startswith(f"{p.channel_size} items (1..1024)")
    assert [Policy(channel_size=n).channel_size for n in (1, 1024)] == [1, 1024]
    for outside in (0, 1025):
        with pytest.raises(ValueError, match="channel_size"):
            Policy(channel_size=outside)
    assert rows["frame cap (one incoming frame)"] == f"{p.max_frame // 2**20} MiB"


def test_the_approval_timeout_named_is_the_servers_default() -> None:
    (agents,) = [text for t, text in sections() if t == "Agents"]
    assert f"`Limits.approval_timeout` ({Limits().approval_timeout:g} s)" in agents
