"""OpenAI's Responses request (the open Responses specification's too) as rillet's turn request,
for a server that answers it over any dialect: `input` as a string or as items (messages with
their parts, the model's earlier function calls and their outputs, its earlier reasoning),
`instructions` as the system prompt, function tools (`strict` included), the tool choice and the
generation settings.

Every field rillet does not act on goes, unchanged, to a provider speaking OpenAI's Responses
wire (`extra_body`); those Chat Completions has under the same meaning go to a provider of that
wire (`text.format` as its `response_format`, `reasoning.effort` as `reasoning_effort`,
`text.verbosity` as `verbosity`), and Anthropic's wire takes `top_p` and the end user's id. A
field that would shape the answer and that the routed provider's wire has no place for is
refused with OpenAI's `unsupported_parameter` naming it, never dropped; only hints that leave
the answer as it is (a prompt cache key, the end user's id, `metadata`, which the response
echoes) and settings at their default go without a place. What no provider behind the endpoint
can honour (a conversation kept by the server, `previous_response_id`, built-in tools) is
refused whatever the provider."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..._core._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from ..._core._request import ToolChoice, ToolSpec, TurnRequest
from .._anthropic._stream import NAME as ANTHROPIC
from .._openai_chat._inbound import (
    EFFORTS,
    HINTS,
    SHARED_FIELDS,
    BadRequest,
    other_fields,
    shown,
    unsent,
)
from .._openai_chat._stream import REFUSAL_FIDELITY
from .._openai_chat._wire import NAME as OPENAI_CHAT
from ._items import NAME as OPENAI_RESPONSES

if TYPE_CHECKING:
    from ..._core._events import ContentItem, FinishReason

Role = Literal["user", "assistant"]

__all__ = ["ResponsesBody", "decode_responses_body", "responses_request"]


class _Read(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a Responses request rillet acts on."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    store: bool | None = None
    background: bool | None = None


class ResponsesBody(_Read, frozen=True, kw_only=True):
    """A Responses request: the fields rillet acts on, and in `extra` every other top-level
    field as the client gave it (see `decode_responses_body`)."""

    extra: dict[str, Any] = msgspec.field(default_factory=dict)


_READ = frozenset(_Read.__struct_fields__)
_decode_read = msgspec.json.Decoder(_Read).decode


def decode_responses_body(raw: bytes) -> ResponsesBody:
    """A request body as a `ResponsesBody`, its other fields in `extra` (raises
    `msgspec.DecodeError`, `msgspec.ValidationError` included)."""
    body = _decode_read(raw)
    return ResponsesBody(**msgspec.structs.asdict(body), extra=other_fields(raw, _READ))


_REFUSED = ("previous_response_id", "conversation", "prompt")
"""Fields that ask the server for what it does not keep: a stored conversation or prompt.
Refused with `unsupported_parameter`. (`background` is the server's own to honour: the
response runs apart from its connection and can be resumed; no provider is asked for it.)"""
_ROLES = ("user", "assistant", "system", "developer")


def _unsupported(param: str, what: str | None = None) -> BadRequest:
    message = f"Unsupported parameter: '{what or param}' is not supported here."
    return BadRequest(message, param, "unsupported_parameter")


def _parts(content: Any, param: str, role: str) -> list[ContentItem]:
    """A message's content as items: text, images; an assistant's text and refusals."""
    if isinstance(content, str):
        return [TextDone(text=content)]
    if not isinstance(content, list):
        raise BadRequest("a message's content must be a string or a list of parts", param)
    items: list[ContentItem] = []
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            items.append(TextDone(text=part["text"]))
        elif kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
            items.append(TextDone(text=part["refusal"], fidelity=REFUSAL_FIDELITY))
        elif kind == "input_image" and role != "assistant":
            url = part.get("image_url")
            if not isinstance(url, str):  # a file id names a file the server does not have
                raise _unsupported(f"{where}.file_id", "an input_image without image_url")
            items.append(ImageUrlDone(image_url=url))
        else:
            refusal = f"Unsupported value: content parts of type {shown(kind)} are not supported"
            raise BadRequest(refusal + " here.", f"{where}.type", "unsupported_value")
    return items


def _arguments(raw: Any, param: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise BadRequest("a function call's arguments must be a JSON object", param) from None
    if not isinstance(value, dict):
        raise BadRequest("a function call's arguments must be a JSON object", param)
    return value


def _output_text(output: Any, param: str) -> str:
    """A function call's output as text: a string, or its text parts joined."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        texts = [p.get("text") for p in output if isinstance(p, dict)]
        if all(isinstance(t, str) for t in texts):
            return "".join(t for t in texts if isinstance(t, str))
    raise BadRequest("a function call's output must be a string or text parts", param)


class _Conversation:
    """The messages being built from `input`'s items, consecutive items of one side joined."""

    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[UniMessage] = []
        self._items: list[ContentItem] | None = None  # the last message's, while it may grow
        self._role: Role | None = None

    def add(self, role: Role, items: list[ContentItem], *, join: bool) -> None:
        if join and self._role == role and self._items is not None:
            self._items.extend(items)
            return
        finish: FinishReason | None = None
        if role == "assistant":
            calls = any(type(item) is ToolCallDone for item in items)
            finish = "tool_call" if calls else "stop"
        kept = list(items)
        self.messages.append(UniMessage(role=role, content_items=kept, finish_reason=finish))
        self._items, self._role = (kept, role) if join else (None, None)

    def item(self, item: dict[str, Any], param: str) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise BadRequest(f"unknown role {shown(role)}", f"{param}.role")
            if role in ("system", "developer"):
                parts = _parts(item.get("content"), param, role)
                self.system.append("".join(p.text for p in parts if type(p) is TextDone))
                return
            said: Role = "assistant" if role == "assistant" else "user"
            self.add(said, _parts(item.get("content"), param, role), join=False)
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise BadRequest("a function_call item needs its call_id and name", param)
            arguments = _arguments(item.get("arguments"), f"{param}.arguments")
            call = ToolCallDone(name=name, arguments=arguments, tool_call_id=call_id)
            self.add("assistant", [call], join=True)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest("a function_call_output item needs its call_id", param)
            text = _output_text(item.get("output"), f"{param}.output")
            self.add("user", [ToolResultDone(text=text, tool_call_id=call_id)], join=True)
        elif kind == "reasoning":  # the model's earlier thinking, as its summary said it
            summary = item.get("summary") or []
            text = "".join(part.get("text", "") for part in summary if isinstance(part, dict))
            encrypted = item.get("encrypted_content")
            # (kept for a Responses provider to replay; another provider reads the summary)
            fidelity = {"encrypted_content": encrypted, "channel": "summary"} if encrypted else None
            if text or fidelity:
                thinking = ThinkingDone(thinking=text, fidelity=fidelity)
                self.add("assistant", [thinking], join=True)
        else:
            refusal = f"Unsupported value: input items of type {shown(kind)} are not supported"
            raise BadRequest(refusal + " here.", f"{param}.type", "unsupported_value")


def _tools(body: ResponsesBody) -> list[ToolSpec]:
    tools = []
    for i, tool in enumerate(body.tools or ()):
        kind = tool.get("type")
        if kind != "function":  # a built-in tool runs at OpenAI; its calls come in no shape of ours
            refusal = f"Unsupported value: tools of type {shown(kind)} are not supported here."
            raise BadRequest(refusal, f"tools[{i}].type", "unsupported_value")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("a function tool needs its name", f"tools[{i}].name")
        tools.append(
            ToolSpec(
                name=name,
                description=tool.get("description") or "",
                parameters=tool.get("parameters"),
                strict=tool.get("strict"),
            )
        )
    return tools


def _tool_choice(value: str | dict[str, Any] | None) -> ToolChoice | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        return value  # type: ignore[return-value]
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("name"), str)
    ):
        return [value["name"]]
    raise BadRequest("tool_choice must be auto, none, required or a function", "tool_choice")


_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "truncation": ("disabled",),
    "service_tier": ("auto", "default"),
    "parallel_tool_calls": (True,),
    "include": ([], ["reasoning.encrypted_content"]),  # carried when the provider gives it
}
"""Settings at the value that asks a provider for nothing more than it does without them."""


def _refuse_unsent(body: ResponsesBody, dialect: str) -> None:
    """Refuse the first field that would shape the answer and that the `dialect`'s wire has
    no place for (see the module's docstring)."""
    if dialect == OPENAI_RESPONSES:
        return
    for name, value in body.extra.items():
        carried = (dialect == OPENAI_CHAT and name in SHARED_FIELDS) or (
            dialect == ANTHROPIC and name == "top_p"
        )
        if not carried and name not in HINTS and value not in _DEFAULTS.get(name, ()):
            raise unsent(name, dialect, "OpenAI's Responses API")
    for key, value in (body.text or {}).items():
        kind = value.get("type") if isinstance(value, dict) else None
        plain = key == "format" and kind in (None, "text")
        chat = dialect == OPENAI_CHAT and (
            (key == "format" and kind in ("json_schema", "json_object")) or key == "verbosity"
        )
        if not (plain or chat):
            raise unsent(f"text.{key}", dialect, "OpenAI's Responses API")


def responses_request(body: ResponsesBody, dialect: str) -> TurnRequest:
    """A Responses request as rillet's turn request for a provider of the `dialect` wire (its
    name: `openai-responses`, `openai-chat`, `anthropic`...). Raises `BadRequest` for what
    the server cannot honour, and for what that wire cannot take."""
    for name in _REFUSED:
        if name in body.extra and body.extra[name] not in (False, None):
            raise _unsupported(name)
    _refuse_unsent(body, dialect)
    conversation = _Conversation()
    if isinstance(body.input, str):
        conversation.add("user", [TextDone(text=body.input)], join=False)
    else:
        for i, item in enumerate(body.input):
            if not isinstance(item, dict):
                raise BadRequest("an input item must be an object", f"input[{i}]")
            conversation.item(item, f"input[{i}]")
    if not conversation.messages:
        raise BadRequest("`input` holds nothing to answer", "input")
    effort = None
    reasoning = body.reasoning or {}
    if reasoning.get("effort") is not None:
        effort = EFFORTS.get(reasoning["effort"])
        if effort is None:
            raise BadRequest("unknown reasoning effort", "reasoning.effort")
    system = [body.instructions or "", *conversation.system]
    return TurnRequest(
        messages=conversation.messages,
        system_prompt="\n\n".join(s for s in system if s) or None,
        tools=_tools(body),
        tool_choice=_tool_choice(body.tool_choice),
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        thinking_level=effort,
        extra_body=_passed_on(body),
    )


def _passed_on(body: ResponsesBody) -> dict[str, dict[str, Any]]:
    """What goes, as the client gave it, to a provider of OpenAI's own wires: every field
    rillet does not act on (and `reasoning`, `text`, `store` as given) to Responses; to Chat
    Completions those of the same meaning, `text.format` as its `response_format`,
    `text.verbosity` as `verbosity` and `reasoning.effort` as `reasoning_effort`; to
    Anthropic's wire `top_p`, and the end user's id as its `metadata.user_id`."""
    responses = dict(body.extra)
    for name in ("reasoning", "text", "store"):
        if (value := getattr(body, name)) is not None:
            responses[name] = value
    chat = {name: body.extra[name] for name in SHARED_FIELDS if name in body.extra}
    if body.reasoning and body.reasoning.get("effort") is not None:
        chat["reasoning_effort"] = body.reasoning["effort"]
    form = (body.text or {}).get("format")
    if isinstance(form, dict) and form.get("type") == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(form, dict) and form.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if (body.text or {}).get("verbosity") is not None:
        chat["verbosity"] = (body.text or {})["verbosity"]
    anthropic: dict[str, Any] = {}
    if "top_p" in body.extra:
        anthropic["top_p"] = body.extra["top_p"]
    end_user = body.extra.get("safety_identifier") or body.extra.get("user")
    if isinstance(end_user, str):
        anthropic["metadata"] = {"user_id": end_user}
    passed = {OPENAI_CHAT: chat, OPENAI_RESPONSES: responses, ANTHROPIC: anthropic}
    return {name: fields for name, fields in passed.items() if fields}
