"""Anthropic's Messages request as rillet's turn request, for whichever provider the model routes
to: the messages (text, images, tool calls and results, thinking with its signature), the system
prompt, the tools, the tool choice and the generation settings.

What the provider's wire can carry goes whole. To a provider of Anthropic's own wire every field
goes as given (`system` blocks, `tools`, `tool_choice`, `thinking`, `metadata`, `top_k`, fields
Anthropic adds later), and a block rillet has no item for (a `document`, a server tool's call
or result, a block with `cache_control` or a tool result with `is_error`) rides whole in the
item Anthropic's dialect echoes as it came. To another wire, each setting goes where that wire
has it (`stop_sequences` as OpenAI's `stop`, `metadata.user_id` as its `user`) or the request is
refused, saying which field the routed provider cannot take: never dropped.

Three things are accepted and not forwarded to other wires, since they steer no answer there:
`cache_control` (a caching hint, on a block, a tool, a system block or the request: OpenAI's
wires cache by themselves), `citations` on an earlier answer's text, and `metadata` where the
wire has no user field. A tool result's `is_error` has no field elsewhere either: its text goes
as given. `thinking` (manual, adaptive) and `output_config.effort` become a thinking level.

A thinking block's `signature` is Anthropic's own, byte for byte, when the thinking came from
Anthropic; thinking from another provider that must go back to it (OpenAI-compatible reasoning
details, Gemini's thought signatures) travels as `rillet1.` and its fidelity in base64url, read
back here (`thinking_signature`, `thinking_fidelity`). A tool call's fidelity (Gemini's thought
signature on a function call, which Gemini wants back) rides the same way in a `signature`
field of its `tool_use` block, a field Anthropic's blocks do not have.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

import msgspec

from ..._core._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from ..._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest
from .._bedrock_converse import NAME as BEDROCK_CONVERSE
from .._openai_chat._inbound import BadRequest, read_with_extra, shown
from .._openai_chat._wire import NAME as OPENAI_CHAT
from .._openai_responses._items import NAME as OPENAI_RESPONSES
from ._stream import BLOCK, NAME, REDACTED

if TYPE_CHECKING:
    from ..._core._events import ContentItem, Fidelity, FinishReason

__all__ = [
    "MessagesBody",
    "decode_messages_body",
    "messages_request",
    "thinking_fidelity",
    "thinking_signature",
]


class _Message(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    content: str | list[dict[str, Any]]


class _Read(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a Messages request rillet acts on."""

    model: str
    messages: list[_Message]
    max_tokens: int | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = False


class MessagesBody(_Read, frozen=True, kw_only=True):
    """A Messages request: the fields rillet acts on, and in `extra` every other top-level field
    as the client gave it (see `decode_messages_body`)."""

    extra: dict[str, Any] = msgspec.field(default_factory=dict)


_READ = frozenset(_Read.__struct_fields__)
_decode_read = msgspec.json.Decoder(_Read).decode


def decode_messages_body(raw: bytes) -> MessagesBody:
    """A request body as a `MessagesBody`, its fields rillet does not act on in `extra` (raises
    `msgspec.DecodeError`, `msgspec.ValidationError` included)."""
    body, extra = read_with_extra(raw, _decode_read, _READ)
    return MessagesBody(**msgspec.structs.asdict(body), extra=extra)


# --- thinking signatures --------------------------------------------------------------------------

_OURS = "rillet1."  # no base64 signature holds a dot: a signature of ours is told apart by it


def thinking_signature(fidelity: Fidelity | None) -> str:
    """The `signature` a thinking block goes out with: Anthropic's own when that is all its
    fidelity holds, else the fidelity as `rillet1.<base64url JSON>`, else empty."""
    if not fidelity:
        return ""
    signature = fidelity.get("signature")
    if isinstance(signature, str) and len(fidelity) == 1:
        return signature
    packed = base64.urlsafe_b64encode(msgspec.json.encode(fidelity)).decode("ascii")
    return _OURS + packed


def thinking_fidelity(signature: str) -> Fidelity | None:
    """The fidelity a thinking block's `signature` stands for (`thinking_signature` undone)."""
    if not signature:
        return None
    if signature.startswith(_OURS):
        try:
            value = msgspec.json.decode(base64.urlsafe_b64decode(signature[len(_OURS) :]))
        except (binascii.Error, ValueError, msgspec.DecodeError):
            value = None
        if isinstance(value, dict):
            return value
    return {"signature": signature}


# --- the request ----------------------------------------------------------------------------------

_PLAIN = {
    "text": {"type", "text"},
    "image": {"type", "source"},
    "tool_use": {"type", "id", "name", "input"},
}
_HINTS = {"cache_control", "citations"}  # accepted, not forwarded to other wires (see above)
_LEVELS: tuple[tuple[int, ThinkingLevel], ...] = (
    (32768, "xhigh"),
    (16384, "high"),
    (4096, "medium"),
    (0, "low"),
)


class _Reader:
    """One request's conversion, for the wire of the provider it routes to."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.anthropic = dialect == NAME

    def refuse(self, what: str) -> BadRequest:
        return BadRequest(f"{what} cannot be sent to this model's provider ({self.dialect})", what)

    def kept(self, block: dict[str, Any], param: str) -> TextDone:
        """A block rillet has no item for, whole, for Anthropic's dialect to echo as it came."""
        if not self.anthropic:
            raise self.refuse(f"{param} (a {shown(block.get('type'))} block)")
        return TextDone(text="", fidelity={BLOCK: block})

    def plain(self, block: dict[str, Any], kind: str) -> bool:
        """Whether the block says no more than its item will: true to other wires once the hints
        they take no field for are left out; to Anthropic's only when nothing is left out."""
        extra = block.keys() - _PLAIN[kind]
        return not extra or (not self.anthropic and extra <= _HINTS)

    def image(self, block: dict[str, Any], param: str) -> ContentItem:
        source = block.get("source")
        if isinstance(source, dict) and self.plain(block, "image"):
            if source.get("type") == "base64" and isinstance(source.get("data"), str):
                media = source.get("media_type")
                if not isinstance(media, str):
                    raise BadRequest(f"{param}.source.media_type: Field required", param)
                return ImageUrlDone(image_url=f"data:{media};base64,{source['data']}")
            if source.get("type") == "url" and isinstance(source.get("url"), str):
                return ImageUrlDone(image_url=source["url"])
        return self.kept(block, param)

    def tool_result(self, block: dict[str, Any], param: str) -> ContentItem:
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise BadRequest(f"{param}.tool_use_id: Field required", param)
        extra = block.keys() - {"type", "tool_use_id", "content", "is_error"}
        if self.anthropic and (extra or block.get("is_error")):
            return self.kept(block, param)
        content = block.get("content", "")
        if isinstance(content, str):
            return ToolResultDone(text=content, tool_call_id=call_id)
        if not isinstance(content, list):
            raise BadRequest(f"{param}.content must be a string or a list of blocks", param)
        texts: list[str] = []
        images: list[str] = []
        for j, given in enumerate(content):
            where = f"{param}.content[{j}]"
            part = (
                {k: v for k, v in given.items() if v is not None} if isinstance(given, dict) else {}
            )
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str) and self.plain(part, "text"):
                texts.append(part["text"])
                continue
            if kind == "image":
                image = self.image(part, where)
                if type(image) is ImageUrlDone:
                    images.append(image.image_url)
                    continue
            if self.anthropic:
                return self.kept(block, param)  # a part rillet cannot say: the block goes whole
            raise self.refuse(f"{where} (a {shown(kind)} block)")
        if self.anthropic and len(texts) > 1:
            return self.kept(block, param)  # joined, they would not be the same blocks
        return ToolResultDone(text="\n".join(texts), images=images or None, tool_call_id=call_id)

    def thinking(self, block: dict[str, Any], param: str) -> ContentItem:
        if block["type"] == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str):
                raise BadRequest(f"{param}.data: Field required", param)
            return ThinkingDone(thinking=REDACTED, fidelity={"signature": data})
        thinking, signature = block.get("thinking"), block.get("signature", "")
        if not isinstance(thinking, str) or not isinstance(signature, str):
            raise BadRequest(f"{param}: thinking and signature must be strings", param)
        if self.anthropic and block.keys() - {"type", "thinking", "signature"}:
            return self.kept(block, param)
        return ThinkingDone(thinking=thinking, fidelity=thinking_fidelity(signature))

    def items(self, role: str, content: str | list[dict[str, Any]], param: str) -> list[Any]:
        if isinstance(content, str):
            return [TextDone(text=content)] if content or role == "user" else []
        items: list[ContentItem] = []
        for j, given in enumerate(content):
            where = f"{param}.content[{j}]"
            # a field given as null says nothing (a client echoing a reply's blocks sends its
            # unset fields so): it makes no block more than its item
            block = {key: value for key, value in given.items() if value is not None}
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                cited = block.keys() - _PLAIN["text"] == {"citations"}
                if self.plain(block, "text"):
                    items.append(TextDone(text=block["text"]))
                elif self.anthropic and cited and isinstance(block["citations"], list):
                    fidelity = {"citations": block["citations"]} if block["citations"] else None
                    items.append(TextDone(text=block["text"], fidelity=fidelity))
                else:
                    items.append(self.kept(block, where))
            elif kind == "image" and role == "user":
                items.append(self.image(block, where))
            elif kind == "tool_result" and role == "user":
                items.append(self.tool_result(block, where))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise BadRequest(f"{where}: a tool_use block needs its id and name", where)
                arguments = block.get("input", {})
                if not isinstance(arguments, dict):
                    raise BadRequest(f"{where}.input must be an object", where)
                signature = block.pop("signature", "")  # a call's fidelity, as it went out
                if not self.plain(block, "tool_use"):
                    items.append(self.kept(block, where))
                    continue
                fidelity = thinking_fidelity(signature) if isinstance(signature, str) else None
                call = ToolCallDone(
                    name=block["name"],
                    arguments=arguments,
                    tool_call_id=block["id"],
                    fidelity=fidelity,
                )
                items.append(call)
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                items.append(self.thinking(block, where))
            elif isinstance(kind, str):
                items.append(self.kept(block, where))
            else:
                raise BadRequest(f"{where}.type: Field required", where)
        return items

    def system(self, system: str | list[dict[str, Any]] | None) -> str | None:
        if system is None or isinstance(system, str):
            return system or None
        texts = []
        for i, block in enumerate(system):
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"system[{i}]: only text blocks are accepted", f"system[{i}]")
            texts.append(block["text"])
        return "\n\n".join(t for t in texts if t) or None

    def tools(self, tools: list[dict[str, Any]] | None) -> list[ToolSpec]:
        specs = []
        for i, tool in enumerate(tools or ()):
            if tool.get("type") not in (None, "custom"):  # a server tool: Anthropic's to run
                if not self.anthropic:
                    raise self.refuse(f"tools[{i}] (a {shown(tool.get('type'))} tool)")
                continue
            name = tool.get("name")
            if not isinstance(name, str):
                raise BadRequest(f"tools[{i}].name: Field required", f"tools[{i}]")
            schema = tool.get("input_schema")
            if not isinstance(schema, dict):
                raise BadRequest(f"tools[{i}].input_schema: Field required", f"tools[{i}]")
            description = tool.get("description")
            specs.append(
                ToolSpec(
                    name=name,
                    description=description if isinstance(description, str) else "",
                    parameters=schema,
                )
            )
        return specs

    def tool_choice(
        self, choice: dict[str, Any] | None, passed: dict[str, dict[str, Any]]
    ) -> ToolChoice | None:
        if choice is None:
            return None
        kind = choice.get("type")
        chosen: ToolChoice
        if kind == "auto":
            chosen = "auto"
        elif kind == "any":
            chosen = "required"
        elif kind == "none":
            chosen = "none"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            chosen = [choice["name"]]
        else:
            raise BadRequest("tool_choice.type must be auto, any, tool or none", "tool_choice")
        if choice.get("disable_parallel_tool_use"):
            if self.dialect not in (OPENAI_CHAT, OPENAI_RESPONSES, NAME):
                raise self.refuse("tool_choice.disable_parallel_tool_use")
            for wire in (OPENAI_CHAT, OPENAI_RESPONSES):
                passed[wire]["parallel_tool_calls"] = False
        return chosen


_READ_ELSEWHERE = frozenset({"output_config", "cache_control"})  # read by `_level`; a hint

_EFFORTS: frozenset[str] = frozenset({"low", "medium", "high", "xhigh", "max"})


def _level(body: MessagesBody, reader: _Reader) -> ThinkingLevel | None:
    """The thinking level of Anthropic's `thinking` and `output_config.effort`: the effort
    named, else for manual thinking the highest level whose budget the client's
    `budget_tokens` reaches (`low` under 4096), for adaptive thinking `medium`; none when
    thinking is disabled or not asked for."""
    thinking = body.thinking or {}
    kind = thinking.get("type")
    output = body.extra.get("output_config")
    effort = output.get("effort") if isinstance(output, dict) else None
    if not reader.anthropic and isinstance(output, dict) and output.keys() - {"effort"}:
        raise reader.refuse(f"output_config.{sorted(output.keys() - {'effort'})[0]}")
    if effort is not None and effort not in _EFFORTS:
        raise BadRequest(f"output_config.effort: unknown effort {shown(effort)}", "output_config")
    if kind == "disabled":
        return None
    if effort is not None:
        return effort  # type: ignore[no-any-return]
    if kind is None or kind == "adaptive":
        return "medium" if kind else None
    if kind != "enabled":
        if reader.anthropic:
            return None  # a kind added later: Anthropic's to read, as it came
        raise reader.refuse(f"thinking of type {shown(kind)}")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise BadRequest("thinking.budget_tokens: Field required", "thinking")
    return next(level for floor, level in _LEVELS if budget >= floor)


def messages_request(body: MessagesBody, dialect: str) -> TurnRequest:
    """A Messages request as rillet's turn request for a provider of the `dialect` wire (its
    name: `anthropic`, `openai-chat`...). Raises `BadRequest` for what that wire cannot take."""
    if body.max_tokens is None:
        raise BadRequest("max_tokens: Field required", "max_tokens")
    if body.max_tokens < 1:
        raise BadRequest("max_tokens: must be at least 1", "max_tokens")
    reader = _Reader(dialect)
    passed: dict[str, dict[str, Any]] = {
        OPENAI_CHAT: {},
        OPENAI_RESPONSES: {},
        NAME: {},
        BEDROCK_CONVERSE: {},
    }
    messages: list[UniMessage] = []
    for i, message in enumerate(body.messages):
        param = f"messages[{i}]"
        if message.role not in ("user", "assistant"):
            raise BadRequest(f"{param}.role: must be user or assistant", param)
        items = reader.items(message.role, message.content, param)
        if message.role == "user":
            messages.append(UniMessage(role="user", content_items=items))
        elif items:
            calls = any(type(item) is ToolCallDone for item in items)
            finish: FinishReason = "tool_call" if calls else "stop"
            messages.append(UniMessage(role="assistant", content_items=items, finish_reason=finish))
    if not messages:
        raise BadRequest("messages: at least one message is required", "messages")
    tools = reader.tools(body.tools)
    choice = reader.tool_choice(body.tool_choice, passed)
    level = _level(body, reader)
    settings = {"top_p": body.top_p, "top_k": body.top_k, "stop_sequences": body.stop_sequences}
    for name, value in settings.items():
        if value is None:
            continue
        if name == "top_p" and dialect in (OPENAI_CHAT, OPENAI_RESPONSES, BEDROCK_CONVERSE):
            passed[dialect]["top_p"] = value
        elif name == "stop_sequences" and dialect == OPENAI_CHAT:
            passed[OPENAI_CHAT]["stop"] = value
        elif name == "stop_sequences" and dialect == BEDROCK_CONVERSE:
            passed[BEDROCK_CONVERSE]["stop_sequences"] = value
        elif name == "top_k" and dialect == OPENAI_CHAT:
            passed[OPENAI_CHAT]["top_k"] = (
                value  # OpenAI-compatible servers read it; OpenAI says no
            )
        elif not reader.anthropic:
            raise reader.refuse(name)
    user_id = (body.metadata or {}).get("user_id")
    if isinstance(user_id, str) and dialect in (OPENAI_CHAT, OPENAI_RESPONSES):
        passed[dialect]["user"] = user_id
    unread = body.extra.keys() - _READ_ELSEWHERE
    if unread and not reader.anthropic:
        raise reader.refuse(sorted(unread)[0])
    if reader.anthropic:  # Anthropic's own wire: every field as the client gave it
        own = {
            "system": body.system if isinstance(body.system, list) else None,
            "tools": body.tools,
            "tool_choice": body.tool_choice,
            "thinking": body.thinking,
            "metadata": body.metadata,
            **settings,
            **body.extra,
        }
        passed[NAME] = {k: v for k, v in own.items() if v is not None}
    return TurnRequest(
        messages=messages,
        system_prompt=reader.system(body.system),
        tools=tools,
        tool_choice=choice,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        thinking_level=level,
        extra_body={wire: fields for wire, fields in passed.items() if fields},
    )
