"""OpenAI's Chat Completions request as rillet's turn request: the messages (system and
developer ones as the system prompt, assistant tool calls, tool results, a speaker's `name`),
the tools (`strict` included), the tool choice and the generation settings. Every other field
(`stop`, `seed`, `response_format`, `metadata`, a field OpenAI adds next year, ...) and
`reasoning_effort` as given go, unchanged, to a provider speaking OpenAI's Chat Completions wire
(`extra_body`); those the Responses wire has too go to a provider of that wire
(`response_format` as its `text.format`), Anthropic's wire takes `top_p` and the end user's
id, and Bedrock's Converse `top_p` and `stop`. A field that would shape the answer and that the
routed provider's wire has no place for
(`seed` to Anthropic, a speaker's `name` to any wire but Chat's, ...) is refused with OpenAI's
`unsupported_parameter` naming it; only hints that leave the answer as it is and settings at
their default go without a place. A field no provider behind this endpoint can honour is
refused whatever the provider: nothing is dropped."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ..._core._events import (
    FinishReason,
    ImageUrlDone,
    TextDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from ..._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest
from .._anthropic._stream import NAME as ANTHROPIC
from .._bedrock_converse import NAME as BEDROCK_CONVERSE
from .._openai_responses._items import NAME as OPENAI_RESPONSES
from ._stream import REFUSAL_FIDELITY
from ._wire import NAME as OPENAI_CHAT

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..._core._events import ContentItem

__all__ = [
    "EFFORTS",
    "REFUSED",
    "SHARED_FIELDS",
    "BadRequest",
    "ChatBody",
    "chat_request",
    "decode_chat_body",
    "other_fields",
    "read_with_extra",
    "shown",
]


# --- the request ----------------------------------------------------------------------------------


class _Function(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: str | dict[str, Any] = ""


class _ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    function: _Function
    type: str = "function"


class _Message(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    refusal: str | None = None


class _ToolFunction(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Tool(msgspec.Struct, frozen=True, kw_only=True):
    function: _ToolFunction
    type: str = "function"


class _StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


class _Read(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a Chat Completions request rillet acts on."""

    messages: list[_Message]
    model: str | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatBody(_Read, frozen=True, kw_only=True):
    """A Chat Completions request: the fields rillet acts on, and in `extra` every other
    top-level field as the client gave it (see `decode_chat_body`)."""

    extra: dict[str, Any] = msgspec.field(default_factory=dict)


Read = TypeVar("Read")
_READ = frozenset(_Read.__struct_fields__)
_decode_read = msgspec.json.Decoder(_Read).decode
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode  # the read ones stay raw
_decode_value = msgspec.json.Decoder().decode


def other_fields(raw: bytes, read: frozenset[str]) -> dict[str, Any]:
    """A JSON object's top-level fields other than `read`, as the client gave them (a null
    one is none): what an OpenAI wire's body carries that the server does not act on."""
    fields = _decode_fields(raw).items()
    return {k: v for k, r in fields if k not in read and (v := _decode_value(r)) is not None}


def decode_chat_body(raw: bytes) -> ChatBody:
    """A request body as a `ChatBody`, its fields rillet does not act on in `extra` (raises
    `msgspec.DecodeError`, `msgspec.ValidationError` included)."""
    body = _decode_read(raw)
    return ChatBody(**msgspec.structs.asdict(body), extra=other_fields(raw, _READ))


def read_with_extra(
    raw: bytes, decode: Callable[[bytes], Read], read: frozenset[str]
) -> tuple[Read, dict[str, Any]]:
    """A request body decoded by `decode`, and every other top-level field (not in `read`, and
    not null) as the client gave it: what a served wire passes on to a provider of its own."""
    return decode(raw), other_fields(raw, read)


REFUSED = ("functions", "function_call", "audio")
"""Fields no served reply can honour, refused with OpenAI's `unsupported_parameter`: the legacy
`functions` and `function_call` (tools in the shape rillet's answer does not speak: their calls
would come back as `function_call`), and `audio` (spoken output, which a chat completion from
here does not carry)."""
SHARED_FIELDS = (
    "top_p",
    "parallel_tool_calls",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
)
"""The fields OpenAI's Chat Completions and Responses wires both take under the same name and
meaning: what one endpoint's request passes, as given, to a provider of the other wire."""
HINTS = frozenset(
    {
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "user",
        "stream_options",
    }
)
"""Fields any provider may go without: they leave the answer as it is (`metadata` is the
response's own, echoed; the others are cache and abuse-tracking hints)."""
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "service_tier": ("auto", "default"),
    "parallel_tool_calls": (True,),
    "response_format": ({"type": "text"},),
    "store": (False,),
}
"""Chat settings at the value that asks a provider for nothing more than it does without them."""
_TO_RESPONSES = (*SHARED_FIELDS, "response_format", "verbosity", "store")
"""The Chat fields a Responses provider carries (`response_format` and `verbosity` under
`text`)."""


def unsent(param: str, dialect: str, wire: str) -> BadRequest:
    """The refusal of a field the routed provider's `dialect` has no place for: OpenAI's
    `unsupported_parameter`, naming the field and the `wire` that would take it."""
    message = (
        f"Unsupported parameter: '{param}' cannot be sent to this model's provider ({dialect});"
        f" leave it out, or ask for a model served over {wire}."
    )
    return BadRequest(message, param, "unsupported_parameter")


def _refuse_unsent(body: ChatBody, dialect: str) -> None:
    """Refuse the first field that would shape the answer and that the `dialect`'s wire has
    no place for: a provider of OpenAI's Chat wire takes every field as given; one of the
    Responses wire those of the same meaning; Anthropic's `top_p` and the end user's id;
    Bedrock's Converse `top_p` and `stop`; the others only hints and settings at their
    default."""
    if dialect == OPENAI_CHAT:
        return
    for i, message in enumerate(body.messages):
        if message.name is not None:
            raise unsent(f"messages[{i}].name", dialect, "OpenAI's Chat Completions API")
    for name, value in body.extra.items():
        carried = (
            (dialect == OPENAI_RESPONSES and name in _TO_RESPONSES)
            or (dialect == ANTHROPIC and name == "top_p")
            or (dialect == BEDROCK_CONVERSE and name in ("top_p", "stop"))
        )
        if not carried and name not in HINTS and value not in _DEFAULTS.get(name, ()):
            raise unsent(name, dialect, "OpenAI's Chat Completions API")


EFFORTS: dict[str, ThinkingLevel] = {
    "none": "none",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
}


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 3, 3
_MAX_SHOWN = 80


def shown(value: Any) -> str:
    """A client's value as a refusal quotes it: its repr, cut short (at most 80 characters,
    two levels deep), so an answer never repeats a large or deeply nested value."""
    text = _SHOWN.repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


class BadRequest(ValueError):
    """What makes a request one rillet cannot run, and the parameter at fault."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def _text_of(content: str | list[dict[str, Any]] | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest("only text parts are accepted here", param)
        texts.append(part["text"])
    return "".join(texts)


def _user_items(content: str | list[dict[str, Any]] | None, param: str) -> list[ContentItem]:
    if content is None or isinstance(content, str):
        return [TextDone(text=content or "")]
    items: list[ContentItem] = []
    for part in content:
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            items.append(TextDone(text=part["text"]))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise BadRequest("an image_url part needs a url", param)
            items.append(ImageUrlDone(image_url=url))
        else:
            raise BadRequest(f"content parts of type {shown(kind)} are not supported", param)
    return items


def _arguments(call: _ToolCall, param: str) -> dict[str, Any]:
    raw = call.function.arguments
    if isinstance(raw, dict):
        return raw
    if not raw.strip():
        return {}
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise BadRequest("tool call arguments must be a JSON object", param) from None
    except RecursionError:  # nested past the decoder's depth
        raise BadRequest("tool call arguments are nested too deeply", param) from None
    if not isinstance(value, dict):
        raise BadRequest("tool call arguments must be a JSON object", param)
    return value


def _tool_choice(value: str | dict[str, Any] | None) -> ToolChoice | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        return value  # type: ignore[return-value]
    if isinstance(value, dict):
        function = value.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return [function["name"]]
    raise BadRequest("tool_choice must be auto, none, required or a function", "tool_choice")


def chat_request(body: ChatBody, dialect: str = OPENAI_CHAT) -> TurnRequest:
    """A Chat Completions request as rillet's turn request for a provider of the `dialect`
    wire (its name): system and developer messages are the system prompt, assistant
    `tool_calls` are tool call items, `role: "tool"` messages are tool results (consecutive
    ones in one user message). Raises `BadRequest`, for a field that wire cannot take too."""
    if body.n not in (None, 1):
        raise BadRequest("only n=1 is supported", "n")
    # no dialect's turn brings token log probabilities back: refused as OpenAI refuses them for
    # a model without them, rather than answered with `logprobs: null` code would then index
    refused = [n for n in ("logprobs", "top_logprobs") if getattr(body, n) not in (None, False)]
    refused += [name for name in REFUSED if name in body.extra]
    if body.extra.get("modalities") not in (None, ["text"]):
        refused.append("modalities")
    if refused:
        refusal = f"Unsupported parameter: '{refused[0]}' is not supported here."
        raise BadRequest(refusal, refused[0], "unsupported_parameter")
    _refuse_unsent(body, dialect)
    system: list[str] = []
    messages: list[UniMessage] = []
    # the items of the last message while it holds tool results only: what the next joins (one
    # list grown in place, so a run of results costs its length, not its square)
    results: list[ContentItem] | None = None
    for i, message in enumerate(body.messages):
        param = f"messages[{i}]"
        if message.role in ("system", "developer"):
            if message.name is not None:  # joined into one system prompt, which has no names
                refusal = f"Unsupported parameter: a {message.role} message's 'name'."
                raise BadRequest(refusal, f"{param}.name", "unsupported_parameter")
            system.append(_text_of(message.content, param))
        elif message.role == "user":
            said = _user_items(message.content, param)
            messages.append(UniMessage(role="user", content_items=said, name=message.name))
            results = said if all(type(item) is ToolResultDone for item in said) else None
        elif message.role == "assistant":
            items: list[ContentItem] = []
            text = _text_of(message.content, param)
            if text:
                items.append(TextDone(text=text))
            if message.refusal:  # the model's refusal, sent back as one
                items.append(TextDone(text=message.refusal, fidelity=REFUSAL_FIDELITY))
            for call in message.tool_calls or ():
                args = _arguments(call, param)
                items.append(
                    ToolCallDone(name=call.function.name, arguments=args, tool_call_id=call.id)
                )
            if items:
                finish: FinishReason = "tool_call" if message.tool_calls else "stop"
                messages.append(
                    UniMessage(
                        role="assistant",
                        content_items=items,
                        finish_reason=finish,
                        name=message.name,
                    )
                )
                results = None
        elif message.role == "tool":
            if not message.tool_call_id:
                raise BadRequest("a tool message needs its tool_call_id", param)
            result = ToolResultDone(
                text=_text_of(message.content, param), tool_call_id=message.tool_call_id
            )
            if results is not None:
                results.append(result)
            else:
                results = [result]
                messages.append(UniMessage(role="user", content_items=results))
        else:
            raise BadRequest(f"unknown role {shown(message.role)}", f"{param}.role")
    if not messages:
        raise BadRequest("`messages` holds no user or assistant message", "messages")
    effort = None
    if body.reasoning_effort is not None:
        effort = EFFORTS.get(body.reasoning_effort)
        if effort is None:
            raise BadRequest("unknown reasoning_effort", "reasoning_effort")
    tools = []
    for i, tool in enumerate(body.tools or ()):
        if tool.type != "function":  # a custom tool's call would come back in no shape of ours
            refusal = f"Unsupported value: tools of type {shown(tool.type)} are not supported here."
            raise BadRequest(refusal, f"tools[{i}].type", "unsupported_value")
        function = tool.function
        tools.append(
            ToolSpec(
                name=function.name,
                description=function.description or "",
                parameters=function.parameters,
                strict=function.strict,
            )
        )
    return TurnRequest(
        messages=messages,
        system_prompt="\n\n".join(s for s in system if s) or None,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice),
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        thinking_level=effort,
        extra_body=_passed_on(body),
    )


def _passed_on(body: ChatBody) -> dict[str, dict[str, Any]]:
    """What goes, as the client gave it, to a provider of OpenAI's own wires: every field
    rillet does not act on to Chat Completions; to Responses those of the same meaning,
    `response_format` as its `text.format` and `verbosity` as `text.verbosity`;
    `reasoning_effort` to both as given (`minimal` and `none` included, which the thinking
    levels other dialects read cannot say); to Anthropic's wire `top_p`, and the end user's id
    as its `metadata.user_id`; to Bedrock's Converse `top_p` and `stop`."""
    extra = body.extra
    chat = dict(extra)
    responses = {name: extra[name] for name in (*SHARED_FIELDS, "store") if name in extra}
    if body.reasoning_effort is not None:
        chat["reasoning_effort"] = body.reasoning_effort
        reasoning = {"effort": body.reasoning_effort}
        if body.reasoning_effort != "none":
            reasoning["summary"] = "auto"  # as the dialect asks, so the thinking is shown
        responses["reasoning"] = reasoning
    text: dict[str, Any] = {}
    form = extra.get("response_format")
    if isinstance(form, dict) and form.get("type") == "json_schema":
        schema = form.get("json_schema")
        text["format"] = {"type": "json_schema", **(schema if isinstance(schema, dict) else {})}
    elif isinstance(form, dict) and form.get("type") in ("json_object", "text"):
        text["format"] = {"type": form["type"]}
    if extra.get("verbosity") is not None:
        text["verbosity"] = extra["verbosity"]
    if text:
        responses["text"] = text
    anthropic: dict[str, Any] = {}
    if "top_p" in extra:
        anthropic["top_p"] = extra["top_p"]
    end_user = extra.get("safety_identifier") or extra.get("user")
    if isinstance(end_user, str):
        anthropic["metadata"] = {"user_id": end_user}
    converse: dict[str, Any] = {name: extra[name] for name in ("top_p", "stop") if name in extra}
    passed: dict[str, dict[str, Any]] = {
        OPENAI_CHAT: chat,
        OPENAI_RESPONSES: responses,
        ANTHROPIC: anthropic,
        BEDROCK_CONVERSE: converse,  # as its `inferenceConfig`'s topP and stopSequences
    }
    return {name: fields for name, fields in passed.items() if fields}
