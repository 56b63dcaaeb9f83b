"""Where `rillet serve` takes its server key from, on real `rillet serve` processes: the
environment (`RILLET_SERVER_KEY`) and a file (`--server-key-file`) are enforced, a key on the
command line still works but says it is readable by every local user, and a file that holds
no key (or cannot be read) stops the server with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).parent.parents[1]
KEY = "key-from-a-safe-place-0123456789"
UPSTREAM = "http://127.0.0.1:9/v1"  # never reached: these requests need no provider


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RILLET_SERVER_KEY"}
    return {**env, "NO_COLOR": "1", **extra}


@contextmanager
def serving(tmp: Path, *args: str, **env: str) -> Iterator[tuple[str, Path]]:
    """A `rillet serve` process on a free port: its URL and its stderr's file."""
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--provider", UPSTREAM]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*cmd, "--model", "m", *args],
            cwd=ROOT,
            env=_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 30
        while "rillet serving" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        line = next(ln for ln in log.read_text().splitlines() if "rillet serving" in ln)
        yield line.split("rillet serving ")[1].split("/ ")[0], log
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def answers(url: str) -> tuple[int, int, int]:
    """`/metrics.json` (the server key, when one is set) without a key, with a wrong one and
    with `KEY`."""
    with httpx.Client(base_url=url) as client:
        bare = client.get("/metrics.json").status_code
        wrong = client.get("/metrics.json", headers={"authorization": "Bearer nope"}).status_code
        right = client.get("/metrics.json", headers={"authorization": f"Bearer {KEY}"}).status_code
    return bare, wrong, right


def test_the_key_from_the_environment_is_enforced(tmp_path: Path) -> None:
    with serving(tmp_path, RILLET_SERVER_KEY=KEY) as (url, log):
        assert answers(url) == (401, 401, 200)
        with httpx.Client(base_url=url) as client:
            start = client.post("/v1/runs", json={"prompt": "hi"})
    assert start.status_code == 401
    assert "warning" not in log.read_text()


def test_the_key_from_a_file_is_enforced_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    with serving(tmp_path, "--server-key-file", str(path)) as (url, log):
        assert answers(url) == (401, 401, 200)
    assert KEY not in log.read_text()


def test_a_file_overrides_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(KEY)
    with serving(tmp_path, "--server-key-file", str(path), RILLET_SERVER_KEY="other") as (url, _):
        assert answers(url) == (401, 401, 200)


def test_a_key_on_the_command_line_works_and_warns(tmp_path: Path) -> None:
    with serving(tmp_path, "--server-key", KEY) as (url, log):
        assert answers(url) == (401, 401, 200)
    warnings = [ln for ln in log.read_text().splitlines() if "warning" in ln]
    assert warnings == [
        "rillet: warning: a key given with --server-key is visible to every local user "
        "(/proc/PID/cmdline): use --server-key-file PATH or RILLET_SERVER_KEY"
    ]


def test_without_a_key_the_loopback_server_is_open(tmp_path: Path) -> None:
    with serving(tmp_path) as (url, _):
        assert answers(url) == (200, 200, 200)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("\n", "rillet: --server-key-file {path}: the file holds no key"),
        (None, "rillet: --server-key-file {path}: cannot read it (No such file or directory)"),
    ],
)
def test_an_empty_or_missing_key_file_stops_the_server_in_one_line(
    tmp_path: Path, content: str | None, line: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--provider", UPSTREAM]
    done = subprocess.run(
        [*cmd, "--model", "m", "--server-key-file", str(path)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [line.format(path=path)]


def test_an_empty_key_in_the_environment_stops_the_server(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--provider", UPSTREAM]
    done = subprocess.run(
        [*cmd, "--model", "m"],
        cwd=ROOT,
        env=_env(RILLET_SERVER_KEY=""),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "rillet: RILLET_SERVER_KEY is set but empty (set the key, or unset it)"
    ]
