"""Realistic wire bytes for benchmarks: text, thinking and tool-call streams in each provider's
framing, network-sized chunkings that cut events and UTF-8 characters, and what each stream must
decode to.

Standard library only: the peers' driver (`bench/peers.py`, run in another virtualenv) reads
the same module.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = [
    "GENERATORS",
    "STREAM_KINDS",
    "Expected",
    "Stream",
    "build_stream",
    "chunk",
    "digest",
    "first_delta_stream",
    "fragments",
    "write_stream",
]

_WORDS = (
    "the", " stream", " of", " tokens", " arrives", " quickly,", " and", " each", " piece",
    " must", " reach", " the", " screen", " exactly", " once.", " café", " naïve", " 你好",
    "，世界", " 👋", " résumé", " Ελληνικά", " данные", " 😀🎉", "\n", " **bold**", " `code`",
)  # fmt: skip


def fragments(n: int, *, seed: int = 1) -> list[str]:
    """`n` small text fragments (one to three words), some with multi-byte characters."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def chunk(data: bytes, *, seed: int = 2, low: int = 64, high: int = 1460) -> list[bytes]:
    """Split bytes into network-sized reads of random length (cutting events and characters)."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.randint(low, high)
        out.append(data[i : i + n])
        i += n
    return out


def _dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- what a stream decodes to ---------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What every contestant must assemble from a stream: the answer text, the thinking text,
    and each tool call's arguments (parsed JSON), in order."""

    text: str = ""
    thinking: str = ""
    arguments: tuple[object, ...] = ()

    def digest(self) -> str:
        """A short fingerprint contestants compare instead of shipping the text around."""
        return digest(self.text, self.thinking, list(self.arguments))


def digest(text: str, thinking: str, arguments: list[object]) -> str:
    """The fingerprint of an assembled reply (see `Expected.digest`)."""
    blob = json.dumps([text, thinking, arguments], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class _Body:
    """A generated stream and what it decodes to."""

    data: bytes
    expected: Expected


def _tool_arguments(parts: list[str], seed: int = 3) -> tuple[dict[str, object], list[str]]:
    """A tool call's arguments (a file write holding the generated text) and its JSON text cut
    into `len(parts)` small pieces, as a model streams them."""
    args: dict[str, object] = {"path": "notes/stream.md", "content": "".join(parts)}
    text = json.dumps(args, ensure_ascii=False)
    n = len(parts)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), n - 1)) if n > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return args, pieces


# --- OpenAI Chat Completions ----------------------------------------------------------------------

_OPENAI_HEAD = {
    "id": "chatcmpl-BENCH0000000000000000001",
    "object": "chat.completion.chunk",
    "created": 1764421000,
    "model": "gpt-4o-2024-08-06",
    "service_tier": "default",
    "system_fingerprint": "fp_bench00001",
}


def _openai_frame(delta: dict[str, object], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {**_OPENAI_HEAD, "choices": [choice], "usage": None, "obfuscation": "X9w9cq"}
    return f"data: {_dumps(body)}\n\n"


def _openai_tail(n: int, finish: str) -> list[str]:
    usage = {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n}
    return [
        _openai_frame({}, finish),
        f"data: {_dumps({**_OPENAI_HEAD, 'choices': [], 'usage': usage})}\n\n",
        "data: [DONE]\n\n",
    ]


def openai_chat(parts: list[str]) -> bytes:
    """An OpenAI Chat Completions stream, chunk fields as the API sends them."""
    return _openai_text(parts).data


def _openai_text(parts: list[str]) -> _Body:
    out = [_openai_frame({"role": "assistant", "content": "", "refusal": None})]
    out += [_openai_frame({"content": p}) for p in parts]
    out += _openai_tail(len(parts), "stop")
    return _Body("".join(out).encode(), Expected(text="".join(parts)))


def _openai_tools(parts: list[str]) -> _Body:
    """A short answer, then one tool call whose arguments stream in `len(parts)` pieces."""
    args, pieces = _tool_arguments(parts)
    intro = ["I'll write", " that down."]
    out = [_openai_frame({"role": "assistant", "content": "", "refusal": None})]
    out += [_openai_frame({"content": p}) for p in intro]
    head = {"index": 0, "id": "call_BENCH0000000000000001", "type": "function",
            "function": {"name": "write_file", "arguments": ""}}  # fmt: skip
    out.append(_openai_frame({"tool_calls": [head]}))
    out += [
        _openai_frame({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces
    ]
    out += _openai_tail(len(parts), "tool_calls")
    return _Body("".join(out).encode(), Expected(text="".join(intro), arguments=(args,)))


# --- Anthropic Messages ---------------------------------------------------------------------------


def _anthropic_ev(name: str, body: dict[str, object]) -> str:
    return f"event: {name}\ndata: {_dumps(body)}\n\n"


def _anthropic_message(blocks: list[tuple[str, list[str]]], stop: str, n: int) -> str:
    """A whole Messages stream: one content block per (type, pieces)."""
    usage = {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message: dict[str, object] = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    out = [_anthropic_ev("message_start", {"type": "message_start", "message": message})]
    for index, (kind, pieces) in enumerate(blocks):
        block: dict[str, object]
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "tool_use":
            block = {"type": "tool_use", "id": "toolu_BENCH0000000000000001",
                     "name": "write_file", "input": {}}  # fmt: skip
        else:
            block = {"type": "text", "text": ""}
        start = {"type": "content_block_start", "index": index, "content_block": block}
        out.append(_anthropic_ev("content_block_start", start))
        for p in pieces:
            if kind == "thinking":
                delta = {"type": "thinking_delta", "thinking": p}
            elif kind == "tool_use":
                delta = {"type": "input_json_delta", "partial_json": p}
            else:
                delta = {"type": "text_delta", "text": p}
            body = {"type": "content_block_delta", "index": index, "delta": delta}
            out.append(_anthropic_ev("content_block_delta", body))
        if kind == "thinking":
            sig = {"type": "signature_delta", "signature": "EuPiLUY/Gt1xTG+qo9TeI10c4QSwew9T8i=="}
            body = {"type": "content_block_delta", "index": index, "delta": sig}
            out.append(_anthropic_ev("content_block_delta", body))
        stop_body = {"type": "content_block_stop", "index": index}
        out.append(_anthropic_ev("content_block_stop", stop_body))
    out.append(
        _anthropic_ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
        )
    )
    out.append(_anthropic_ev("message_stop", {"type": "message_stop"}))
    return "".join(out)


def anthropic(parts: list[str]) -> bytes:
    """An Anthropic Messages stream with one text block."""
    return _anthropic_text(parts).data


def _anthropic_text(parts: list[str]) -> _Body:
    data = _anthropic_message([("text", parts)], "end_turn", len(parts))
    return _Body(data.encode(), Expected(text="".join(parts)))


def _anthropic_thinking(parts: list[str]) -> _Body:
    """A thinking block with the first half of the fragments (and its signature), then a text
    block with the second half."""
    half = len(parts) // 2
    thinking, text = parts[:half], parts[half:]
    data = _anthropic_message([("thinking", thinking), ("text", text)], "end_turn", len(parts))
    return _Body(data.encode(), Expected(text="".join(text), thinking="".join(thinking)))


def _anthropic_tools(parts: list[str]) -> _Body:
    """A short answer, then one tool_use block whose input streams in `len(parts)` pieces."""
    args, pieces = _tool_arguments(parts)
    intro = ["I'll write", " that down."]
    data = _anthropic_message([("text", intro), ("tool_use", pieces)], "tool_use", len(parts))
    return _Body(data.encode(), Expected(text="".join(intro), arguments=(args,)))


# --- OpenAI Responses, Gemini, Ollama -------------------------------------------------------------


def openai_responses(parts: list[str]) -> bytes:
    """An OpenAI Responses stream with one message item."""
    seq = 0

    def ev(body: dict[str, object]) -> str:
        nonlocal seq
        seq += 1
        return f"event: {body['type']}\ndata: {_dumps({**body, 'sequence_number': seq})}\n\n"

    item = {"id": "msg_bench", "type": "message", "status": "in_progress", "content": [],
            "role": "assistant"}  # fmt: skip
    out = [ev({"type": "response.output_item.added", "output_index": 0, "item": item})]
    out += [
        ev(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_bench",
                "output_index": 0,
                "content_index": 0,
                "delta": p,
                "logprobs": [],
            }
        )
        for p in parts
    ]
    done = {**item, "status": "completed"}
    out.append(ev({"type": "response.output_item.done", "output_index": 0, "item": done}))
    usage = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": len(parts), "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 12 + len(parts)}  # fmt: skip
    response = {"id": "resp_bench", "status": "completed", "output": [done], "usage": usage}
    out.append(ev({"type": "response.completed", "response": response}))
    return "".join(out).encode()


def gemini(parts: list[str]) -> bytes:
    """A Gemini streamGenerateContent?alt=sse stream (CRLF framing, as Gemini sends it)."""
    out = []
    for i, p in enumerate(parts):
        cand: dict[str, object] = {"content": {"parts": [{"text": p}], "role": "model"}, "index": 0}
        if i == len(parts) - 1:
            cand["finishReason"] = "STOP"
        usage = {"promptTokenCount": 12, "candidatesTokenCount": i + 1, "totalTokenCount": 13 + i}
        body = {"candidates": [cand], "usageMetadata": usage, "modelVersion": "gemini-2.5-flash"}
        out.append(f"data: {json.dumps(body, ensure_ascii=False)}\r\n\r\n")
    return "".join(out).encode()


def ollama(parts: list[str]) -> bytes:
    """An Ollama /api/chat NDJSON stream."""
    out = []
    for p in parts:
        line = {
            "model": "qwen3:8b",
            "created_at": "2026-11-29T10:15:03.100000Z",
            "message": {"role": "assistant", "content": p},
            "done": False,
        }
        out.append(_dumps(line) + "\n")
    final = {
        "model": "qwen3:8b",
        "created_at": "2026-11-29T10:15:04.100000Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 12,
        "eval_count": len(parts),
    }
    out.append(_dumps(final) + "\n")
    return "".join(out).encode()


def _text_body(generate: Callable[[list[str]], bytes]) -> Callable[[list[str]], _Body]:
    return lambda parts: _Body(generate(parts), Expected(text="".join(parts)))


# dialect module, class, generator (text streams: what the core benchmark decodes)
GENERATORS: dict[str, tuple[str, str, Callable[[list[str]], bytes]]] = {
    "openai-chat": ("rillet.providers._openai_chat._dialect", "OpenAIChatDialect", openai_chat),
    "openai-responses": (
        "rillet.providers._openai_responses._dialect",
        "OpenAIResponsesDialect",
        openai_responses,
    ),
    "anthropic": ("rillet.providers._anthropic._dialect", "AnthropicDialect", anthropic),
    "gemini": ("rillet.providers._gemini._dialect", "GeminiDialect", gemini),
    "ollama": ("rillet.providers._ollama", "OllamaDialect", ollama),
}


@dataclass(frozen=True)
class _Kind:
    dialect: str  # a key of GENERATORS
    body: Callable[[list[str]], _Body]
    content_type: str = "text/event-stream"


# every stream the pipeline and peer benchmarks use, by name
STREAM_KINDS: dict[str, _Kind] = {
    "openai-chat": _Kind("openai-chat", _openai_text),
    "openai-chat-tools": _Kind("openai-chat", _openai_tools),
    "anthropic": _Kind("anthropic", _anthropic_text),
    "anthropic-thinking": _Kind("anthropic", _anthropic_thinking),
    "anthropic-tools": _Kind("anthropic", _anthropic_tools),
    "openai-responses": _Kind("openai-responses", _text_body(openai_responses)),
    "gemini": _Kind("gemini", _text_body(gemini)),
    "ollama": _Kind("ollama", _text_body(ollama), "application/x-ndjson"),
}


@dataclass(frozen=True)
class Stream:
    """One benchmark stream: its bytes as network-sized reads and what it decodes to.

    Attributes:
        kind: a key of `STREAM_KINDS`.
        dialect: the dialect that decodes it (a key of `GENERATORS`).
        events: how many fragment events it carries (the unit of every µs/event figure).
        chunks: the body as the reads a client sees.
        content_type: the response's Content-Type.
        expected: what it decodes to.
    """

    kind: str
    dialect: str
    events: int
    chunks: list[bytes] = field(repr=False)
    content_type: str
    expected: Expected = field(repr=False)

    @property
    def name(self) -> str:
        """`kind@events`, e.g. `openai-chat@20000`."""
        return f"{self.kind}@{self.events}"

    @property
    def size(self) -> int:
        """The body's length in bytes."""
        return sum(map(len, self.chunks))


def build_stream(kind: str, events: int) -> Stream:
    """The stream `kind` with `events` fragment events, cut into network-sized reads."""
    spec = STREAM_KINDS[kind]
    body = spec.body(fragments(events))
    return Stream(
        kind=kind,
        dialect=spec.dialect,
        events=events,
        chunks=chunk(body.data),
        content_type=spec.content_type,
        expected=body.expected,
    )


def first_delta_stream(kind: str, events: int = 64) -> Stream:
    """The stream `kind` whose first read ends right after the frame carrying the first text
    fragment (`Hello`), the rest in network-sized reads: what the time-to-first-delta benchmark
    feeds, stamping the moment that first read is handed over."""
    spec = STREAM_KINDS[kind]
    body = spec.body(["Hello", *fragments(events - 1)])
    data = body.data
    at = data.index(b"Hello")
    seps = (b"\n",) if spec.content_type.endswith("ndjson") else (b"\n\n", b"\r\n\r\n")
    end = min(i + len(sep) for sep in seps if (i := data.find(sep, at)) >= 0)
    return Stream(
        kind=kind,
        dialect=spec.dialect,
        events=events,
        chunks=[data[:end], *chunk(data[end:])],
        content_type=spec.content_type,
        expected=body.expected,
    )


def write_stream(stream: Stream, directory: Path) -> None:
    """Write a stream where the peers' driver reads it: `<name>.bin` (the body) and
    `<name>.json` (kind, events, content type, read lengths, expected fingerprint)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stream.name}.bin").write_bytes(b"".join(stream.chunks))
    meta = {
        "kind": stream.kind,
        "dialect": stream.dialect,
        "events": stream.events,
        "content_type": stream.content_type,
        "lengths": [len(c) for c in stream.chunks],
        "digest": stream.expected.digest(),
    }
    (directory / f"{stream.name}.json").write_text(json.dumps(meta), "utf-8")
