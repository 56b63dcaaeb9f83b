"""Where `rillet run` writes its answer: a reader that leaves stops the run (its provider
request is closed at once, not paid for to the end), and a file holds the answer exactly once
whatever retries voided, on real `rillet` processes against a provider on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import trio
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

ROOT = Path(__file__).resolve().parent.parent.parent
WORDS = [f"w{k} " for k in range(200)]


def _events(fragments: list[str]) -> tuple[bytes, ...]:
    stream = openai_text_stream(fragments)
    return tuple(e + b"\n\n" for e in stream.split(b"\n\n") if e)


def _command(url: str, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "rillet", "run", "hi", *args]
    return [*cmd, "--provider", f"{url}/v1", "--model", "m", "--api-key", "sk-test"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}


def _run_into(cmd: list[str], path: Path) -> subprocess.CompletedProcess[bytes]:
    with path.open("wb") as out:
        return subprocess.run(
            cmd, stdout=out, stderr=subprocess.PIPE, env=_env(), cwd=ROOT, check=False
        )


def _piped_to_head(cmd: list[str], size: int) -> tuple[int, bytes, float]:
    """`cmd | head -c size`: the command's exit status, what head printed, the seconds until
    the command exited."""
    began = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT
    )
    assert proc.stdout is not None
    head = proc.stdout.read(size)
    proc.stdout.close()  # the reader leaves
    status = proc.wait(timeout=60)
    return status, head, time.monotonic() - began


async def test_a_reader_that_leaves_stops_the_run_and_its_provider_request() -> None:
    # 200 fragments, one every 50 ms: ten seconds of answer if the run went on to its end
    script = [Reply(chunks=_events(WORDS), chunk_delay=0.05)]
    async with open_loopback_provider(script) as provider:
        status, head, seconds = await trio.to_thread.run_sync(
            _piped_to_head, _command(provider.url), 20
        )
        with trio.fail_after(5):
            while provider.open_connections:  # noqa: ASYNC110 (the server's count, no event)
                await trio.sleep(0.05)
    assert head.startswith(b"w0 w1 w2")
    assert status == 141  # the documented exit status for a reader that went away
    assert seconds < 5  # far less than the answer's ten seconds: the run did not go on
    assert len(provider.requests) == 1


async def test_a_file_holds_the_answer_once_after_a_retry_voided_part_of_it(
    tmp_path: Path,
) -> None:
    words = WORDS[:40]
    events = _events(words)
    broken = Reply(chunks=events, drop_after_bytes=sum(map(len, events[:20])))
    script = [broken, Reply(chunks=events)]
    answer = tmp_path / "answer.txt"
    async with open_loopback_provider(script) as provider:
        done = await trio.to_thread.run_sync(_run_into, _command(provider.url), answer)
    assert done.returncode == 0, done.stderr
    assert len(provider.requests) == 2  # the stream broke mid-answer and was asked again
    assert answer.read_text("utf-8") == "".join(words) + "\n"
    assert b"output restarted" not in done.stderr  # nothing of the voided attempt is left


async def test_a_pipe_that_cannot_be_taken_back_gets_the_documented_marker() -> None:
    words = WORDS[:40]
    events = _events(words)
    broken = Reply(chunks=events, drop_after_bytes=sum(map(len, events[:20])))
    script = [broken, Reply(chunks=events)]
    async with open_loopback_provider(script) as provider:
        done = await trio.run_process(
            _command(provider.url),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=_env(),
            cwd=ROOT,
        )
    assert done.returncode == 0, done.stderr
    assert b"[attempt 2: output restarted]" in done.stderr
    assert done.stdout.decode().endswith("\n" + "".join(words) + "\n")  # restarted on a line
