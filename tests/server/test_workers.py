"""`rillet serve --workers 2`: two real worker processes on one port (SO_REUSEPORT), a real
`redis-server`, the loopback provider in a process of its own, HTTP on 127.0.0.1.

A request reaches a chosen worker by opening connections until one lands on it (the kernel
spreads them by their addresses) and keeping that connection: `/metrics.json` names the worker
each connection reached. Every wait is bounded (a deadline, or a count of attempts).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
from rillet.transports import SSEDecoder
from rillet.transports.server import ServerConfig, WorkerFailed, serve
from rillet.transports.testing import open_loopback_provider

from ..cli.test_cli_agents import tool_then_answer
from ..fault_support import next_frame
from ..hub.test_redis_hub import redis_server  # noqa: F401 - the session fixture
from ..load._provider import fragments
from ..server_support import chat_provider, read_sse

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..hub.test_redis_hub import RedisServer

Events = list[tuple[str, dict[str, Any]]]

ROOT = Path(__file__).parent.parents[1]
CHUNKS = 60  # deltas a run streams
GAP = 0.05  # seconds between them: a run lasts about 3 s, time enough to cancel it


def _wait_for(check: Any, what: str, timeout: float = 30.0) -> Any:
    """Poll `check()` until it gives something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout:g} s")


@contextmanager
def _provider(*extra: str) -> Iterator[str]:
    """The loopback provider (`tests.load._provider`) in a child process: its base URL."""
    args = [sys.executable, "-m", "tests.load._provider", "--chunks", str(CHUNKS)]
    args += ["--gap", str(GAP), *extra]
    process = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(b"PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.close()
        process.wait(timeout=10)
        process.stdout.close()


@attrs.define
class Served:
    """A `rillet serve --workers N` process: its URL, its log, and the process."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def pids(self) -> list[int]:
        """The worker pids the supervisor logged (its latest line)."""
        lines = [ln for ln in self.log.read_text().splitlines() if "workers (pids " in ln]
        return [int(p) for p in lines[-1].split("(pids ")[1].rstrip(")").split(", ")]


@contextmanager
def _serve(tmp: Path, redis: str | None, provider: str, *extra: str) -> Iterator[Served]:
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--provider", provider]
    args += ["--model", "m", *(("--redis", redis) if redis else ()), *extra]
    with log.open("wb") as out:
        process = subprocess.Popen(  # a process group of its own, as a terminal's job is
            args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True
        )
    served = Served(process, log)
    try:
        line = _wait_for(
            lambda: (
                process.poll() is None
                and next(
                    (ln for ln in log.read_text().splitlines() if "rillet serving" in ln), None
                )
            ),
            "the server to say it serves",
        )
        served.url = line.split("rillet serving ")[1].split("/ ")[0]
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    with _provider() as url:
        yield url


@pytest.fixture(scope="module")
def two(
    redis_server: RedisServer,  # noqa: F811
    provider: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """`rillet serve --workers 2` on a free port, for the module."""
    tmp = tmp_path_factory.mktemp("workers")
    with _serve(tmp, redis_server.url, provider, "--workers", "2") as served:
        yield served


def _on(url: str, worker: int, attempts: int = 400) -> tuple[httpx.Client, dict[str, Any]]:
    """A client whose one connection reached `worker`, and that worker's `/metrics.json`."""
    for _ in range(attempts):
        client = httpx.Client(base_url=url, limits=httpx.Limits(max_connections=1), timeout=20.0)
        metrics = client.get("/metrics.json").json()
        if metrics["worker"] == worker:
            return client, metrics
        client.close()
    raise AssertionError(f"no connection reached worker {worker} in {attempts} attempts")


def _events(
    client: httpx.Client,
    url: str,
    last_event_id: str | None = None,
    limit: int = 0,
    within: float = 60.0,
) -> Events:
    """The run's events over SSE on this client's connection (after `last_event_id`), until
    `run.done`, `limit` of them, or `within` seconds (heartbeats wake the read): (id, event)
    pairs."""
    deadline = time.monotonic() + within
    headers = {"accept": "text/event-stream"}
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    got: Events = []
    with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, response.status_code
        event_id = ""
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                break
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                got.append((event_id, event))
                if event["type"] == "run.done" or len(got) == limit:
                    break
    return got


def _metrics(url: str, worker: int) -> dict[str, Any]:
    """`worker`'s `/metrics.json`."""
    client, metrics = _on(url, worker)
    client.close()
    return metrics


def _start(client: httpx.Client) -> dict[str, Any]:
    response = client.post("/v1/runs", json={"prompt": "go"})
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def _whole(events: Events) -> None:
    """Every event once, in order from seq 1, the whole answer, completed."""
    seqs = [e["seq"] for _, e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    text = "".join(e["delta"] for _, e in events if e["type"] == "answer.delta")
    assert text == "".join(fragments(CHUNKS))
    assert events[-1][1]["type"] == "run.done"
    assert events[-1][1]["status"] == "completed"


# --- the tests ------------------------------------------------------------------------------------


def test_workers_without_redis_is_a_usage_error_that_says_what_to_do(provider: str) -> None:
    args = [sys.executable, "-m", "rillet", "serve", "--workers", "2", "--provider", provider]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "--workers 2 needs --redis URL" in lines[0]


def test_config_with_workers_needs_a_redis_url() -> None:
    config = ServerConfig(provider=chat_provider("http://127.0.0.1:1"), workers=2)
    with pytest.raises(ValueError, match="2 workers need a Redis"):
        config.check()


def test_workers_where_the_system_has_no_so_reuseport_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(socket, "SO_REUSEPORT")
    config = ServerConfig(
        provider=chat_provider("http://127.0.0.1:1"), workers=2, redis_url="redis://127.0.0.1:1"
    )
    with pytest.raises(ValueError, match="no SO_REUSEPORT: serve with one worker"):
        config.check()
    ServerConfig(provider=chat_provider("http://127.0.0.1:1")).check()  # one worker: served


def test_both_workers_serve_connections_and_runs(two: Served) -> None:
    first = {w: _metrics(two.url, w)["runs_started"] for w in (0, 1)}
    runs = []
    for _ in range(16):  # each on a connection of its own: the kernel spreads them
        with httpx.Client(base_url=two.url, timeout=20.0) as client:
            runs.append(_start(client))
    after = {w: _metrics(two.url, w)["runs_started"] for w in (0, 1)}
    started = {w: after[w] - first[w] for w in (0, 1)}
    assert sum(started.values()) == 16
    assert started[0] > 0
    assert started[1] > 0, started
    for run in runs:  # and each is read whole from whichever worker the connection reached
        with httpx.Client(base_url=two.url, timeout=20.0) as client:
            _whole(_events(client, _path(run["events_url"])))


@pytest.mark.parametrize("driver", [0, 1])
def test_a_run_started_on_one_worker_streams_whole_once_on_the_other(
    two: Served, driver: int
) -> None:
    starter, _ = _on(two.url, driver)
    reader, before = _on(two.url, 1 - driver)
    with closing(starter), closing(reader):
        run = _start(starter)
        now = reader.get("/metrics.json").json()  # still the reader's worker: not its run
        assert (now["worker"], now["runs_started"]) == (1 - driver, before["runs_started"])
        _whole(_events(reader, _path(run["events_url"])))


def _socket_on(url: str, worker: int, attempts: int = 400) -> socket.socket:
    """A raw connection that reached `worker` (its `/metrics.json` said so), kept open."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    for _ in range(attempts):
        sock = socket.create_connection((host, int(port)), timeout=20)
        sock.sendall(f"GET /metrics.json HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += sock.recv(65536)
        if json.loads(body)["worker"] == worker:
            return sock
        sock.close()
    raise AssertionError(f"no connection reached worker {worker} in {attempts} attempts")


def test_a_websocket_on_the_other_worker_gets_the_run_whole(two: Served) -> None:
    starter, _ = _on(two.url, 0)
    with closing(starter):
        run = _start(starter)
    with _socket_on(two.url, 1) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        host = two.url.removeprefix("http://")
        sock.sendall(
            (
                f"GET {_path(run['ws_url'])} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        buffer = bytearray(rest)
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "run.done":
            frame = next_frame(buffer)
            if frame is None:
                data = sock.recv(65536)
                assert data, "the connection closed before run.done"
                buffer += data
            elif frame[0] == 0x1:
                events.append(json.loads(frame[1]))
    _whole([("", e) for e in events])


def test_a_resume_with_last_event_id_on_either_worker_gets_the_rest_once(two: Served) -> None:
    a, _ = _on(two.url, 0)
    b, _ = _on(two.url, 1)
    with closing(a), closing(b):
        run = _start(a)
        path = _path(run["events_url"])
        head = _events(a, path, limit=10)  # worker 0, then gone (the connection with it)
        middle = _events(b, path, last_event_id=head[-1][0], limit=20)  # worker 1
    again, _ = _on(two.url, 0)
    with closing(again):
        rest = _events(again, path, last_event_id=middle[-1][0])  # back on worker 0
    assert head[-1][0] == f"{run['run_id']}:10"
    _whole(head + middle + rest)


@pytest.fixture(scope="module")
def agents(
    redis_server: RedisServer,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """`rillet serve --workers 2 --tools demo`, its provider calling `get_weather` first."""
    tmp = tmp_path_factory.mktemp("agents")
    with (
        _provider("--tool", "get_weather") as url,
        _serve(tmp, redis_server.url, url, "--workers", "2", "--tools", "demo") as served,
    ):
        yield served


def test_an_agent_run_reaches_run_done_for_a_reader_on_the_worker_driving_it(
    agents: Served,
) -> None:
    """A reader that follows an agent run live on the worker that drives it gets it through
    `answer.done` and `run.done`, as a reader on the other worker does."""
    for worker in (0, 1):
        client, _ = _on(agents.url, worker)
        other, _ = _on(agents.url, 1 - worker)
        with closing(client), closing(other):
            run = _start(client)
            here = _events(client, _path(run["events_url"]), within=20)
            there = _events(other, _path(run["events_url"]), within=20)
        kinds = [e["type"] for _, e in here]
        assert "tool.completed" in kinds
        assert kinds[-2:] == ["answer.done", "run.done"], kinds
        _whole(here)
        assert here == there


def test_a_cancel_reaching_the_other_worker_cancels_the_run(two: Served) -> None:
    a, _ = _on(two.url, 0)
    b, _ = _on(two.url, 1)
    with closing(a), closing(b):
        run = _start(a)
        path = _path(run["events_url"])
        first = _events(b, path, limit=3)  # it streams (on worker 1, a connection now gone)
    other, _ = _on(two.url, 1)
    with closing(other):
        auth = {"authorization": f"Bearer {run['act_token']}"}
        cancelled = other.delete(f"/v1/runs/{run['run_id']}", headers=auth)
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json() == {"run_id": run["run_id"]}
        rest = _events(other, path, last_event_id=first[-1][0])
    events = first + rest
    assert [e["seq"] for _, e in events] == list(range(1, len(events) + 1))
    assert events[-1][1]["type"] == "run.done"
    assert events[-1][1]["status"] == "cancelled", events[-1][1]
    deltas = [e for _, e in events if e["type"] == "answer.delta"]
    assert len(deltas) < CHUNKS


LEASE_AND_BLOCK = 9.0 + 5.0  # the hub's lease, then a quiet read's block before it checks


@attrs.define
class Killed:
    """What readers saw of a run whose driving worker was SIGKILLed 2 s in."""

    run: dict[str, Any]
    live: Events  # the live reader's events, on the other worker
    waited: float  # seconds from the kill to the live reader's end
    resumed: Events  # a resume from after the live reader's sixth event
    cancel: httpx.Response  # a cancel with the run's act token, after its end
    taken: int  # runs taken over, over both workers


def _kill_the_driver(served: Served, *, approve: bool = False) -> tuple[Killed, httpx.Response]:
    """Start a run on worker 0, follow it live on worker 1, SIGKILL worker 0 2 s in; then
    resume, cancel and (with `approve`) answer an approval on worker 1."""
    driver, metrics = _on(served.url, 0)
    reader, _ = _on(served.url, 1)
    with closing(driver), closing(reader):
        run = _start(driver)
        path = _path(run["events_url"])
        live: Events = []
        follower = threading.Thread(
            target=lambda: live.extend(_events(reader, path, within=60)), daemon=True
        )
        follower.start()
        time.sleep(2.0)  # the run streams meanwhile
        os.kill(metrics["pid"], signal.SIGKILL)
        killed = time.monotonic()
        follower.join(timeout=60)
        assert not follower.is_alive()
        waited = time.monotonic() - killed
        other, _ = _on(served.url, 1)
        with closing(other):
            resumed = _events(other, path, last_event_id=live[5][0], within=30)
            auth = {"authorization": f"Bearer {run['act_token']}"}
            cancel = other.delete(f"/v1/runs/{run['run_id']}", headers=auth)
            answer = other.post(
                f"/v1/runs/{run['run_id']}/approvals/a1", headers=auth, json={"approve": approve}
            )
        taken = sum(_metrics(served.url, w)["runs_taken_over"] for w in (0, 1))
    return Killed(run, live, waited, resumed, cancel, taken), answer


def test_readers_of_a_run_whose_worker_is_killed_get_server_lost_without_takeover(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`--no-takeover`, SIGKILL to the worker driving a 30 s run, 2 s in: the live reader on
    the other worker gets `run.done` (`error`, `server_lost`) within the lease time; a resume
    with its `Last-Event-ID` gets the same end; a cancel answers as for a finished run (202),
    an approval 409."""
    with (
        _provider("--chunks", "600") as provider,
        _serve(tmp_path, redis_server.url, provider, "--workers", "2", "--no-takeover") as served,
    ):
        killed, approve = _kill_the_driver(served, approve=True)
    live, waited, resumed, cancel = killed.live, killed.waited, killed.resumed, killed.cancel
    assert killed.taken == 0
    assert [e["seq"] for _, e in live] == list(range(1, len(live) + 1))
    end = live[-1][1]
    assert (end["type"], end["status"], end["code"]) == ("run.done", "error", "server_lost")
    assert 5 < len(live) < 600
    assert waited < LEASE_AND_BLOCK + 3.0, waited
    assert resumed == live[6:]
    assert cancel.status_code == 202, cancel.text
    assert cancel.json() == {"run_id": killed.run["run_id"]}
    assert approve.status_code == 409, approve.text
    assert approve.json()["error"]["type"] == "approval_not_waiting"


TAKEN = 120  # deltas of a run taken over: 6 s


def test_a_run_whose_worker_is_killed_finishes_on_another_with_every_character_once(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SIGKILL to the worker driving a run, 2 s in: another worker takes the run over once the
    lease has run out and runs it again. The live reader on the other worker gets one gapless
    stream: what the lost worker streamed, `status` `taken_over`, `attempt.reset`, then the
    whole answer once, `completed`; a resume from before the takeover gets the same rest; the
    run's act token still reaches it (a cancel after its end answers 202)."""
    with (
        _provider("--chunks", str(TAKEN)) as provider,
        _serve(tmp_path, redis_server.url, provider, "--workers", "2") as served,
    ):
        killed, _ = _kill_the_driver(served)
    live, waited, resumed, cancel = killed.live, killed.waited, killed.resumed, killed.cancel
    types = [e["type"] for _, e in live]
    assert [e["seq"] for _, e in live] == list(range(1, len(live) + 1))
    assert types.count("run.started") == 1
    phases = [e.get("phase") for _, e in live if e["type"] == "status"]
    assert phases.count("taken_over") == 1, phases
    reset = max(i for i, kind in enumerate(types) if kind == "attempt.reset")
    before = "".join(e["delta"] for _, e in live[:reset] if e["type"] == "answer.delta")
    after = "".join(e["delta"] for _, e in live[reset:] if e["type"] == "answer.delta")
    assert 0 < len(before) < len("".join(fragments(TAKEN)))  # cut midway by the kill
    assert after == "".join(fragments(TAKEN))
    end = live[-1][1]
    assert (end["type"], end["status"], end["code"]) == ("run.done", "completed", "completed")
    assert waited < LEASE_AND_BLOCK + 3.0 + TAKEN * GAP, waited
    assert resumed == live[6:]
    assert killed.taken == 1
    assert cancel.status_code == 202, cancel.text


def test_a_cancel_with_a_wrong_or_read_token_on_the_other_worker_is_not_found(
    two: Served,
) -> None:
    a, _ = _on(two.url, 0)
    b, _ = _on(two.url, 1)
    with closing(a), closing(b):
        run = _start(a)
        url = f"/v1/runs/{run['run_id']}"
        refused = [
            b.delete(url, params={"token": "not-the-token"}),
            b.delete(url, params={"token": run["token"]}),  # the read token reads, no more
            b.delete(url, headers={"authorization": f"Bearer {run['token']}"}),
        ]
        assert [r.status_code for r in refused] == [404] * 3
        _whole(_events(a, _path(run["events_url"])))  # not cancelled


def test_a_worker_that_dies_is_started_again(
    redis_server: RedisServer,  # noqa: F811
    provider: str,
    tmp_path: Path,
) -> None:
    with _serve(tmp_path, redis_server.url, provider, "--workers", "2") as served:
        killed = _metrics(served.url, 1)["pid"]
        os.kill(killed, signal.SIGKILL)
        client, metrics = _wait_for(
            lambda: (found := _on(served.url, 1)) and found[1]["pid"] != killed and found,
            "worker 1 to serve again",
        )
        with closing(client):
            assert metrics["pid"] != killed
            _whole(_events(client, _path(_start(client)["events_url"])))
        assert "worker 1 (pid" in served.log.read_text()


def test_sigterm_to_the_supervisor_stops_every_worker(
    redis_server: RedisServer,  # noqa: F811
    provider: str,
    tmp_path: Path,
) -> None:
    with _serve(tmp_path, redis_server.url, provider, "--workers", "2") as served:
        pids = served.pids()
        assert len(pids) == 2
        assert all(_alive(pid) for pid in pids)
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0
        _wait_for(lambda: not any(_alive(pid) for pid in pids), "the workers to end", 10)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{served.url}/healthz", timeout=5)


def test_ctrl_c_to_the_process_group_stops_every_worker_once(
    redis_server: RedisServer,  # noqa: F811
    provider: str,
    tmp_path: Path,
) -> None:
    with _serve(tmp_path, redis_server.url, provider, "--workers", "2") as served:
        pids = served.pids()
        os.killpg(served.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert served.process.wait(timeout=30) == 130
        _wait_for(lambda: not any(_alive(pid) for pid in pids), "the workers to end", 10)
    log = served.log.read_text()
    assert "starting it again" not in log  # no worker was taken for dead
    assert log.count("SIGTERM, stopping") == 2  # each stopped by its supervisor


def _fail_to_start() -> None:
    """A worker setup that fails: the worker cannot start."""
    raise RuntimeError("no worker today")


async def test_a_worker_that_cannot_start_stops_serve_with_its_cause(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    config = ServerConfig(
        provider=chat_provider("http://127.0.0.1:1"),
        port=0,
        workers=2,
        redis_url=redis_server.url,
    )
    with pytest.raises(WorkerFailed, match=r"did not start: RuntimeError: no worker today"):
        await serve(config, worker_setup=_fail_to_start)


async def _first(client: httpx.AsyncClient, path: str, kind: str) -> dict[str, Any]:
    """The run's first event of type `kind`, read over SSE (the stream then closed)."""
    decoder = SSEDecoder()
    found: dict[str, Any] = {}
    async with client.stream("GET", path) as response:
        with trio.CancelScope() as cut:  # cancelled, not broken out of: the body is closed
            async for chunk in response.aiter_raw():
                for frame in decoder.feed(chunk):
                    event = json.loads(frame.data)
                    if event["type"] == kind and not found:
                        found = event
                        cut.cancel()
    assert found, f"no {kind} event"
    return found


async def test_an_approval_answered_on_another_server_reaches_the_run(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """Two servers sharing a Redis (as two workers do), in this process: an agent run on one
    waits for an approval; the answer posted to the other is handed over (`_control`), lets the
    call run, and a second answer there is refused as the run's own server refuses it."""
    script = tool_then_answer("delete_file", {"path": "a.txt"})
    async with open_loopback_provider(script) as loopback:
        config = ServerConfig(
            provider=chat_provider(loopback.url),
            port=0,
            redis_url=redis_server.url,
            tools="demo",
        )
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                url1 = await nursery.start(functools.partial(serve, config))
                url2 = await nursery.start(functools.partial(serve, config))
                async with (
                    httpx.AsyncClient(base_url=url1) as one,
                    httpx.AsyncClient(base_url=url2) as two,
                ):
                    run = (await one.post("/v1/runs", json={"prompt": "tidy up"})).json()
                    path = f"/v1/runs/{run['run_id']}/events?token={run['token']}"
                    approval_id = (await _first(two, path, "approval.required"))["approval_id"]
                    url = f"/v1/runs/{run['run_id']}/approvals/{approval_id}"
                    auth = {"authorization": f"Bearer {run['act_token']}"}
                    reader = {"authorization": f"Bearer {run['token']}"}
                    read_only = await two.post(url, json={"approve": True}, headers=reader)
                    approved = await two.post(url, json={"approve": True}, headers=auth)
                    again = await two.post(url, json={"approve": False}, headers=auth)
                    stranger = await two.post(
                        url, json={"approve": True}, headers={"authorization": "Bearer nope"}
                    )
                    whole = await read_sse(two, path)
                nursery.cancel_scope.cancel()
    assert approved.status_code == 200, approved.text
    assert approved.json() == {
        "run_id": run["run_id"],
        "approval_id": approval_id,
        "decision": "approved",
    }
    assert again.status_code == 409
    assert again.json()["error"]["type"] == "approval_not_waiting"
    assert stranger.status_code == read_only.status_code == 404
    assert stranger.content == read_only.content
    kinds = [json.loads(e.data)["type"] for e in whole.events]
    assert "tool.completed" in kinds
    assert kinds[-1] == "run.done"
    assert json.loads(whole.events[-1].data)["status"] == "completed"


async def test_serve_with_workers_in_a_trio_app_starts_them_and_stops_them_when_cancelled(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """The library's way: `serve(ServerConfig(workers=2, ...))` in a nursery supervises two
    processes; cancelling it stops both."""
    config = ServerConfig(
        provider=chat_provider("http://127.0.0.1:1"),
        port=0,
        workers=2,
        redis_url=redis_server.url,
    )
    seen: dict[int, int] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve, config))
            for _ in range(400):  # fresh connections until both workers answered
                async with httpx.AsyncClient(base_url=url) as client:
                    metrics = (await client.get("/metrics.json")).json()
                seen[metrics["worker"]] = metrics["pid"]
                if len(seen) == 2:
                    break
            nursery.cancel_scope.cancel()
    assert sorted(seen) == [0, 1]
    assert os.getpid() not in seen.values()
    assert not any(_alive(pid) for pid in seen.values())  # serve waited for them to end


def test_the_restart_pause_follows_recent_deaths_not_every_death_ever() -> None:
    """A worker that dies again soon waits longer each time; one that dies once, long after
    its last death (out of the window), is started again after the first pause, not the
    longest it ever reached."""
    from rillet.transports.server._workers import restart_pause

    assert [restart_pause(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert restart_pause(1) == 0.5  # the only death within the window: the first pause again
