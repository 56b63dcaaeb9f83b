"""The peers' driver: what a user would pick instead of rillet, on the same bytes.

Run by the benchmark runner with the peers' virtualenv's interpreter (bench/.venv-peers, which
`make bench` creates), once per round, from the repository root:

    bench/.venv-peers/bin/python -m bench.peers --dir bench/out/streams --streams a,b --only x,y

It reads the streams the runner wrote (each body with its read boundaries and the fingerprint of
what it decodes to), answers every request from an in-memory httpx transport with those reads,
and times each contestant's whole consumption of each stream: the request, iterating the stream
and assembling the final reply, in CPU seconds (`time.process_time`). Imports and the
construction of clients (the SDK's and its httpx client) are not timed; a warm-up call per
contestant and stream kind runs before any timing. It prints one
JSON document on stdout.

With `--rillet SITE` (rillet's site-packages, appended to the path after this venv's own),
rillet's `run_turn` is timed on each stream right before or right after each peer (which goes
first alternates with `--round`), reported as `pipeline:<peer>`: each peer's ratio then
divides two figures from this one process, taken moments apart.

Contestants (the ones whose library is missing are reported "not available" with the reason):

- `limit-sync`: the limit loop read through a sync httpx client (split lines, decode each data
  line with msgspec when this venv has it, else the json module): this process's baseline;
- `openai-iter`: `client.chat.completions.create(stream=True)`, iterated and assembled;
- `openai-helper`: `client.chat.completions.stream()`, iterated, `get_final_completion()`;
- `anthropic-iter`: `client.messages.create(stream=True)`, raw events iterated and assembled;
- `anthropic-helper`: `client.messages.stream()`, iterated, `get_final_message()`;
- `litellm`: `litellm.completion(stream=True)`, chunks collected, `stream_chunk_builder`;
- `mmsp`: MMSP 0.5.6's `streaming_response` (its `openai-chat` or `ant-messages` client, its SDK
  client given an httpx client on the in-memory transport), done items assembled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import os
import site
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .transport import transport_class
from .wire import digest

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["CONTESTANTS", "main", "paired"]

_BASE_OPENAI = "http://bench.invalid/v1"
_BASE_ANTHROPIC = "http://bench.invalid"
_KEY = "sk-bench-0000000000000000"
_MESSAGES = [{"role": "user", "content": "Write the notes down."}]

# contestant -> the stream families it consumes ("openai" = Chat Completions, "anthropic")
CONTESTANTS: dict[str, tuple[str, ...]] = {
    "limit-sync": ("openai", "anthropic"),
    "openai-iter": ("openai",),
    "openai-helper": ("openai",),
    "anthropic-iter": ("anthropic",),
    "anthropic-helper": ("anthropic",),
    "litellm": ("openai",),
    "mmsp": ("openai", "anthropic"),
}
_PACKAGES = {
    "openai-iter": "openai",
    "openai-helper": "openai",
    "anthropic-iter": "anthropic",
    "anthropic-helper": "anthropic",
    "litellm": "litellm",
    "mmsp": "mmsp",
}


def family(kind: str) -> str | None:
    """The stream family of a stream kind, for the peers that speak it."""
    if kind.startswith("openai-chat"):
        return "openai"
    if kind.startswith("anthropic"):
        return "anthropic"
    return None


class _Loaded:
    """One stream as the runner wrote it."""

    def __init__(self, directory: Path, name: str) -> None:
        meta = json.loads((directory / f"{name}.json").read_text("utf-8"))
        data = (directory / f"{name}.bin").read_bytes()
        self.name = name
        self.kind: str = meta["kind"]
        self.dialect: str = meta.get("dialect", "")
        self.events: int = meta["events"]
        self.content_type: str = meta["content_type"]
        self.digest: str = meta["digest"]
        self.chunks: list[bytes] = []
        i = 0
        for n in meta["lengths"]:
            self.chunks.append(data[i : i + n])
            i += n

    def transport(self, module: ModuleType = httpx) -> Any:
        return transport_class(module)(self.chunks, self.content_type)


def _with_http(make: Callable[[Any], Any], s: _Loaded, *, sync: bool) -> Any:
    """`make(http_client)` with an httpx client on the in-memory transport, or an httpx2 one
    for an SDK built on that fork (it refuses the other's client)."""
    try:
        module: ModuleType = httpx
        client = module.Client if sync else module.AsyncClient
        return make(client(transport=s.transport(module)))
    except TypeError as exc:
        if "httpx2" not in str(exc):
            raise
    module = importlib.import_module("httpx2")
    client = module.Client if sync else module.AsyncClient
    return make(client(transport=s.transport(module)))


def _args_of(parts: dict[int, list[str]]) -> list[object]:
    return [json.loads("".join(parts[i])) for i in sorted(parts)]


# --- the contestants: setup (untimed) returns the timed call, which returns the fingerprint of
# --- what it assembled


Run = Callable[[], str]


def _limit_sync(s: _Loaded) -> Run:
    """Split lines, decode each data line; no assembly beyond counting (the floor)."""
    try:
        decode: Any = importlib.import_module("msgspec").json.decode
    except ImportError:
        decode = json.loads
    client = httpx.Client(transport=s.transport())

    def run() -> str:
        n = 0
        tail = b""
        with client.stream("POST", _BASE_OPENAI) as response:
            for c in response.iter_bytes():
                lines = (tail + c).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        decode(line[6:])
                        n += 1
        return s.digest if n >= s.events else f"decoded {n} frames"

    return run


def _openai_client(s: _Loaded) -> Any:
    openai: Any = importlib.import_module("openai")
    return _with_http(
        lambda http: openai.OpenAI(
            api_key=_KEY, base_url=_BASE_OPENAI, http_client=http, max_retries=0
        ),
        s,
        sync=True,
    )


def _openai_iter(s: _Loaded) -> Run:
    client = _openai_client(s)

    def run() -> str:
        text: list[str] = []
        args: dict[int, list[str]] = {}
        stream = client.chat.completions.create(
            model="gpt-4o",
            messages=_MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or ():
                if call.function is not None and call.function.arguments:
                    args.setdefault(call.index, []).append(call.function.arguments)
        return digest("".join(text), "", _args_of(args))

    return run


def _openai_helper(s: _Loaded) -> Run:
    client = _openai_client(s)

    def run() -> str:
        with client.chat.completions.stream(
            model="gpt-4o", messages=_MESSAGES, stream_options={"include_usage": True}
        ) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        message = final.choices[0].message
        calls = [json.loads(c.function.arguments) for c in message.tool_calls or ()]
        return digest(message.content or "", "", calls)

    return run


def _anthropic_client(s: _Loaded) -> Any:
    anthropic: Any = importlib.import_module("anthropic")
    return _with_http(
        lambda http: anthropic.Anthropic(
            api_key=_KEY, base_url=_BASE_ANTHROPIC, http_client=http, max_retries=0
        ),
        s,
        sync=True,
    )


def _anthropic_iter(s: _Loaded) -> Run:
    client = _anthropic_client(s)

    def run() -> str:
        text: list[str] = []
        thinking: list[str] = []
        args: dict[int, list[str]] = {}
        stream = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=32000, messages=_MESSAGES, stream=True
        )
        for event in stream:
            if event.type == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    text.append(delta.text)
                elif delta.type == "thinking_delta":
                    thinking.append(delta.thinking)
                elif delta.type == "input_json_delta":
                    args.setdefault(event.index, []).append(delta.partial_json)
        return digest("".join(text), "".join(thinking), _args_of(args))

    return run


def _anthropic_helper(s: _Loaded) -> Run:
    client = _anthropic_client(s)

    def run() -> str:
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=32000, messages=_MESSAGES
        ) as stream:
            for _ in stream:
                pass
            message = stream.get_final_message()
        text, thinking, calls = [], [], []
        for block in message.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "thinking":
                thinking.append(block.thinking)
            elif block.type == "tool_use":
                calls.append(block.input)
        return digest("".join(text), "".join(thinking), calls)

    return run


def _litellm(s: _Loaded) -> Run:
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    client = _openai_client(s)

    def run() -> str:
        chunks = []
        response = litellm.completion(
            model="openai/gpt-4o",
            messages=_MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            api_key=_KEY,
            api_base=_BASE_OPENAI,
            client=client,
            max_retries=0,
        )
        for c in response:
            chunks.append(c)
        final = litellm.stream_chunk_builder(chunks, messages=_MESSAGES)
        message = final.choices[0].message
        calls = [json.loads(c.function.arguments) for c in message.tool_calls or ()]
        return digest(message.content or "", "", calls)

    return run


def _mmsp(s: _Loaded) -> Run:
    client: Any
    if family(s.kind) == "openai":
        module: Any = importlib.import_module("mmsp.openai_chat")
        client = module.OpenaiChatClient(model="gpt-4o", api_key=_KEY, base_url=_BASE_OPENAI)
    else:
        module = importlib.import_module("mmsp.ant_messages")
        client = module.AntMessagesClient(
            model="claude-sonnet-4-5", api_key=_KEY, base_url=_BASE_ANTHROPIC
        )
    # the SDK client MMSP built, with every option it chose, reading from the same bytes
    sdk = client._client
    client._client = _with_http(lambda http: sdk.with_options(http_client=http), s, sync=False)
    messages = [{"role": "user", "content_items": [{"type": "text.done", "text": "Write."}]}]

    def run() -> str:
        text: list[str] = []
        thinking: list[str] = []
        calls: list[object] = []

        async def consume() -> None:
            async for event in client.streaming_response(messages=messages, config={}):
                for item in event["content_items"]:
                    kind = item["type"]
                    if kind == "text.done":
                        text.append(item["text"])
                    elif kind == "thinking.done":
                        thinking.append(item["thinking"])
                    elif kind == "tool_call.done":
                        arguments = item["arguments"]
                        if isinstance(arguments, str):
                            arguments = json.loads(arguments)
                        calls.append(arguments)

        _LOOP.run_until_complete(consume())
        return digest("".join(text), "".join(thinking), calls)

    return run


_LOOP = asyncio.new_event_loop()


def _rillet_pipeline(s: _Loaded) -> Run:
    """rillet's `run_turn` (the full actor pipeline) on the same bytes, in this process: the
    figure each peer is divided by. Needs rillet's site-packages on the path (`--rillet`)."""
    trio: Any = importlib.import_module("trio")
    contestants: Any = importlib.import_module("bench.contestants")
    client = contestants.http_client(s)
    provider = contestants.provider_for(s.dialect)
    request = contestants.request()

    async def turn() -> str:
        result = await contestants.run_turn(request, provider, client=client)
        if not result.ok:
            return f"turn {result.outcome.name}: {result.error!r}"[:200]
        digest_: str = contestants.message_digest(result.message)
        return digest_

    def run() -> str:
        got: str = trio.run(turn)
        return got

    return run


_SETUP: dict[str, Callable[[_Loaded], Run]] = {
    "limit-sync": _limit_sync,
    "openai-iter": _openai_iter,
    "openai-helper": _openai_helper,
    "anthropic-iter": _anthropic_iter,
    "anthropic-helper": _anthropic_helper,
    "litellm": _litellm,
    "mmsp": _mmsp,
}


def _available(name: str) -> str | None:
    """None when the contestant can run here, else why not."""
    package = _PACKAGES.get(name)
    if package is None:
        return None
    try:
        importlib.import_module(package)
    except Exception as exc:  # a heavy package may fail at import for any reason
        return f"import {package} failed: {type(exc).__name__}: {str(exc)[:160]}"
    return None


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for package in ("openai", "anthropic", "litellm", "mmsp", "httpx", "pydantic", "msgspec"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out


def _timed(run: Run, expected: str) -> dict[str, Any]:
    """One timed call: CPU and wall seconds, and whether it assembled the expected reply."""
    gc.collect()
    t0, w0 = time.process_time(), time.perf_counter()
    got = run()
    entry: dict[str, Any] = {
        "cpu": time.process_time() - t0,
        "wall": time.perf_counter() - w0,
        "valid": got == expected,
    }
    if got != expected:
        entry["error"] = f"assembled reply differs ({got} != {expected})"
    return entry


def _failed(entry: dict[str, Any], exc: Exception) -> None:
    entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    entry["trace"] = traceback.format_exc(limit=-3)[-900:]


def paired(name: str) -> str:
    """The name under which rillet's `run_turn` rounds interleaved with peer `name` (in the
    peers' process) are reported."""
    return f"pipeline:{name}"


def main(argv: list[str] | None = None) -> None:
    """Time the named contestants on the named streams; print JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--streams", required=True, help="comma-separated stream names")
    parser.add_argument("--only", default="", help="comma-separated contestants (default: all)")
    parser.add_argument("--warmup", default="", help="a small stream per kind to warm up on")
    parser.add_argument(
        "--cap",
        action="append",
        default=[],
        help="NAME=EVENTS: run contestant NAME only on streams of at most EVENTS events",
    )
    parser.add_argument(
        "--rillet",
        default="",
        help="rillet's site-packages: time rillet's run_turn here too, alternating with each "
        "peer on each stream, so every ratio divides figures from this one process",
    )
    parser.add_argument(
        "--round", type=int, default=0, help="the round's number: odd rounds time rillet first"
    )
    args = parser.parse_args(argv)
    rillet: Callable[[_Loaded], Run] | None = None
    if args.rillet:
        # appended after this venv's own packages: the peers keep their httpx and msgspec
        site.addsitedir(args.rillet)
        rillet = _rillet_pipeline
    caps = {name: int(n) for name, _, n in (c.partition("=") for c in args.cap)}
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    names = [n for n in args.only.split(",") if n] or list(CONTESTANTS)
    streams = [_Loaded(args.dir, n) for n in args.streams.split(",") if n]
    warmups = {s.kind: s for s in (_Loaded(args.dir, n) for n in args.warmup.split(",") if n)}
    unavailable = {n: why for n in names if (why := _available(n)) is not None}
    results: list[dict[str, Any]] = []
    for name in names:
        if name in unavailable:
            continue
        setup = _SETUP[name]
        families = CONTESTANTS[name]
        warmed: set[str] = set()
        for s in streams:
            if family(s.kind) not in families or s.events > caps.get(name, s.events):
                continue
            entry: dict[str, Any] = {"contestant": name, "stream": s.name}
            ours: dict[str, Any] = {"contestant": paired(name), "stream": s.name}
            pair = rillet is not None and name != "limit-sync"
            try:
                if s.kind not in warmed:
                    warmed.add(s.kind)
                    setup(warmups.get(s.kind, s))()
                    if pair and rillet is not None:
                        rillet(warmups.get(s.kind, s))()
                steps = [(entry, setup(s))]
                if pair and rillet is not None:
                    steps.append((ours, rillet(s)))
            except Exception as exc:  # a peer that breaks is reported, not fatal
                _failed(entry, exc)
                results.append(entry)
                continue
            # rillet's round right before or right after the peer's, alternating by round
            for e, run in steps if args.round % 2 == 0 else steps[::-1]:
                try:
                    e.update(_timed(run, s.digest))
                except Exception as exc:
                    _failed(e, exc)
                results.append(e)
    report = {"versions": _versions(), "unavailable": unavailable, "results": results}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    # some peers leave threads and atexit hooks that complain at interpreter exit; the report
    # is out, so leave at once
    os._exit(0)


if __name__ == "__main__":
    main()
