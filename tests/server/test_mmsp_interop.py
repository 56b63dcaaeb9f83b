"""The `mmsp` package's own client (PyPI, pinned) against rillet's MMSP endpoint.

A user of MMSP points `mmsp.mmsp.MmspClient` at any MMSP server; rillet's `POST /v1/stream` must
be one. The `mmsp` package pulls in provider SDKs and pydantic, which rillet must never depend
on, so the client runs in a virtualenv of its own (created here on first use: `python -m venv`,
then `pip install mmsp==<pinned>`), as a subprocess that prints what the client yielded as JSON.

For every recorded streaming fixture of the chat dialects, the same conversation goes two ways
through the loopback provider playing that fixture: a rillet turn run directly (the reference),
and the mmsp client through the server. The client must yield the turn's UniEvents exactly (all
but `created_at`, the only field two runs of one reply may differ in), raise the error the turn
ended with, and the provider must have been sent the same request both ways.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import msgspec
import pytest
import trio
from rillet import RescueFailed
from rillet._core._dialect import Provider, Secret
from rillet._core._events import UniEvent, UniMessage
from rillet._core._policy import Policy
from rillet._core._request import ToolSpec, TurnRequest
from rillet._turn._api import open_turn
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_stream,
    split,
    status_reply,
)

from ..providers.test_fixtures import dialect_for
from ..wire_cases import cases, wire_path

if TYPE_CHECKING:
    from rillet.transports.testing import LoopbackProvider

pytestmark = pytest.mark.slow

MMSP_VERSION = "0.5.6"
ROOT = Path(__file__).resolve().parent.parent.parent
INTEROP_VENV = Path(os.environ.get("RILLET_INTEROP_VENV") or ROOT / ".venv" / "interop")
SERVER_KEY = "interop-server-key-0123456789"

# one attempt, no rescue: a failure is the turn's own error, the same both ways
ONE_ATTEMPT = Policy(
    transport_retries=0, rate_limit_retries=0, rescue=False, backoff_base=0.01, random=lambda: 0.0
)
CHAT_FOLDERS = ("anthropic-messages", "gemini", "ollama-chat", "openai-chat", "openai-responses")

# the conversation every case sends: multi-byte text, a tool call and its result
MESSAGES: list[dict[str, Any]] = [
    {
        "role": "user",
        "content_items": [{"type": "text.done", "text": "Quel temps fait-il à Paris ? 天気は？ 🌦"}],
    },
    {
        "role": "assistant",
        "content_items": [
            {"type": "text.done", "text": "Je regarde — un instant."},
            {
                "type": "tool_call.done",
                "name": "get_weather",
                "arguments": {"city": "Paris"},
                "tool_call_id": "call_interop_1",
            },
        ],
        "finish_reason": "tool_call",
    },
    {
        "role": "user",
        "content_items": [
            {
                "type": "tool_result.done",
                "text": "18 °C, pluie fine",
                "tool_call_id": "call_interop_1",
            }
        ],
    },
]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CONFIG: dict[str, Any] = {
    "max_tokens": 512,
    "temperature": 0.2,
    "system_prompt": "Réponds en une phrase.",
    "tools": [WEATHER],
    "tool_choice": "auto",
}

# the client side: runs in the interop virtualenv, reads the jobs as JSON on stdin, prints what
# the client yielded (bytes back in base64, as on the wire) or raised, as JSON on stdout
CLIENT = r"""
import asyncio, copy, json, sys
from mmsp.errors import UpstreamError
from mmsp.mmsp import MmspClient
from mmsp.wire import encode_wire

async def job(spec, base_url, api_key, model):
    client = MmspClient(model=model, api_key=api_key, base_url=base_url)
    events, error = [], None
    try:
        messages = copy.deepcopy(spec["messages"])
        async for event in client.streaming_response(messages, copy.deepcopy(spec["config"])):
            events.append(encode_wire(event))
    except UpstreamError as exc:
        error = {"class": "UpstreamError", "status": exc.status, "error_type": exc.error_type,
                 "error": exc.error}
    except Exception as exc:
        error = {"class": type(exc).__name__, "message": str(exc)}
    finally:
        await client._client.aclose()
    return {"events": events, "error": error}

async def main():
    spec = json.load(sys.stdin)
    out = {"models": {}, "jobs": []}
    for name, server in spec["servers"].items():
        client = MmspClient(model="any", api_key=server["key"], base_url=server["base_url"])
        out["models"][name] = await client.list_models()
        await client._client.aclose()
    for item in spec["jobs"]:
        server = spec["servers"][item["server"]]
        key = server["key"] if item["with_key"] else None
        out["jobs"].append(await job(spec, server["base_url"], key, item["model"]))
    json.dump(out, sys.stdout, ensure_ascii=False)

asyncio.run(main())
"""


# --- the interop virtualenv -----------------------------------------------------------------------


def interop_python() -> Path:
    """The interpreter of the virtualenv holding `mmsp==MMSP_VERSION`, created if missing (built
    aside, then moved into place, so a half-made one is never used). Skips when it cannot be
    made."""
    python = INTEROP_VENV / "bin" / "python"
    stamp = INTEROP_VENV / f".mmsp-{MMSP_VERSION}"
    if stamp.exists() and python.exists():
        return python
    INTEROP_VENV.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".interop-", dir=INTEROP_VENV.parent))
    try:
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q"]
        steps = {
            "python -m venv": [sys.executable, "-m", "venv", str(building)],
            f"pip install mmsp=={MMSP_VERSION}": [
                *pip,
                "--disable-pip-version-check",
                f"mmsp=={MMSP_VERSION}",
            ],
        }
        for name, step in steps.items():
            try:
                done = subprocess.run(
                    step, capture_output=True, text=True, timeout=900, check=False
                )
            except subprocess.TimeoutExpired:
                pytest.skip(f"cannot make the interop virtualenv: {name} timed out")
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-2:]
                pytest.skip(
                    f"cannot make the interop virtualenv: {name} failed ({' / '.join(tail)})"
                )
        (building / f".mmsp-{MMSP_VERSION}").touch()
        building.chmod(0o755)
        shutil.rmtree(INTEROP_VENV, ignore_errors=True)
        os.rename(building, INTEROP_VENV)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return python


# --- the cases ------------------------------------------------------------------------------------


@attrs.frozen
class Case:
    """A provider reply, played the same to the reference turn and through the server."""

    folder: str  # which dialect reads it
    name: str
    reply: Reply

    @property
    def model(self) -> str:
        return f"{self.folder}.{self.name}"


def _fixture_cases() -> list[Case]:
    found = []
    for folder in CHAT_FOLDERS:
        for name in cases(folder):
            path = wire_path(folder, name)
            if path.suffix in (".sse", ".ndjson"):  # the streamed ones
                found.append(Case(folder, name, fixture_reply(path, chunk_size=37)))
    return found


MULTIBYTE = ["Bonjour", " — こんにちは", " (日本語),", " Привет", " 👋🏽", " ✓"]
CASES = [
    *_fixture_cases(),
    # chunks of 5 bytes: the provider's frames and multi-byte characters split everywhere
    Case("openai-chat", "multibyte_split", Reply(chunks=split(openai_text_stream(MULTIBYTE), 5))),
    Case("openai-chat", "refused_401", status_reply(401)),
    Case("openai-chat", "rate_limited_429", status_reply(429, retry_after=7)),
    # silent before its first frame and between frames: the server's keep-alive comments
    # (every HEARTBEAT seconds) come in between, and the client must skip them
    Case(
        "openai-chat",
        "slow_with_keepalives",
        Reply(
            chunks=tuple(
                f + b"\n\n" for f in openai_text_stream(["Lente", "ment ✓"]).split(b"\n\n") if f
            ),
            headers_delay=0.5,
            chunk_delay=0.25,
        ),
    ),
]
HEARTBEAT = 0.1
BY_MODEL = {case.model: case for case in CASES}
KEYED_MODEL = "openai-chat.multibyte_split"  # what the keyed server offers


@attrs.frozen
class Reference:
    """What a rillet turn made of a case: its UniEvents, its error, the request it sent."""

    events: list[dict[str, Any]]
    error: BaseException | None
    request: RecordedRequest


@attrs.frozen
class Interop:
    """Everything both sides produced."""

    references: dict[str, Reference]
    served: dict[str, dict[str, Any]]  # model -> what the mmsp client yielded or raised
    requests: dict[str, RecordedRequest]  # model -> what the server sent the provider
    models: dict[str, list[str]]
    keyed: list[dict[str, Any]]  # the keyed server: with the key, without it
    raw_slow: bytes  # the slow case's stream as the server wrote it


def _script(request: RecordedRequest, n: int) -> Reply:
    del n
    _, _side, folder, name, *_ = request.path.split("/")
    return BY_MODEL[f"{folder}.{name}"].reply


def _provider(base: str, side: str, case: Case) -> Provider:
    return Provider(
        dialect_for(case.folder), f"{base}/{side}/{case.folder}/{case.name}", case.model
    )


def _request() -> TurnRequest:
    """The conversation and settings as the server decodes them from MMSP's request."""
    return TurnRequest(
        messages=msgspec.convert(MESSAGES, list[UniMessage]),
        system_prompt=CONFIG["system_prompt"],
        tools=[msgspec.convert(WEATHER, ToolSpec)],
        tool_choice=CONFIG["tool_choice"],
        max_tokens=CONFIG["max_tokens"],
        temperature=CONFIG["temperature"],
    )


async def _reference(loopback: LoopbackProvider, case: Case) -> Reference:
    async with open_turn(_request(), _provider(loopback.url, "ref", case), policy=ONE_ATTEMPT) as t:
        items = [item async for item in t.uni_events()]
        result = await t.result()
    assert all(isinstance(item, UniEvent) for item in items), "one attempt: no reset"
    error = result.error
    if isinstance(error, RescueFailed):
        error = error.stream_error or error.rescue_error
    sent = [r for r in loopback.requests if r.path.startswith(f"/ref/{case.folder}/{case.name}/")]
    assert len(sent) == 1, case.model
    return Reference([msgspec.to_builtins(item) for item in items], error, sent[0])


async def _collect(python: Path) -> Interop:
    with trio.fail_after(240):
        async with open_loopback_provider(_script) as loopback, trio.open_nursery() as nursery:
            references = {case.model: await _reference(loopback, case) for case in CASES}

            def by_model(model: str) -> Provider:
                return _provider(loopback.url, "srv", BY_MODEL[model])

            models = [case.model for case in CASES]
            open_config = ServerConfig(
                provider=by_model,
                port=0,
                models=models,
                policy=ONE_ATTEMPT,
                limits=Limits(heartbeat=HEARTBEAT),
            )
            open_url = await nursery.start(functools.partial(serve, open_config))
            keyed_config = ServerConfig(
                provider=by_model,
                port=0,
                models=[KEYED_MODEL],
                policy=ONE_ATTEMPT,
                api_key=Secret(SERVER_KEY),
            )
            keyed_url = await nursery.start(functools.partial(serve, keyed_config))
            spec = {
                "messages": MESSAGES,
                "config": CONFIG,
                "servers": {
                    "open": {"base_url": f"{open_url}/v1", "key": None},
                    "keyed": {"base_url": f"{keyed_url}/v1", "key": SERVER_KEY},
                },
                "jobs": [{"server": "open", "model": m, "with_key": False} for m in models]
                + [
                    {"server": "keyed", "model": KEYED_MODEL, "with_key": True},
                    {"server": "keyed", "model": KEYED_MODEL, "with_key": False},
                ],
            }
            done = await trio.run_process(
                [str(python), "-c", CLIENT],
                stdin=json.dumps(spec, ensure_ascii=False).encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={**os.environ, "PYTHONIOENCODING": "utf-8"},
            )
            # the same slow stream read raw: the comments the client had to skip were there
            async with httpx.AsyncClient(base_url=open_url, timeout=30) as http:
                raw = await http.post(
                    "/v1/stream",
                    json={
                        "model": "openai-chat.slow_with_keepalives",
                        "messages": MESSAGES,
                        "config": CONFIG,
                    },
                )
            requests = {
                case.model: [
                    r
                    for r in loopback.requests
                    if r.path.startswith(f"/srv/{case.folder}/{case.name}/")
                ]
                for case in CASES
            }
            nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    out = json.loads(done.stdout)
    jobs = out["jobs"]
    return Interop(
        references=references,
        served=dict(zip(models, jobs[: len(models)], strict=True)),
        requests={m: r[0] for m, r in requests.items() if r},
        models=out["models"],
        keyed=jobs[len(models) :],
        raw_slow=raw.content,
    )


@pytest.fixture(scope="module")
def interop() -> Interop:
    return trio.run(_collect, interop_python())


# --- tests ----------------------------------------------------------------------------------------


def unstamped(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in event.items() if k != "created_at"} for event in events]


@pytest.mark.parametrize("model", [c.model for c in CASES])
def test_the_mmsp_client_yields_the_turns_uni_events(interop: Interop, model: str) -> None:
    reference = interop.references[model]
    served = interop.served[model]
    assert unstamped(served["events"]) == unstamped(reference.events)
    assert all(isinstance(e["created_at"], int) and e["created_at"] > 0 for e in served["events"])
    if reference.error is None:
        assert served["error"] is None
        assert served["events"][-1]["event_type"] == "stop"
    else:
        error = served["error"]
        assert error is not None, "the client must raise what the turn ended with"
        assert error["class"] == "UpstreamError"
        assert error["error_type"] == type(reference.error).__name__
        assert error["error"]["message"]


@pytest.mark.parametrize("model", [c.model for c in CASES])
def test_the_provider_is_sent_the_same_request_either_way(interop: Interop, model: str) -> None:
    reference = interop.references[model].request
    served = interop.requests[model]
    assert msgspec.json.decode(served.body) == msgspec.json.decode(reference.body)
    assert served.method == reference.method
    assert served.path.removeprefix("/srv") == reference.path.removeprefix("/ref")


def test_multibyte_text_split_anywhere_arrives_whole(interop: Interop) -> None:
    served = interop.served["openai-chat.multibyte_split"]
    text = "".join(
        item["text"]
        for event in served["events"]
        for item in event["content_items"]
        if item["type"] == "text.delta"
    )
    assert text == "".join(MULTIBYTE)


def test_a_refusal_reaches_the_client_with_its_status(interop: Interop) -> None:
    refused = interop.served["openai-chat.refused_401"]["error"]
    limited = interop.served["openai-chat.rate_limited_429"]["error"]
    assert refused["status"] == 401
    assert refused["error_type"] == "AuthenticationError"
    assert limited["status"] == 429
    assert limited["error_type"] == "RateLimitError"
    assert limited["error"]["retry_after"] == 7


def test_the_client_skips_the_keep_alive_comments(interop: Interop) -> None:
    served = interop.served["openai-chat.slow_with_keepalives"]
    assert served["error"] is None
    assert served["events"][-1]["event_type"] == "stop"
    # what the client skipped: comments before the first event and between events
    before, _, after = interop.raw_slow.partition(b"data: ")
    assert before.count(b": keep-alive\n\n") >= 2
    assert after.count(b": keep-alive\n\n") >= 1


def test_the_client_lists_the_servers_models(interop: Interop) -> None:
    assert interop.models["open"] == [case.model for case in CASES]
    assert interop.models["keyed"] == [KEYED_MODEL]


def test_a_keyed_server_takes_the_clients_key_and_refuses_none(interop: Interop) -> None:
    with_key, without = interop.keyed
    assert with_key["error"] is None
    assert with_key["events"][-1]["event_type"] == "stop"
    assert unstamped(with_key["events"]) == unstamped(interop.references[KEYED_MODEL].events)
    assert without["events"] == []
    assert without["error"]["status"] == 401
    assert without["error"]["error_type"] == "AuthenticationError"


def test_the_cases_cover_every_kind_of_item_and_both_endings(interop: Interop) -> None:
    kinds = {
        item["type"]
        for served in interop.served.values()
        for event in served["events"]
        for item in event["content_items"]
    }
    for kind in ("text", "thinking", "tool_call", "inline_data"):
        assert {f"{kind}.delta", f"{kind}.done"} <= kinds
    failed_midway = [s for s in interop.served.values() if s["error"] and s["events"]]
    assert len(failed_midway) >= 5  # errors after events, not only refusals


def test_every_chat_fixture_is_exercised() -> None:
    models = {case.model for case in CASES}
    for folder in CHAT_FOLDERS:
        streamed = [n for n in cases(folder) if wire_path(folder, n).suffix != ".json"]
        assert streamed
        assert {f"{folder}.{n}" for n in streamed} <= models
