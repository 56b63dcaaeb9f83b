"""What the Chat Completions dialect's tests build requests from and read streams with."""

from __future__ import annotations

import json
from typing import Any

from rillet import (
    ToolSpec,
    TurnRequest,
    user,
)
from rillet.providers import Provider, Secret
from rillet.providers._openai_chat._dialect import OpenAIChatDialect

from .wire_cases import run

KEY = "sk-test-0000000000000000000000secretkey"
BASE = "https://api.openai.com/v1"
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
USAGE_JSON = {
    "cached_tokens": None,
    "prompt_tokens": 10,
    "thoughts_tokens": None,
    "response_tokens": 5,
}
TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Weather for a city",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    ToolSpec(name="get_time"),
]


def provider(dialect: OpenAIChatDialect | None = None, **kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(dialect or OpenAIChatDialect(), BASE, "gpt-4o", **options)


def body(request: TurnRequest, dialect: OpenAIChatDialect | None = None, **kwargs: Any) -> Any:
    dialect = dialect or OpenAIChatDialect()
    return dialect.build_request(request, provider(dialect), **kwargs).json()


def hello() -> TurnRequest:
    return TurnRequest(messages=[user("hi")])


def sse(*chunks: dict[str, Any] | str) -> bytes:
    frames = (c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) for c in chunks)
    return "".join(f"data: {f}\n\n" for f in frames).encode("utf-8")


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-4o",
        "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage_chunk(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [], "usage": usage or USAGE}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(OpenAIChatDialect(), [data])]


def decode_body(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(data).encode("utf-8")
    return [json.loads(entry) for entry in run(OpenAIChatDialect(), [raw], stream=False)]
