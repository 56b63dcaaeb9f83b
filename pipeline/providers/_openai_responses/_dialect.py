"""OpenAI Responses API (`POST {base}/responses`), streaming SSE with named semantic events.
This module builds the requests and reads the body; `_stream` decodes events.

One group per output item, its lane named by the item's `output_index`: a `message` item is text
(its `phase`, when it has one, rides first as an empty fragment with `fidelity {"phase"}`; the
words of a model that refuses, `refusal` deltas and parts, are its text too, and the reply then
ends as `refusal`: the provider's rules stopped the answer), a
`function_call` item is a tool call (`tool_call_id` = `call_id`), and a `reasoning` item is
thinking: all its `reasoning_summary_text` deltas (summary parts joined as they come, nothing
inserted between them) and its raw `reasoning_text` deltas, then, at its `output_item.done`, an
empty fragment whose fidelity carries what the done item says (`channel: "summary"` when it has a
summary, its final `encrypted_content`, and `signature` / `format` where a server sends them). An
item whose deltas never came (some compatible servers only send the done item) gets its whole value
at its `output_item.done`. Items of other types (hosted tools: `web_search_call`,
`tool_search_call`, `code_interpreter_call`...) have no lane and are skipped whole, whatever their
fields hold.

There is no `[DONE]`: `response.completed` (finish `tool_call` when the reply called a function,
else `completed`, i.e. stop), `response.incomplete` (its `incomplete_details.reason`:
`max_output_tokens` is length, `content_filter` is unknown), `response.failed` and `error` end
the stream; the last two with the typed error they name. Nothing after them is read (OpenRouter
adds a `data: [DONE]`). Events of any other type, documented or not, are skipped by their
`event:` name without decoding their data (an unnamed frame by a peek at its `type`); a known
event whose fields have the wrong shape is a `MalformedFrameError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from rillet._core._events import (
    ImageUrlDone,
    InlineDataDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._core._lanes import (
    LaneEvent,
    MessageStart,
)

from ..._core._dialect import (
    HttpRequest,
    Provider,
    dumps_arguments,
    strict_decode,
)
from .._openai_chat._dialect import http_error, reasoning_effort
from .._openai_request import bearer_json_request, media_part, user_messages

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._errors import ProviderError
    from rillet._core._request import ToolChoice, ToolSpec, TurnRequest

    from ..._core._dialect import StreamDecoder

from ._items import NAME, close_item, decode_item, holds_refusal, open_item
from ._stream import ResponseBody, ResponsesStreamDecoder, decode_response_body, finish_events

__all__ = ["OpenAIResponsesDialect"]

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


# --- the request ----------------------------------------------------------------------------------


def _image(url: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, "detail": "auto"}


def _file(filename: str, file_data: str) -> dict[str, Any]:
    return {"type": "input_file", "filename": filename, "file_data": file_data}


def _media(item: ImageUrlDone | InlineDataDone) -> dict[str, Any]:
    return media_part(item, image=_image, file=_file)


def _tool_result(item: ToolResultDone) -> list[dict[str, Any]]:
    """A `function_call_output`; with images, its output is parts: the text, then each image."""
    output: str | list[dict[str, Any]] = item.text
    if item.images:
        output = [{"type": "input_text", "text": item.text}]
        output.extend(_image(url) for url in item.images)
    return [{"type": "function_call_output", "call_id": item.tool_call_id, "output": output}]


def _user_items(message: UniMessage) -> list[dict[str, Any]]:
    """A user message: text and media as one message, each tool result as a
    `function_call_output` (its images as `input_image` parts of the output)."""
    return user_messages(message, text_type="input_text", media=_media, tool_result=_tool_result)


def _assistant_items(message: UniMessage) -> list[dict[str, Any]]:
    """An assistant message replayed as input items, in order: text as assistant messages (with
    their `phase`), reasoning as `reasoning` items with their `encrypted_content` (thinking
    without it cannot be sent back statelessly and is left out), tool calls as
    `function_call` items."""
    out: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            text: dict[str, Any] = {"role": "assistant", "content": item.text}
            phase = (item.fidelity or {}).get("phase")
            if phase:
                text["phase"] = phase
            out.append(text)
        elif type(item) is ThinkingDone:
            fidelity = item.fidelity or {}
            encrypted = fidelity.get("encrypted_content")
            if not encrypted:
                continue
            reasoning: dict[str, Any] = {"type": "reasoning", "summary": []}
            if item.thinking:
                if fidelity.get("channel") == "summary":
                    reasoning["summary"] = [{"type": "summary_text", "text": item.thinking}]
                else:
                    reasoning["content"] = [{"type": "reasoning_text", "text": item.thinking}]
            reasoning["encrypted_content"] = encrypted
            out.append(reasoning)
        elif type(item) is ToolCallDone:
            out.append(
                {
                    "type": "function_call",
                    "call_id": item.tool_call_id,
                    "name": item.name,
                    "arguments": dumps_arguments(item.arguments),
                }
            )
    return out


def _tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        spec: dict[str, Any] = {"type": "function", "name": tool.name}
        if tool.description:
            spec["description"] = tool.description
        spec["parameters"] = tool.parameters or _EMPTY_PARAMETERS
        # any JSON schema, as the other dialects accept, unless the tool asks to be held to it
        spec["strict"] = bool(tool.strict)
        out.append(spec)
    return out


def _tool_choice(choice: ToolChoice) -> Any:
    if isinstance(choice, str):
        return choice
    if len(choice) == 1:
        return {"type": "function", "name": choice[0]}
    return {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": name} for name in choice],
    }


def _signed(provider: Provider) -> dict[str, str]:
    headers = dict(provider.headers)
    if provider.api_key is not None:
        headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
    return headers


class OpenAIResponsesDialect:
    """OpenAI's Responses API, stateless: `store: false`, reasoning carried back as encrypted
    content.

    Args:
        encrypted_reasoning: whether to ask for `include: ["reasoning.encrypted_content"]`, so
            reasoning can be replayed on the next turn without server-side state. OpenAI refuses
            it for models that do not reason ("Encrypted content is not supported with this
            model"), so by default (None) it is asked for when the turn sets a thinking level
            (other than `none`, which sends no `reasoning`); True asks always (a reasoning
            model used without a thinking level), False never.
        resume: run each streamed response in OpenAI's background mode (`background: true`,
            which needs `store: true`: the response is kept by OpenAI, which an account with
            zero data retention may refuse), so a stream that breaks is continued where it
            stopped (`resume_request`) instead of asked again: no second bill, no reset. Off
            by default, as storing is the account's choice.
    """

    name = NAME
    framing: Literal["sse"] = "sse"

    def __init__(self, *, encrypted_reasoning: bool | None = None, resume: bool = False) -> None:
        self.encrypted_reasoning = encrypted_reasoning
        self.resume = resume

    def resume_request(self, provider: Provider, point: tuple[str, int]) -> HttpRequest:
        """`GET {base}/responses/{id}?stream=true&starting_after=N`: the events of a
        background response after the N-th, as a stream (every event, from its start, for an
        N below 0)."""
        response_id, after = point
        path = f"responses/{quote(response_id, safe='')}?stream=true"
        if after >= 0:
            path += f"&starting_after={after}"
        return HttpRequest(method="GET", url=provider.url(path), headers=_signed(provider))

    def cancel_request(self, provider: Provider, response_id: str) -> HttpRequest:
        """`POST {base}/responses/{id}/cancel`: stop a background response nobody reads."""
        path = f"responses/{quote(response_id, safe='')}/cancel"
        return HttpRequest(url=provider.url(path), headers=_signed(provider), body=b"")

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/responses` (the base URL includes `/v1`) with a Bearer key."""
        items: list[dict[str, Any]] = []
        for message in request.messages:
            if message.role == "assistant":
                items.extend(_assistant_items(message))
            else:
                items.extend(_user_items(message))
        body: dict[str, Any] = {"model": provider.model, "input": items}
        if request.system_prompt:
            body["instructions"] = request.system_prompt
        if request.tools:
            body["tools"] = _tools(request.tools)
            if request.tool_choice is not None:
                body["tool_choice"] = _tool_choice(request.tool_choice)
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        effort = reasoning_effort(request.thinking_level)
        if effort is not None:
            body["reasoning"] = {"effort": effort, "summary": "auto"}
        body["store"] = False
        if self.resume and stream:  # OpenAI keeps it, so a broken stream can be continued
            body["background"] = body["store"] = True
        encrypted = self.encrypted_reasoning
        if encrypted is None:
            encrypted = effort is not None
        if encrypted:
            body["include"] = ["reasoning.encrypted_content"]
        body["stream"] = stream  # explicit either way: a non-streaming request says so
        return bearer_json_request(NAME, request, provider, "responses", body)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's events."""
        return ResponsesStreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming Response object as the stream the API would have sent."""
        response: ResponseBody = strict_decode(decode_response_body, body, NAME)
        out: list[LaneEvent] = [MessageStart(response.id, response.model)]
        tool_seen = refused = False
        for index, raw in enumerate(response.output):
            item = decode_item(raw)
            if item is None:
                continue
            kind = open_item(index, item, out)
            if kind is not None:
                tool_seen = tool_seen or kind == "tool_call"
                refused = refused or holds_refusal(item)
                close_item(index, kind, item, streamed=False, out=out)
        return out + finish_events(response, response.status, tool_seen, refused)

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"message", "type", "code"}}` typed as Chat Completions errors are."""
        return http_error(NAME, status, headers, body)
