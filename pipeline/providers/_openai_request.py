"""The request pieces OpenAI's wires share: media as a `data:` URL or a part, a user message's
text and media gathered around its tool results, and the JSON `POST` with a Bearer key that
ends every request they build.

Chat Completions and Responses spell a part differently (`image_url` against `input_image`, a
`tool` message against a `function_call_output` item) but order and group them alike; each
dialect passes its own spelling in, so the grouping is written once.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._events import ImageUrlDone, InlineDataDone, TextDone, ToolResultDone

from .._core._dialect import HttpRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from rillet._core._events import UniMessage
    from rillet._core._request import TurnRequest

    from .._core._dialect import Provider

__all__ = ["bearer_json_request", "data_url", "media_part", "user_messages"]

_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3"}

Part = dict[str, Any]


def data_url(data: bytes, mime_type: str) -> str:
    """Bytes as a `data:` URL."""
    return f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"


def media_part(
    item: ImageUrlDone | InlineDataDone,
    *,
    image: Callable[[str], Part],
    file: Callable[[str, str], Part],
) -> Part:
    """One media item as a user part: an image (by URL, or its bytes as a `data:` URL) as
    `image(url)` spells it, WAV or MP3 audio as `input_audio` (both wires agree), anything else
    as `file(filename, data_url)` spells an attachment."""
    if type(item) is ImageUrlDone:
        return image(item.image_url)
    assert type(item) is InlineDataDone
    mime = item.mime_type
    if mime.startswith("image/"):
        return image(data_url(item.data, mime))
    audio_format = _AUDIO_FORMATS.get(mime)
    if audio_format is not None:
        data = base64.b64encode(item.data).decode("ascii")
        return {"type": "input_audio", "input_audio": {"data": data, "format": audio_format}}
    filename = "attachment." + (mime.split("/")[-1] or "bin")
    return file(filename, data_url(item.data, mime))


def user_messages(
    message: UniMessage,
    *,
    text_type: str,
    media: Callable[[ImageUrlDone | InlineDataDone], Part],
    tool_result: Callable[[ToolResultDone], list[Part]],
) -> list[Part]:
    """A user message as the wire's messages: its text (parts of type `text_type`) and media
    (`media`) as one `user` message, plain `content` when it is one text alone, cut at each tool
    result, which goes out as `tool_result` spells it, in place."""
    out: list[Part] = []
    parts: list[Part] = []

    def flush() -> None:
        if not parts:
            return
        if len(parts) == 1 and parts[0]["type"] == text_type:
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": list(parts)})
        parts.clear()

    for item in message.content_items:
        if type(item) is TextDone:
            parts.append({"type": text_type, "text": item.text})
        elif type(item) is ImageUrlDone or type(item) is InlineDataDone:
            parts.append(media(item))
        elif type(item) is ToolResultDone:
            flush()
            out.extend(tool_result(item))
    flush()
    return out


def bearer_json_request(
    name: str, request: TurnRequest, provider: Provider, path: str, body: dict[str, Any]
) -> HttpRequest:
    """`POST` `body` as JSON to the provider's `path`, with its headers and its key as a Bearer
    token; the turn's `extra_body[name]` is merged into the body last, so it may override any
    field."""
    body.update(request.extra_body.get(name, {}))
    headers = {"content-type": "application/json", **provider.headers}
    if provider.api_key is not None:
        headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
    return HttpRequest(url=provider.url(path), headers=headers, body=msgspec.json.encode(body))
