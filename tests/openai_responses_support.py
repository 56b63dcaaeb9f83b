"""What the Responses dialect's tests build requests from and read streams with."""

from __future__ import annotations

import json
from typing import Any

from rillet import (
    ToolSpec,
    TurnRequest,
    user,
)
from rillet.providers import Provider, Secret
from rillet.providers._openai_responses._dialect import OpenAIResponsesDialect

from .wire_cases import run

KEY = "sk-test-1111111111111111111111secretkey"
BASE = "https://api.openai.com/v1"
USAGE = {
    "input_tokens": 20,
    "input_tokens_details": {"cached_tokens": 5},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 50,
}
USAGE_METADATA = {
    "cached_tokens": 5,
    "prompt_tokens": 15,
    "thoughts_tokens": 12,
    "response_tokens": 18,
}
TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Weather for a city",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    ToolSpec(name="get_time"),
]


def provider(dialect: OpenAIResponsesDialect | None = None, **kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(dialect or OpenAIResponsesDialect(), BASE, "gpt-5", **options)


def body(request: TurnRequest, dialect: OpenAIResponsesDialect | None = None, **kwargs: Any) -> Any:
    dialect = dialect or OpenAIResponsesDialect()
    return dialect.build_request(request, provider(dialect), **kwargs).json()


def hello() -> TurnRequest:
    return TurnRequest(messages=[user("hi")])


def sse(*events: dict[str, Any] | tuple[str, str]) -> bytes:
    """Events as the API frames them: `event: <type>` then the data (a tuple gives both raw)."""
    frames = []
    for event in events:
        if isinstance(event, tuple):
            name, data = event
        else:
            name, data = event["type"], json.dumps(event, ensure_ascii=False)
        frames.append(f"event: {name}\ndata: {data}\n\n")
    return "".join(frames).encode("utf-8")


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def text_delta(index: int, delta: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": index,
        "content_index": 0,
        "delta": delta,
    }


def summary_delta(index: int, delta: str, part: int = 0) -> dict[str, Any]:
    return {
        "type": "response.reasoning_summary_text.delta",
        "item_id": "rs_1",
        "output_index": index,
        "summary_index": part,
        "delta": delta,
    }


def message(text: str = "", **extra: Any) -> dict[str, Any]:
    content = [{"type": "output_text", "annotations": [], "text": text}] if text else []
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": content, **extra}


def response(status: str = "completed", output: list[Any] | None = None, **extra: Any) -> Any:
    return {
        "id": "resp_1",
        "object": "response",
        "model": "gpt-5",
        "status": status,
        "output": output or [],
        "usage": USAGE,
        **extra,
    }


def completed(output: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "response.completed", "response": response("completed", output)}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(OpenAIResponsesDialect(), [data])]


def decode_body(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(data).encode("utf-8")
    return [json.loads(entry) for entry in run(OpenAIResponsesDialect(), [raw], stream=False)]


def hi(*extra: dict[str, Any] | tuple[str, str], after: tuple[Any, ...] = ()) -> bytes:
    """A reply saying "Hi", with `extra` events inside it and `after` events after its end."""
    return sse(
        added(0, message()), *extra, text_delta(0, "Hi"), done(0, message("Hi")), completed()
    ) + sse(*after)
