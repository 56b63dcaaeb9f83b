"""An AWS event-stream encoder written from the format's description alone, for tests: the
decoder under test is never used to make its own input."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any


def _header(name: str, value: str) -> bytes:
    raw = name.encode()
    data = value.encode()
    return bytes([len(raw)]) + raw + b"\x07" + struct.pack(">H", len(data)) + data


def frame(headers: dict[str, str], payload: bytes, *, extra: bytes = b"") -> bytes:
    """One message: string headers (plus `extra` pre-encoded header bytes) and a payload."""
    head = b"".join(_header(k, v) for k, v in headers.items()) + extra
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(kind: str, data: Any) -> bytes:
    """A ConverseStream event message."""
    return frame(
        {":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
        json.dumps(data).encode(),
    )


def exception(kind: str, message: str) -> bytes:
    """A ConverseStream exception message."""
    return frame(
        {
            ":exception-type": kind,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps({"message": message}).encode(),
    )


def text_stream(parts: list[str], *, stop: str = "end_turn") -> list[bytes]:
    """A whole reply of text, usage included."""
    out = [event("messageStart", {"role": "assistant"})]
    out += [
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}) for p in parts
    ]
    out.append(event("contentBlockStop", {"contentBlockIndex": 0}))
    out.append(event("messageStop", {"stopReason": stop}))
    out.append(
        event(
            "metadata",
            {
                "usage": {
                    "inputTokens": 10,
                    "outputTokens": 5,
                    "totalTokens": 15,
                    "cacheReadInputTokens": 3,
                    "cacheWriteInputTokens": 2,
                },
                "metrics": {"latencyMs": 100},
            },
        )
    )
    return out
