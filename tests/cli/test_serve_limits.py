"""`rillet serve --max-streams / --max-queued / --max-per-client`: the server's capacity from
the command line, checked on a real `rillet serve` process in front of a provider on
loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from rillet._cli._args import build_parser
from rillet._cli._serve import serve_limits
from rillet.transports.server import Limits
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

if TYPE_CHECKING:
    import argparse

ROOT = Path(__file__).resolve().parent.parent.parent
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _serve_args(*options: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--provider", "http://127.0.0.1:9/v1", *options])


def test_the_options_set_the_limits_and_the_rest_keep_their_defaults() -> None:
    assert serve_limits(_serve_args()) == Limits()
    limits = serve_limits(
        _serve_args("--max-streams", "500", "--max-queued", "0", "--max-per-client", "3")
    )
    assert (limits.max_streams, limits.max_queued, limits.max_runs_per_client) == (500, 0, 3)
    assert limits.max_active_runs == 500  # grown to hold every stream the options allow
    assert limits.max_connections == Limits().max_connections


def test_a_limit_below_its_floor_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        _serve_args("--max-streams", "0")
    assert exc.value.code == 2


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)


async def _serving_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    got = b""
    with trio.fail_after(30):
        while (found := re.search(rb"rillet serving (http://127\.0\.0\.1:\d+)/", got)) is None:
            chunk = await trio.to_thread.run_sync(proc.stderr.read1, 4096)  # type: ignore[attr-defined]
            assert chunk, got.decode()
            got += chunk
    return found.group(1).decode()


async def test_one_stream_no_queue_turns_the_second_client_away_with_429() -> None:
    events = tuple(e + b"\n\n" for e in openai_text_stream(["a", "b"]).split(b"\n\n") if e)
    held = Reply(chunks=events, stall_after=2)  # the role chunk and "a", then it holds
    async with open_loopback_provider([held]) as provider:
        cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0"]
        cmd += ["--provider", f"{provider.url}/v1", "--model", "m", "--api-key", "sk-test"]
        cmd += ["--max-streams", "1", "--max-queued", "0"]
        proc = _start(cmd)
        try:
            url = await _serving_url(proc)
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                path = "/v1/chat/completions"
                async with client.stream("POST", path, json=BODY) as first:
                    assert first.status_code == 200  # its head: it holds the only stream
                    assert len(provider.requests) == 1
                    second = await client.post(path, json=BODY)
                    assert second.status_code == 429
                    assert second.headers["retry-after"]
        finally:
            proc.send_signal(signal.SIGINT)
            await trio.to_thread.run_sync(proc.communicate)
