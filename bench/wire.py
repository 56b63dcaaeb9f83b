"""Realistic wire bytes for benchmarks: text streams in each provider's framing, and network-sized
chunkings that cut events and UTF-8 characters."""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["GENERATORS", "chunk", "fragments"]

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


def openai_chat(parts: list[str]) -> bytes:
    """An OpenAI Chat Completions stream, chunk fields as the API sends them."""
    head = {
        "id": "chatcmpl-BENCH0000000000000000001",
        "object": "chat.completion.chunk",
        "created": 1764421000,
        "model": "gpt-4o-2024-08-06",
        "service_tier": "default",
        "system_fingerprint": "fp_bench00001",
    }

    def frame(delta: dict[str, object], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body = {**head, "choices": [choice], "usage": None, "obfuscation": "X9w9cq"}
        return f"data: {_dumps(body)}\n\n"

    out = [frame({"role": "assistant", "content": "", "refusal": None})]
    out += [frame({"content": p}) for p in parts]
    out.append(frame({}, "stop"))
    usage = {"prompt_tokens": 12, "completion_tokens": len(parts), "total_tokens": 12 + len(parts)}
    out.append(f"data: {_dumps({**head, 'choices': [], 'usage': usage})}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def anthropic(parts: list[str]) -> bytes:
    """An Anthropic Messages stream with one text block."""

    def ev(name: str, body: dict[str, object]) -> str:
        return f"event: {name}\ndata: {_dumps(body)}\n\n"

    usage = {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message: dict[str, object] = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    out = [ev("message_start", {"type": "message_start", "message": message})]
    out.append(
        ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
    )
    out += [
        ev(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
        )
        for p in parts
    ]
    out.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(parts)},
            },
        )
    )
    out.append(ev("message_stop", {"type": "message_stop"}))
    return "".join(out).encode()


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


# dialect module, class, generator
GENERATORS: dict[str, tuple[str, str, Callable[[list[str]], bytes]]] = {
    "openai-chat": ("pipeline.providers.openai_chat", "OpenAIChatDialect", openai_chat),
    "openai-responses": (
        "pipeline.providers.openai_responses",
        "OpenAIResponsesDialect",
        openai_responses,
    ),
    "anthropic": ("pipeline.providers.anthropic", "AnthropicDialect", anthropic),
    "gemini": ("pipeline.providers.gemini", "GeminiDialect", gemini),
    "ollama": ("pipeline.providers.ollama", "OllamaDialect", ollama),
}
