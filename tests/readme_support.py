"""What `tests/test_readme.py` reads and runs: the README's blocks and command lines, the
loopback provider's replies to them, the environment that points every provider at it, and
server processes started the way a user starts them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    fixture_reply,
    openai_text_body,
    openai_text_stream,
    split,
    sse,
)

from .cli.test_cli_agents import ANSWER, calls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIXTURES = ROOT / "tests" / "fixtures" / "providers"
BIN = Path(sys.executable).parent  # where `rillet` is installed, put first on the PATH
WAIT = 60.0  # seconds one example may take; a passing one takes one or two

FRAGMENTS = ["Hello", " from", " the", " loopback", " 👋"]
TEXT = "".join(FRAGMENTS)
KEYS = {
    "OPENAI_API_KEY": "sk-test-0123456789abcdef",
    "ANTHROPIC_API_KEY": "sk-ant-test-0123456789",
    "GEMINI_API_KEY": "gm-test-0123456789",
}


def sections() -> list[tuple[str, str]]:
    """The README's `## ` sections: (title, text)."""
    parts = re.split(r"^## (.+)$", README, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def blocks(language: str) -> list[tuple[str, str]]:
    """Every fenced block in `language`, in order: (its section's title, its code)."""
    pattern = rf"```{language}\n(.*?)```"
    return [
        (title, code)
        for title, text in sections()
        for code in re.findall(pattern, text, flags=re.DOTALL)
    ]


def command_lines() -> list[tuple[str, str]]:
    """Every command of the ```sh blocks, continuation lines joined, comments dropped."""
    found = []
    for title, code in blocks("sh"):
        for line in code.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append((title, re.sub(r"\s+", " ", command)))
    return found


def fixture_text(path: Path) -> str:
    """The answer text a recorded fixture holds (its `.expected.json`)."""
    expected = json.loads(path.with_suffix(".expected.json").read_text(encoding="utf-8"))
    return "".join(e["text"] for e in expected if e["type"] == "text.delta")


ANTHROPIC_TEXT = FIXTURES / "anthropic-messages" / "text.sse"
GEMINI_TEXT = FIXTURES / "gemini" / "text.sse"


def frames(path: Path) -> tuple[bytes, ...]:
    """A recorded SSE body cut at its frames."""
    return tuple(part + b"\n\n" for part in path.read_bytes().split(b"\n\n") if part.strip())


def anthropic_tool_call(name: str, arguments: dict[str, Any]) -> bytes:
    """An Anthropic Messages stream that calls one tool (id `toolu_1`)."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": []}
    block = {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
    stop = {"stop_reason": "tool_use", "stop_sequence": None}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": {**message, "usage": {"input_tokens": 9}}}),
        ("content_block_start", {"index": 0, "content_block": block}),
        ("content_block_delta", {"index": 0, "delta": delta}),
        ("content_block_stop", {"index": 0}),
        ("message_delta", {"delta": stop, "usage": {"output_tokens": 5}}),
        ("message_stop", {}),
    ]
    return b"".join(sse({"type": kind, **data}, event=kind) for kind, data in events)


def _stalled_after_first_delta(path: Path) -> Reply:
    parts = frames(path)
    first = next(i for i, part in enumerate(parts) if b"text_delta" in part)
    return Reply(chunks=parts, stall_after=first + 1)


def provider_reply(request: RecordedRequest, _: int) -> Reply:
    """What each example's provider answers, by wire and by what was asked."""
    body = request.body
    if ":streamGenerateContent" in request.path:
        return fixture_reply(GEMINI_TEXT)
    if request.path.startswith("/v1/messages"):
        if b'"tool_result"' in body:
            return fixture_reply(ANTHROPIC_TEXT)
        if b"Lisbon" in body:
            return Reply(chunks=(anthropic_tool_call("get_weather", {"city": "Lisbon"}),))
        if b"hang up" in body:
            return _stalled_after_first_delta(ANTHROPIC_TEXT)
        return fixture_reply(ANTHROPIC_TEXT)
    compact = body.replace(b" ", b"")
    if b'"role":"tool"' in compact:
        return Reply(chunks=split(openai_text_stream(ANSWER), 16))
    if b"weather in Paris" in body:
        return Reply(chunks=(calls("get_weather", {"city": "Paris"}),))
    if b"delete notes" in body:
        return Reply(chunks=(calls("delete_file", {"path": "notes.txt"}),))
    if b'"stream":false' in compact:
        return Reply(chunks=(openai_text_body(TEXT),), content_type="application/json")
    return Reply(chunks=split(openai_text_stream(FRAGMENTS), 16))


def provider_env(url: str) -> dict[str, str]:
    """This process's environment with every provider pointed at the loopback provider at
    `url` (keys from `KEYS`, nothing else's), and the installed `rillet` first on the PATH."""
    dropped = ("_API_KEY", "_BASE_URL")
    env = {k: v for k, v in os.environ.items() if not k.endswith(dropped)}
    env.pop("OLLAMA_HOST", None)
    env.pop("RILLET_PROVIDER", None)
    env.update(KEYS)
    env.update(OPENAI_BASE_URL=f"{url}/v1", ANTHROPIC_BASE_URL=url, GEMINI_BASE_URL=url)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def bodies(requests: Sequence[RecordedRequest]) -> list[Any]:
    return [json.loads(r.body) for r in requests]


@asynccontextmanager
async def server_process(
    argv: list[str], *, env: dict[str, str], cwd: Path, listening: bytes
) -> AsyncIterator[str]:
    """Start a server as a user does; yield the URL it logs on stderr (`listening`, a pattern
    whose group 1 is the URL); stop it at the end."""
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    assert process.stderr is not None
    stderr = process.stderr
    seen = bytearray()
    found: list[str] = []
    ready = trio.Event()

    async def drain() -> None:  # keeps reading, so the server never blocks on its log
        async for chunk in stderr:
            seen.extend(chunk)
            match = re.search(listening, bytes(seen))
            if match and not found:
                found.append(match.group(1).decode())
                ready.set()
        ready.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await ready.wait()
            assert found, seen.decode(errors="replace")
            yield found[0]
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            await process.wait()
