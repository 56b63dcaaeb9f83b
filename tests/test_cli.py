"""The command line, as a user runs it: a subprocess against the loopback provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream, split

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
FRAGMENTS = ["Hello", " from", " the", " loopback", " 👋"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(extra)
    return env


async def _run_cli(args: list[str], url: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "rillet", *args, "--provider", f"{url}/v1", "--model", "m"]
    return await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, check=False, env=_env(**env), cwd=ROOT
    )


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


async def test_no_stream_prints_the_answer_once() -> None:
    script = [Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi", "--no-stream"], provider.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "".join(FRAGMENTS) + "\n"


async def test_a_provider_error_exits_1_with_one_line() -> None:
    script = [
        Reply(
            status=401,
            chunks=(b'{"error": {"message": "bad key sk-123"}}',),
            content_type="application/json",
        )
    ]
    async with open_loopback_provider(script) as provider:
        done = await _run_cli(["run", "hi"], provider.url)
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr
    assert b"sk-123" not in done.stderr + done.stdout


async def test_missing_key_is_one_line_with_a_hint() -> None:
    cmd = [sys.executable, "-m", "rillet", "run", "hi", "--provider", "openai"]
    done = await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, check=False, env=_env(), cwd=ROOT
    )
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
    cmd = [sys.executable, "-m", "rillet", "demo", "--fast"]
    done = await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, check=False, env=_env(), cwd=ROOT
    )
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
