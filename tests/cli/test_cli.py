"""The command line, as a user runs it: a subprocess against the loopback provider."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    split,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent.parent
FRAGMENTS = ["Hello", " from", " the", " loopback", " 👋"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(extra)
    return env


async def _run_cli(args: list[str], url: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`rillet ARGS` against the OpenAI-compatible server at `url`, model `m`."""
    return await _rillet(*args, "--provider", f"{url}/v1", "--model", "m", **env)


async def test_run_streams_the_answer_to_stdout() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(FRAGMENTS) + "\n"


async def test_jsonl_output_parses_line_by_line_and_ends_in_run_done() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--output", "jsonl"], provider.url)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert events[0]["type"] == "run.started"
    assert events[-1]["type"] == "run.done"
    assert events[-1]["status"] == "completed"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert "".join(e["delta"] for e in events if e["type"] == "answer.delta") == "".join(FRAGMENTS)


async def test_uni_jsonl_output_is_the_mmsp_stream() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--output", "uni-jsonl"], provider.url)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert events[-1]["event_type"] == "stop"
    items = [e["content_items"][0] for e in events[:-1]]
    assert [i["type"] for i in items] == ["text.delta"] * 5 + ["text.done"]


@pytest.mark.parametrize("output", ["text", "jsonl"])
async def test_an_answer_the_content_filter_cut_partway_says_so_and_fails(output: str) -> None:
    # Azure OpenAI stops a stream its content filter flags after some text has gone out
    body = openai_text_stream(FRAGMENTS[:2], finish_reason="content_filter")
    async with open_loopback_provider([Reply(chunks=split(body, 16))]) as provider:
        done = await _run_cli(["run", "hi", "--output", output], provider.url)
    assert done.returncode == 1
    shown = done.stdout.decode()
    if output == "jsonl":
        events = [json.loads(line) for line in shown.splitlines()]
        shown = "".join(e["delta"] for e in events if e["type"] == "answer.delta")
        answered = next(e for e in events if e["type"] == "answer.done")
        assert answered["filtered"] is True  # a reader of the run events is told too
        assert answered["finish_reason"] == "unknown"
    assert shown.strip() == "".join(FRAGMENTS[:2])  # what came stays shown
    assert done.stderr.decode().strip().splitlines() == [
        "rillet: the provider's content rules stopped the answer partway (content_filter): "
        "what is shown is incomplete — rephrase the request"
    ]
    assert len(provider.requests) == 1  # the same request would be filtered again


async def test_a_refusal_is_shown_and_said_to_be_one() -> None:
    # OpenAI sends a model's refusal in `delta.refusal`, in place of content
    pieces = ["I'm sorry,", " I can't help with that."]
    chunks: list[dict[str, object]] = [
        {"delta": {"role": "assistant", "content": None, "refusal": ""}}
    ]
    chunks += [{"delta": {"refusal": piece}} for piece in pieces]
    chunks.append({"delta": {}, "finish_reason": "stop"})
    body = b"".join(
        b"data: %s\n\n" % json.dumps({"id": "c1", "model": "m", "choices": [c]}).encode()
        for c in chunks
    )
    body += b"data: [DONE]\n\n"
    async with open_loopback_provider([Reply(chunks=split(body, 16))]) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
    assert done.returncode == 1
    assert done.stdout.decode().strip() == "".join(pieces)
    assert done.stderr.decode().strip().splitlines() == [
        "rillet: the model declined to answer (refusal): what is shown is its reason, not an"
        " answer — rephrase the request"
    ]
    assert len(provider.requests) == 1


async def test_an_answer_of_unknown_finish_is_whole_and_silent() -> None:
    # many compatible servers never say why they stopped: that is no cut
    body = openai_text_stream(FRAGMENTS, finish_reason="eos")
    async with open_loopback_provider([Reply(chunks=split(body, 16))]) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert done.stdout.decode().strip() == "".join(FRAGMENTS).strip()
    async with open_loopback_provider([Reply(chunks=split(body, 16))]) as provider:
        done = await _run_cli(["run", "hi", "--output", "jsonl"], provider.url)
    answered = [json.loads(line) for line in done.stdout.decode().splitlines()][-2]
    assert answered["type"] == "answer.done"
    assert "filtered" not in answered  # said only when true


BAD_KEY = (
    b'{"error": {"message": "Incorrect API key provided: sk-abcd************************3456.",'
    b' "type": "invalid_request_error", "code": "invalid_api_key"}}'
)


@pytest.mark.parametrize("output", ["text", "jsonl", "uni-jsonl"])
async def test_a_401_is_one_line_naming_the_cause_in_every_output_mode(output: str) -> None:
    script = [Reply(status=401, chunks=(BAD_KEY,), content_type="application/json")]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--output", output], provider.url)
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert lines == [
        "rillet: authentication failed (401): Incorrect API key provided: sk-…3456. "
        "— check OPENAI_API_KEY or --api-key"
    ]
    assert b"sk-abcd" not in done.stderr + done.stdout
    if output == "jsonl":  # the run events say the same cause as a code
        done_event = json.loads(done.stdout.decode().splitlines()[-1])
        assert (done_event["type"], done_event["code"]) == ("run.done", "authentication_failed")
        assert done_event["retryable"] is False


XAI_BAD_KEY = (
    Path(__file__).parent.parent / "fixtures/real/openai-chat/xai-400-incorrect-api-key.json"
)
XAI_TOO_LONG = (
    b'{"code":"Client specified an invalid argument","error":"This model\'s maximum prompt'
    b' length is 131072 but the request contains 150000 tokens."}'
)


async def test_xais_400_for_a_wrong_key_says_to_check_the_key_not_the_model() -> None:
    body = XAI_BAD_KEY.read_bytes()
    script = [Reply(status=400, chunks=(body,), content_type="application/json")] * 6
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
        requests = len(provider.requests)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        "rillet: authentication failed (400): Incorrect API key provided: ***. You can obtain an"
        " API key from https://console.x.ai. — check OPENAI_API_KEY or --api-key"
    ]
    assert requests == 1


async def test_xais_context_overflow_in_a_string_error_says_to_shorten() -> None:
    script = [Reply(status=400, chunks=(XAI_TOO_LONG,), content_type="application/json")] * 6
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--output", "jsonl"], provider.url)
        requests = len(provider.requests)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        "rillet: the conversation is longer than the model takes (400): This model's maximum"
        " prompt length is 131072 but the request contains 150000 tokens. — shorten it (or lower"
        " --max-tokens), or pick a model with a larger context window"
    ]
    done_event = json.loads(done.stdout.decode().splitlines()[-1])
    assert (done_event["code"], done_event["retryable"]) == ("context_too_long", False)
    assert requests == 1


async def test_the_key_in_use_is_masked_in_the_cause() -> None:
    key = "sk-live-0123456789abcdef"
    body = b'{"error": {"message": "key ' + key.encode() + b' is revoked"}}'
    script = [Reply(status=401, chunks=(body,), content_type="application/json")]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--api-key", key], provider.url)
    assert done.returncode == 1
    assert key.encode() not in done.stderr
    assert done.stderr.decode().strip().endswith("is revoked — check --api-key")


async def test_a_refused_connection_names_host_cause_and_attempts() -> None:
    from rillet.transports.testing import refused_url

    url = refused_url()
    host = url.split("//", 1)[1].rstrip("/")
    done = await _run_cli(["run", "hi", "--retries", "1", "--no-rescue"], url)
    assert done.returncode == 1
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"rillet: cannot connect to {host}: connection refused (2 attempts)")
    assert b"Traceback" not in done.stderr


async def test_an_https_url_to_a_plain_http_server_says_the_handshake_failed() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))] * 3
    async with open_loopback_provider(script) as provider:
        url = provider.url.replace("http://", "https://")
        host = url.split("//", 1)[1].rstrip("/")
        done = await _run_cli(["run", "hi", "--retries", "0", "--no-rescue"], url)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        f"rillet: cannot connect to {host}: the TLS handshake failed: the server does not speak"
        " TLS — if it serves plain HTTP, use an http:// URL in --base-url"
    ]


async def test_a_tls_handshake_that_cannot_pass_is_tried_once() -> None:
    """A plain-HTTP server on an https:// URL fails the same way every time: with the default
    retries and rescue, still one attempt and one line."""
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))] * 6
    async with open_loopback_provider(script) as provider:
        url = provider.url.replace("http://", "https://")
        done = await _run_cli(["run", "hi"], url)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1
    assert len(lines) == 1, lines  # no "retrying" line before it
    assert "the server does not speak TLS" in lines[0]
    assert "attempts" not in lines[0]


async def test_a_500_names_the_status_the_attempts_and_the_message() -> None:
    boom = b'{"error": {"message": "upstream failed", "type": "server_error"}}'
    script = [Reply(status=500, chunks=(boom,), content_type="application/json")] * 2
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--retries", "1", "--no-rescue"], provider.url)
    assert done.returncode == 1
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last == "rillet: provider error 500 after 2 attempts: upstream failed"


@pytest.mark.parametrize("where", ["before", "after"])
async def test_debug_anywhere_on_the_line_adds_the_traceback(where: str) -> None:
    from rillet.transports.testing import refused_url

    args = ["run", "hi", "--retries", "0", "--no-rescue"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    done = await _run_cli(args, refused_url())
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("rillet: cannot connect to")


async def test_debug_shows_a_provider_errors_facts_with_keys_masked() -> None:
    script = [Reply(status=401, chunks=(BAD_KEY,), content_type="application/json")]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--debug"], provider.url)
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "AuthenticationError facts: {" in err
    assert "'status': 401" in err
    assert "'error_type': 'invalid_request_error'" in err
    assert "sk-abcd" not in err
    assert err.strip().splitlines()[-1].startswith("rillet: authentication failed (401)")


async def test_no_stream_sends_stream_false_and_prints_the_answer_once() -> None:
    script = [
        Reply(chunks=(openai_text_body("The whole answer."),), content_type="application/json")
    ]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--no-stream"], provider.url)
        sent = json.loads(provider.requests[0].body)
    assert done.returncode == 0, done.stderr
    assert sent["stream"] is False
    assert "stream_options" not in sent
    assert len(provider.requests) == 1
    assert done.stdout.decode() == "The whole answer.\n"


async def test_no_stream_reads_a_server_that_streams_anyway() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]  # SSE despite stream:false
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--no-stream"], provider.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(FRAGMENTS) + "\n"


async def test_a_key_from_the_environment_not_sent_is_noted() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _rillet(
            *("run", "hi", "--provider", "openai", "--base-url", f"{provider.url}/v1"),
            *("--model", "m"),
            OPENAI_API_KEY="sk-test-0123456789abcdef",
        )
        headers = provider.requests[0].headers
    assert done.returncode == 0, done.stderr
    assert "authorization" not in {k.lower() for k in headers}
    host = provider.url.split("//", 1)[1]
    assert (
        done.stderr.decode()
        .splitlines()[0]
        .startswith(f"rillet: note: OPENAI_API_KEY is set but not sent to {host}")
    )


async def test_a_key_that_is_sent_gets_no_note() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--api-key", "sk-test-0123456789abcdef"], provider.url)
    assert done.returncode == 0, done.stderr
    assert b"note:" not in done.stderr


async def test_run_logs_one_json_line_at_its_end() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        args = ["run", "hi", "--log-level", "info", "--log-format", "json"]
        done = await _run_cli(args, provider.url)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.decode().splitlines()]
    ends = [r for r in records if r["logger"] == "rillet.cli"]
    assert len(ends) == 1
    end = ends[0]
    assert end["level"] == "info"
    assert end["outcome"] == "Completed"
    assert end["model"] == "m"
    assert end["provider"] == provider.url.split("//", 1)[1]
    assert end["attempts"] == 1
    assert 0 <= end["first_event_s"] <= end["duration_s"]


async def test_run_logs_nothing_at_the_default_level() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
    assert done.returncode == 0
    assert done.stderr == b""


async def test_missing_key_is_one_line_with_a_hint() -> None:
    done = await _rillet("run", "hi", "--provider", "openai")
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert lines == ["rillet: no API key: set OPENAI_API_KEY or pass --api-key"]


@contextmanager
def _popen(args: list[str], url: str) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "rillet", *args, "--provider", f"{url}/v1", "--model", "m"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=ROOT
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def _read_until(stream: object, needle: bytes, limit: float = 20) -> bytes:
    got = b""
    with trio.fail_after(limit):
        while needle not in got:
            chunk = await trio.to_thread.run_sync(stream.read1, 4096)  # type: ignore[attr-defined]
            if not chunk:
                break
            got += chunk
    return got


async def test_sigint_mid_stream_exits_130_and_keeps_run_done_in_jsonl() -> None:
    events = tuple(e + b"\n\n" for e in openai_text_stream(FRAGMENTS).split(b"\n\n") if e)
    script = [Reply(chunks=events, stall_after=3)]  # the role chunk and two fragments
    async with open_loopback_provider(script) as provider:
        with _popen(["run", "hi", "--output", "jsonl"], provider.url) as proc:
            got = await _read_until(proc.stdout, b"answer.delta")
            proc.send_signal(signal.SIGINT)
            rest, err = await trio.to_thread.run_sync(proc.communicate)
    assert proc.returncode == 130, err
    lines = (got + rest).decode().splitlines()
    last = json.loads(lines[-1])
    assert last["type"] == "run.done"
    assert last["status"] == "cancelled"


async def test_closed_stdout_exits_141_without_noise() -> None:
    fragments = [f"line {i}\n" for i in range(2000)]
    script = [Reply(chunks=split(openai_text_stream(fragments), 512), chunk_delay=0.001)]
    async with open_loopback_provider(script) as provider:
        with _popen(["run", "hi"], provider.url) as proc:
            assert proc.stdout is not None
            await _read_until(proc.stdout, b"line 1\n")
            proc.stdout.close()
            _, err = await trio.to_thread.run_sync(proc.communicate)
    assert proc.returncode == 141
    assert b"Traceback" not in err
    assert b"BrokenPipe" not in err


@pytest.mark.slow
async def test_demo_runs_to_completion() -> None:
    done = await _rillet("demo", "--fast")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "It is 18 °C in Paris with light rain" in out
    assert "こんにちは" in out
    assert "every token exactly once." in out
    assert b"all turns completed" in done.stderr


async def test_version_prints_the_installed_version() -> None:
    import rillet

    for cmd in (["rillet", "--version"], [sys.executable, "-m", "rillet", "--version"]):
        if cmd[0] == "rillet":
            cmd[0] = str(Path(sys.executable).with_name("rillet"))
        done = await trio.run_process(cmd, capture_stdout=True, check=False, env=_env(), cwd=ROOT)
        assert done.returncode == 0
        assert done.stdout.decode().strip() == f"rillet {rillet.__version__}"


async def test_replay_reads_every_dialect_name_from_the_one_registry(tmp_path: Path) -> None:
    from rillet.providers import DIALECT_NAMES

    cmd = [sys.executable, "-m", "rillet", "replay", "x.sse", "--dialect", "nope"]
    (tmp_path / "x.sse").write_bytes(b"data: [DONE]\n\n")
    done = await trio.run_process(cmd, capture_stderr=True, check=False, env=_env(), cwd=tmp_path)
    assert done.returncode != 0
    message = done.stderr.decode()
    assert "unknown dialect 'nope'" in message
    assert "gemini-embeddings" in message
    assert all(n in message for n in DIALECT_NAMES)


def _spawn(cmd: list[str], *, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=stdout, stderr=stderr)


async def _rillet(*args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "rillet", *args]
    return await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, check=False, env=_env(**env), cwd=ROOT
    )


async def test_serve_on_a_busy_port_is_one_line() -> None:
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = await _rillet(
            "serve", "--port", str(port), "--provider", "http://127.0.0.1:9/v1", "--model", "m"
        )
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        f"rillet: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(stop what is using it, or pass --port 0 for a free one)"
    ]


async def test_serve_off_loopback_without_a_key_is_one_line() -> None:
    done = await _rillet(
        "serve", "--host", "0.0.0.0", "--provider", "http://127.0.0.1:9/v1", "--model", "m"
    )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("rillet: refusing to serve on '0.0.0.0' without a server key")


@pytest.mark.parametrize("command", ["run", "serve"])
async def test_every_option_says_its_default_or_is_a_switch(command: str) -> None:
    from rillet._cli._args import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = [a for a in sub.choices[command]._actions if a.option_strings]
    assert options
    for action in options:
        switch = isinstance(action, argparse._StoreTrueAction | argparse._HelpAction)
        assert action.help, action.option_strings
        if not switch:
            assert "default" in action.help.lower(), action.option_strings


async def test_help_names_every_providers_default_model() -> None:
    from rillet._cli._args import build_parser
    from rillet.providers._registry import KINDS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    model = next(a for a in sub.choices["run"]._actions if "--model" in a.option_strings)
    assert model.help is not None
    for kind, spec in KINDS.items():
        if spec.model:
            assert re.search(rf"\b{re.escape(kind)} {re.escape(spec.model)}[,;]", model.help), kind
    done = await _rillet("run", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.decode().split())
    assert "--initial-timeout SECONDS wait for the first event (default: 120 s)" in text


async def test_usage_errors_exit_2_and_the_documented_codes_are_those_that_happen() -> None:
    from rillet._cli import _exits as _cli

    done = await _rillet("run", "hi", "--no-such-option")
    assert done.returncode == 2
    done = await _rillet()
    assert done.returncode == 2
    readme = (ROOT / "README.md").read_text()
    line = readme[readme.index("Exit codes:") :].split("\n\n")[0]
    documented = {int(n) for n in re.findall(r"\b(\d+)\s+[a-z]", line)}
    codes = {v for k, v in vars(_cli).items() if k.startswith("EXIT_")}
    assert documented == codes == {0, 1, 2, 3, 130, 141}
    assert re.search(r"\b3\s+approval required\b", line)  # the CLI asks, so it documents it
    done = await _rillet("--help")
    helped = " ".join(done.stdout.decode().split())
    assert "2 usage error" in helped
    assert "3 approval required" in helped


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (("--total-timeout", "0"), "--total-timeout: must be a positive number of seconds"),
        (("--initial-timeout", "nan"), "--initial-timeout: must be a positive number"),
        (("--retries", "-1"), "--retries: must be a whole number, 0 or more"),
        (("--max-tokens", "0"), "--max-tokens: must be a whole number, 1 or more"),
        (("--temperature", "-3"), "--temperature: must be a number, 0 or more"),
        (("--rpm", "fast"), "--rpm: 'fast' is not a number"),
        (("--max-steps", "0"), "--max-steps: must be a whole number, 1 or more"),
    ],
)
async def test_a_value_that_cannot_mean_anything_is_a_usage_error(
    option: tuple[str, str], said: str
) -> None:
    done = await _rillet("run", "hi", "--provider", "http://127.0.0.1:9/v1", *option)
    assert done.returncode == 2
    assert said in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()


async def test_the_spinner_ticks_on_a_terminal_while_waiting() -> None:
    import pty

    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16), headers_delay=1.2)]
    async with open_loopback_provider(script) as provider:
        leader, follower = pty.openpty()
        cmd = [sys.executable, "-m", "rillet", "run", "hi", "--provider", f"{provider.url}/v1"]
        proc = _spawn([*cmd, "--model", "m"], stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        seen = b""
        try:
            with trio.fail_after(30):
                while True:
                    try:
                        chunk = await trio.to_thread.run_sync(os.read, leader, 4096)
                    except OSError:  # the terminal closed: the process is gone
                        break
                    if not chunk:
                        break
                    seen += chunk
            out, _ = await trio.to_thread.run_sync(proc.communicate)
        finally:
            proc.kill()
            os.close(leader)
    assert proc.returncode == 0
    assert out.decode() == "".join(FRAGMENTS) + "\n"
    times = [float(t) for t in re.findall(rb"waiting (\d+\.\d) s", seen)]
    assert len(set(times)) >= 5, seen  # it ticked on its own, ten frames a second
    assert times == sorted(times)
    assert max(times) >= 1.0


@pytest.mark.slow
async def test_demo_keeps_the_page_up_until_ctrl_c() -> None:
    import httpx

    cmd = [sys.executable, "-m", "rillet", "demo", "--fast", "--keep-serving"]
    proc = _spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        err = await _read_until(proc.stderr, b"Ctrl-C stops it", limit=60)
        assert b"stays up until Ctrl-C" in err
        page = err.split(b"the live page is still at ")[1].split()[0].decode()
        await trio.sleep(0.5)  # it does not end by itself
        assert proc.poll() is None
        async with httpx.AsyncClient() as client:
            reply = await client.get(page)
        assert reply.status_code == 200
        assert b"<html" in reply.content
        proc.send_signal(signal.SIGINT)
        _, rest = await trio.to_thread.run_sync(proc.communicate)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert b"stopped" in rest
    assert b"Traceback" not in err + rest


async def test_serve_logs_as_json_at_the_level_asked() -> None:
    cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--log-format", "json"]
    cmd += ["--log-level", "info", "--provider", "http://127.0.0.1:9/v1", "--model", "m"]
    proc = _spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        err = await _read_until(proc.stderr, b"rillet serving", limit=30)
        proc.send_signal(signal.SIGINT)
        _, rest = await trio.to_thread.run_sync(proc.communicate)
    finally:
        proc.kill()
        proc.wait()
    lines = (err + rest).decode().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    serving = [r for r in records if r["message"].startswith("serving on http://127.0.0.1:")]
    assert len(serving) == 1
    assert serving[0]["level"] == "info"
    assert serving[0]["logger"].startswith("rillet.")
    assert any(line.startswith("rillet serving http://127.0.0.1:") for line in lines)
    assert proc.returncode == 130
    assert "Traceback" not in (err + rest).decode()


async def test_providers_lists_each_default_model_and_masks_keys() -> None:
    from rillet.providers._registry import KINDS

    done = await _rillet("providers", ANTHROPIC_API_KEY="sk-ant-test-0123456789wxyz")
    assert done.returncode == 0
    lines = done.stdout.decode().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert lines[0].split()[:3] == ["provider", "default", "model"]
    for kind, spec in KINDS.items():
        assert rows[kind][1] == (spec.model or "-")
    assert rows["anthropic"][3] == "…wxyz"
    assert b"0123456789" not in done.stdout


def test_serve_route_names_provider_kinds() -> None:
    from rillet._cli._exits import CliError
    from rillet._cli._serve import route_kinds

    assert route_kinds("") == ()
    assert route_kinds("anthropic, gemini") == ("anthropic", "gemini")
    with pytest.raises(CliError, match="unknown provider kind 'nope'"):
        route_kinds("anthropic,nope")


async def test_provider_help_names_every_kind_the_registry_takes() -> None:
    from rillet.providers._registry import PROVIDER_KINDS

    for command in ("run", "serve"):
        done = await _rillet(command, "--help")
        assert done.returncode == 0
        text = " ".join(done.stdout.decode().split())
        named = text.split("--provider PROVIDER", 1)[1].split("(default", 1)[0]
        for kind in PROVIDER_KINDS:
            assert re.search(rf"(^|[ ,]){re.escape(kind)}[,]", named), (command, kind)
