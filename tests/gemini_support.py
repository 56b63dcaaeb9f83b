"""What the Gemini dialect's tests build requests from and read streams with."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rillet.providers import Provider, Secret
from rillet.providers._gemini._dialect import GeminiDialect

from .wire_cases import run

if TYPE_CHECKING:
    from rillet import (
        TurnRequest,
    )

KEY = "AIzaSyTESTKEY0000000000000000000secret"
BASE = "https://generativelanguage.googleapis.com"
SIG = "CiQBmFzaWduYXR1cmUtb25l"
SIG2 = "CiQBdHdvLXNpZ25hdHVyZQ=="
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


def provider(**kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(GeminiDialect(), BASE, "gemini-2.5-flash", **options)


def body(request: TurnRequest, **kwargs: Any) -> Any:
    return GeminiDialect().build_request(request, provider(), **kwargs).json()


def sse(*chunks: dict[str, Any], crlf: bool = False) -> bytes:
    text = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks)
    return (text.replace("\n", "\r\n") if crlf else text).encode("utf-8")


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage or USAGE}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(GeminiDialect(), [data])]


def stop(entries: list[dict[str, Any]]) -> dict[str, Any]:
    assert entries[-1]["type"] == "stop", entries[-1]
    return entries[-1]
