"""`rillet run --tools demo`, as a user runs it: a subprocess against the loopback provider,
whose script calls a tool and then answers with what the tool said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    refused_url,
    sse,
)

from .test_cli import ROOT, _env

if TYPE_CHECKING:
    from rillet.transports.testing import RecordedRequest

ANSWER = ["It is 18 °C", " in Paris."]


def calls(name: str, arguments: dict[str, Any], *, said: str = "") -> bytes:
    """An OpenAI Chat stream that calls one tool (id `call_1`), after saying `said`."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    frames = [chunk({"role": "assistant", "content": said}), chunk({"tool_calls": [call]})]
    frames.append(chunk({}, "tool_calls"))
    return sse(*frames) + sse("[DONE]")


def tool_then_answer(name: str, arguments: dict[str, Any], *, delay: float = 0.0) -> Any:
    """A script: a request with no tool result gets the call, one with a result the answer
    (`delay` seconds between its chunks)."""

    def reply(request: RecordedRequest, n: int) -> Reply:
        del n
        if b'"role":"tool"' in request.body.replace(b" ", b""):
            stream = openai_text_stream(ANSWER)
            frames = tuple(f + b"\n\n" for f in stream.split(b"\n\n") if f)
            return Reply(chunks=frames, chunk_delay=delay)
        return Reply(chunks=(calls(name, arguments),))

    return reply


def tool_messages(request: RecordedRequest) -> list[str]:
    body = json.loads(request.body)
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def cli(
    args: list[str], url: str, *, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "rillet", "run", *args, "--provider", f"{url}/v1", "--model", "m"]
    return await trio.run_process(
        cmd,
        stdin=stdin,  # a pipe: not a terminal, so no one can be asked
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=_env(),
        cwd=ROOT,
    )


async def test_tools_demo_runs_the_tool_and_answers_with_its_result() -> None:
    script = tool_then_answer("get_weather", {"city": "Paris"})
    async with open_loopback_provider(script) as provider:
        done = await cli(["weather in Paris?", "--tools", "demo"], provider.url)
        requests = list(provider.requests)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(ANSWER) + "\n"
    assert len(requests) == 2
    assert tool_messages(requests[1]) == ["18 °C, light rain in Paris"]
    offered = [t["function"]["name"] for t in json.loads(requests[0].body)["tools"]]
    assert offered == ["get_weather", "get_time", "delete_file"]
    err = done.stderr.decode()
    assert '⚙ get_weather(city="Paris") … done ' in err
    assert "step (attempt" not in err  # a new step is not news


async def test_tools_jsonl_ends_with_run_done_and_carries_the_tool_run() -> None:
    script = tool_then_answer("get_time", {"timezone": "Asia/Tokyo"})
    async with open_loopback_provider(script) as provider:
        done = await cli(["time?", "--tools", "demo", "--output", "jsonl"], provider.url)
        requests = list(provider.requests)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "run.started"
    assert types.index("tool.started") < types.index("tool.completed") < types.index("answer.done")
    assert events[-1] == {**events[-1], "type": "run.done", "status": "completed"}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert tool_messages(requests[1]) == ["2026-06-01 21:00 (Asia/Tokyo, UTC+0900)"]
    assert "⚙" not in done.stderr.decode()  # the tool lines are text mode's


@pytest.mark.parametrize("flags", [[], ["--no-input"]])
async def test_an_approval_with_no_one_to_ask_ends_with_exit_3(flags: list[str]) -> None:
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    async with open_loopback_provider(script) as provider:
        args = ["tidy up", "--tools", "demo", "--output", "jsonl", *flags]
        done = await cli(args, provider.url)
        requests = list(provider.requests)
    assert done.returncode == 3, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "approval_required"
    assert [e["name"] for e in events if e["type"] == "approval.required"] == ["delete_file"]
    assert "tool.started" not in [e["type"] for e in events]  # it never ran
    assert len(requests) == 1
    err = done.stderr.decode()
    assert "delete_file needs approval and there is no one to ask" in err
    assert "Traceback" not in err


async def test_no_input_in_text_mode_words_the_deferred_approval_once() -> None:
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    async with open_loopback_provider(script) as provider:
        done = await cli(["tidy up", "--tools", "demo", "--no-input"], provider.url)
    assert done.returncode == 3
    err = done.stderr.decode()
    assert err.count("needs approval") == 1
    assert "error: approval_required" not in err


def _on_a_terminal(cmd: list[str], answer: bytes) -> tuple[int, bytes, bytes]:
    """Run `cmd` with a pty as its controlling terminal (stdin and stderr); type `answer`
    once it asks. Its exit code, stdout, and what the terminal showed."""
    import fcntl
    import pty
    import select
    import termios

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        cmd,
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=_env(),
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(follower)
    seen = b""
    try:
        answered = False
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                raise AssertionError(f"no prompt: {seen!r}")
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(leader, answer)
                answered = True
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        os.close(leader)
    return proc.returncode, out, seen


@pytest.mark.parametrize(("answer", "ran"), [(b"y\n", True), (b"\n", False)])
async def test_on_a_terminal_the_approval_is_a_y_n_question(answer: bytes, ran: bool) -> None:
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    async with open_loopback_provider(script) as provider:
        cmd = [sys.executable, "-m", "rillet", "run", "tidy up", "--tools", "demo"]
        cmd += ["--provider", f"{provider.url}/v1", "--model", "m"]
        code, out, seen = await trio.to_thread.run_sync(_on_a_terminal, cmd, answer)
        requests = list(provider.requests)
    assert code == 0, seen
    assert out.decode() == "".join(ANSWER) + "\n"
    assert b'delete_file(path="notes.txt") needs your approval' in seen
    results = tool_messages(requests[1])
    if ran:
        assert results == ["pretended to delete notes.txt (the demo deletes nothing)"]
        assert "… done".encode() in seen
    else:
        assert results[0].startswith("denied: the user did not allow this call")
        assert "… denied".encode() in seen


async def test_fallback_answers_when_the_first_provider_is_down() -> None:
    script = [Reply(chunks=(openai_text_stream(ANSWER),))]
    async with open_loopback_provider(script) as provider:
        cmd = [sys.executable, "-m", "rillet", "run", "hi", "--retries", "0", "--no-rescue"]
        cmd += ["--provider", f"{refused_url()}/v1", "--model", "m"]
        cmd += ["--fallback", f"{provider.url}/v1:backup-model", "--output", "jsonl"]
        done = await trio.run_process(
            cmd, stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=_env()
        )
        requests = list(provider.requests)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert "fallback" in [e.get("phase") for e in events if e["type"] == "status"]
    assert events[-1]["status"] == "completed"
    assert json.loads(requests[0].body)["model"] == "backup-model"


async def test_fallback_chains_an_agent_run_too() -> None:
    script = tool_then_answer("get_weather", {"city": "Paris"})
    async with open_loopback_provider(script) as provider:
        cmd = [sys.executable, "-m", "rillet", "run", "hi", "--retries", "0", "--tools", "demo"]
        cmd += ["--provider", f"{refused_url()}/v1", "--model", "m", "--no-rescue"]
        cmd += ["--fallback", f"{provider.url}/v1:backup-model"]
        done = await trio.run_process(
            cmd, stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=_env()
        )
        requests = list(provider.requests)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(ANSWER) + "\n"
    assert [json.loads(r.body)["model"] for r in requests] == ["backup-model"] * 2


def test_the_chain_names_a_model_after_the_last_colon_of_a_url() -> None:
    from rillet._cli._agent import parse_chain

    assert parse_chain("anthropic,openai:gpt-4o") == [("anthropic", None), ("openai", "gpt-4o")]
    assert parse_chain("http://127.0.0.1:8000/v1:m, http://h:8000") == [
        ("http://127.0.0.1:8000/v1", "m"),
        ("http://h:8000", None),
    ]
    assert parse_chain(" , ") == []


async def test_help_documents_the_new_options_and_exit_3() -> None:
    done = await trio.run_process(
        [sys.executable, "-m", "rillet", "run", "--help"], capture_stdout=True, env=_env()
    )
    text = " ".join(done.stdout.decode().split())
    for option in ("--tools {demo}", "--fallback PROVIDER[:MODEL],...", "--no-input"):
        assert option in text
    done = await trio.run_process(
        [sys.executable, "-m", "rillet", "--help"], capture_stdout=True, env=_env()
    )
    assert "3 approval required" in " ".join(done.stdout.decode().split())


@pytest.mark.slow
async def test_the_demo_runs_a_tool_and_one_that_needs_approval() -> None:
    cmd = [sys.executable, "-m", "rillet", "demo", "--fast"]
    done = await trio.run_process(
        cmd, stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=_env(), cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert '⚙ get_weather(city="Paris") … done ' in err
    assert 'the demo approves delete_file(path="notes.txt")' in err
    assert '⚙ delete_file(path="notes.txt") … done ' in err
    assert "all turns completed" in err
    out = done.stdout.decode()
    assert "It is 18 °C in Paris with light rain" in out
    assert "The tool says: pretended to delete notes.txt (the demo deletes nothing)." in out


async def test_the_demo_page_runs_agents_with_the_demo_tools() -> None:
    import httpx
    from rillet._cli._demo import _script, _start_page
    from rillet._core._dialect import Provider
    from rillet.providers import OpenAIChatDialect
    from rillet.transports.testing import open_loopback_provider

    async with open_loopback_provider(_script(0.0)) as embedded, trio.open_nursery() as nursery:
        chat = Provider(OpenAIChatDialect(), embedded.url + "/v1", "gpt-demo")
        page = await _start_page(nursery, chat, 0)
        assert page is not None
        async with httpx.AsyncClient(base_url=page, timeout=20) as client:
            run = (await client.post("/v1/runs", json={"prompt": "weather in Tokyo?"})).json()
            events = []
            async with client.stream("GET", run["events_url"]) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
        nursery.cancel_scope.cancel()
    started = [e for e in events if e["type"] == "tool.started"]
    assert [(e["name"], e["arguments"]) for e in started] == [("get_weather", {"city": "Tokyo"})]
    text = "".join(e["delta"] for e in events if e["type"] == "answer.delta")
    assert text == "The tool says: 24 °C, clear in Tokyo."
    assert events[-1]["status"] == "completed"


async def test_a_failed_step_is_one_line_with_its_cause_and_exit_1() -> None:
    from rillet.transports.testing import status_reply

    script = [status_reply(400, body={"error": {"message": "bad tools", "type": "invalid"}})]
    async with open_loopback_provider(script) as provider:
        done = await cli(["hi", "--tools", "demo", "--output", "jsonl"], provider.url)
    assert done.returncode == 1
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "error"
    lines = [line for line in done.stderr.decode().splitlines() if line.startswith("rillet: ")]
    assert len(lines) == 1
    assert "400" in lines[0]


async def test_max_steps_stops_a_model_that_only_calls_tools() -> None:
    script = [Reply(chunks=(calls("get_time", {"timezone": "UTC"}),))] * 3
    async with open_loopback_provider(script) as provider:
        done = await cli(["hi", "--tools", "demo", "--max-steps", "2"], provider.url)
        requests = list(provider.requests)
    assert done.returncode == 1
    assert len(requests) == 2
    assert "the agent made 2 model requests without an answer" in done.stderr.decode()


async def test_an_agents_answer_the_content_filter_cut_partway_says_so_and_fails() -> None:
    cut = openai_text_stream(["The weather ", "is"], finish_reason="content_filter")
    async with open_loopback_provider([Reply(chunks=(cut,))]) as provider:
        done = await cli(["weather?", "--tools", "demo"], provider.url)
    assert done.returncode == 1
    assert done.stdout.decode().strip() == "The weather is"
    lines = [line for line in done.stderr.decode().splitlines() if line.startswith("rillet: ")]
    assert lines == [
        "rillet: the provider's content rules stopped the answer partway (content_filter): "
        "what is shown is incomplete — rephrase the request"
    ]


async def test_ctrl_c_at_the_question_ends_its_line_before_saying_cancelled() -> None:
    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    async with open_loopback_provider(script) as provider:
        cmd = [sys.executable, "-m", "rillet", "run", "tidy up", "--tools", "demo"]
        cmd += ["--provider", f"{provider.url}/v1", "--model", "m"]
        code, _, seen = await trio.to_thread.run_sync(_on_a_terminal, cmd, b"\x03")
    assert code == 130, seen
    shown = seen.decode(errors="replace").replace("\r\n", "\n")
    question = next(line for line in shown.split("\n") if "[y/N]" in line)
    assert "cancelled" not in question  # not `… run it? [y/N] ^Ccancelled`
    assert any(line.strip() == "cancelled" for line in shown.split("\n")), shown
