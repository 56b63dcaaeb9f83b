"""Amazon Bedrock's ConverseStream API (`POST /model/{modelId}/converse-stream`), whose reply
is an AWS event stream (`rillet._core._eventstream`) of JSON events.

Text blocks have no start event: a `contentBlockDelta` opens its block's lane. A `toolUse` block
starts with its name and id; its input comes as JSON text in its deltas. `reasoningContent`
deltas carry text, then a `signature` (an empty thinking fragment with `fidelity
{"signature"}`, sent back as Anthropic's thinking is), or `redactedContent`. `messageStop`
gives the stop reason; `metadata`, after it, the usage (`cacheReadInputTokens` as cached,
`cacheWriteInputTokens` as written, both kept apart as Anthropic's are), and ends the reply.
An `exception` message is the provider's error, typed by its `:exception-type`.

Credentials: a Bedrock API key goes as `Authorization: Bearer`; without one, each request is
signed with SigV4 from botocore's credential chain (the `bedrock` extra).
"""

from __future__ import annotations

import base64
import os
import re
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlsplit

import msgspec
from rillet._core._errors import ConfigurationError
from rillet._core._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._core._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from .._core._dialect import HttpRequest, Provider, strict_decode
from ._error_body import provider_error

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._errors import ProviderError
    from rillet._core._eventstream import EventStreamMessage
    from rillet._core._request import TurnRequest

    from .._core._dialect import StreamDecoder

__all__ = ["BedrockConverseDialect", "converse_base_url"]

NAME = "bedrock-converse"
REDACTED = "_REDACTED_THINKING"
DEFAULT_MAX_TOKENS = 4096
_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": 63999}
_HOST = re.compile(r"bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
_FORMATS = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "gif": "gif", "webp": "webp"}


def converse_base_url(region: str) -> str:
    """Amazon Bedrock's runtime endpoint in a region (its Converse API)."""
    return f"https://bedrock-runtime.{region}.amazonaws.com"


# --- the request ---------------------------------------------------------------------------------


def _image(url: str) -> dict[str, Any]:
    if not url.startswith("data:"):
        raise ConfigurationError(
            NAME, None, "Bedrock's Converse API takes images as data: URLs only (inline bytes)"
        )
    head, _, data = url.partition(",")
    media = head[5:].split(";")[0]
    fmt = _FORMATS.get(media.rpartition("/")[2], "png")
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def _content(message: UniMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            if item.text:
                blocks.append({"text": item.text})
        elif type(item) is ThinkingDone:
            signature = (item.fidelity or {}).get("signature", "")
            if item.thinking == REDACTED:
                blocks.append({"reasoningContent": {"redactedContent": signature}})
            else:
                text: dict[str, Any] = {"text": item.thinking}
                if signature:
                    text["signature"] = signature
                blocks.append({"reasoningContent": {"reasoningText": text}})
        elif type(item) is ToolCallDone:
            blocks.append(
                {
                    "toolUse": {
                        "toolUseId": item.tool_call_id,
                        "name": item.name,
                        "input": item.arguments,
                    }
                }
            )
        elif type(item) is ToolResultDone:
            content: list[dict[str, Any]] = [{"text": item.text}]
            content.extend(_image(url) for url in item.images or ())
            blocks.append({"toolResult": {"toolUseId": item.tool_call_id, "content": content}})
        elif type(item) is ImageUrlDone:
            blocks.append(_image(item.image_url))
    return blocks


def converse_body(request: TurnRequest) -> dict[str, Any]:
    """The Converse request body for a turn (the model goes in the URL). A turn's sampling
    settings beyond temperature come in its `extra_body` for this dialect, as other wires
    spell them (`top_p`, `stop_sequences`, `stop`) or as Converse does: they go in
    `inferenceConfig` as `topP` and `stopSequences`."""
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _content(m)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)  # Converse alternates roles: tool results
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"messages": messages}
    if request.system_prompt:
        body["system"] = [{"text": request.system_prompt}]
    config: dict[str, Any] = {"maxTokens": request.max_tokens or DEFAULT_MAX_TOKENS}
    if request.temperature is not None:
        config["temperature"] = request.temperature
    body["inferenceConfig"] = config
    if request.tools and request.tool_choice != "none":
        tools: dict[str, Any] = {
            "tools": [
                {
                    "toolSpec": {
                        "name": t.name,
                        "description": t.description or t.name,
                        "inputSchema": {
                            "json": t.parameters or {"type": "object", "properties": {}}
                        },
                    }
                }
                for t in request.tools
            ]
        }
        choice = request.tool_choice
        if choice == "auto":
            tools["toolChoice"] = {"auto": {}}
        elif choice == "required":
            tools["toolChoice"] = {"any": {}}
        elif isinstance(choice, list) and choice:
            tools["toolChoice"] = {"tool": {"name": choice[0]}}
        body["toolConfig"] = tools
    level = request.thinking_level
    if level is not None and level != "none":
        budget = min(_BUDGETS[level], max(1024, config["maxTokens"] - 1))
        body["additionalModelRequestFields"] = {
            "thinking": {"type": "enabled", "budget_tokens": budget}
        }
    extra = dict(request.extra_body.get(NAME, {}))
    for key, field in _INFERENCE.items():  # sampling settings, in any wire's spelling
        value = extra.pop(key, None)
        if value is not None:
            config[field] = [value] if isinstance(value, str) else value  # `stop: "END"`
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}  # `inferenceConfig` as given wins
        else:
            body[key] = value
    return body


_INFERENCE = {
    "top_p": "topP",
    "topP": "topP",
    "stop_sequences": "stopSequences",
    "stop": "stopSequences",
    "stopSequences": "stopSequences",
}
"""Where Converse takes what other wires send at the top level (Anthropic's `top_p` and
`stop_sequences`, OpenAI's `top_p` and `stop`): in `inferenceConfig`, which is the only place
it reads them (a top-level `topP` is a `ValidationException`)."""


def _region(url: str) -> str:
    found = _HOST.search(urlsplit(url).hostname or "")
    if found:
        return found.group(1)
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


class _Signer:
    """SigV4 signing with botocore's credential chain (env keys, profiles, session tokens),
    looked up once and refreshed by botocore as it needs."""

    def __init__(self) -> None:
        try:
            from botocore.session import Session
        except ImportError:
            raise ConfigurationError(
                NAME,
                "AWS_BEARER_TOKEN_BEDROCK",
                "no Bedrock API key and no botocore to sign with: set AWS_BEARER_TOKEN_BEDROCK,"
                " or install rillet[bedrock] to use your AWS credentials",
            ) from None
        self._credentials: Any = Session().get_credentials()
        if self._credentials is None:
            raise ConfigurationError(
                NAME,
                "AWS_ACCESS_KEY_ID",
                "no AWS credentials found: set AWS_BEARER_TOKEN_BEDROCK, or AWS_ACCESS_KEY_ID and"
                " AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)",
            )

    def sign(self, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="POST", url=url, data=body, headers=headers)
        SigV4Auth(self._credentials.get_frozen_credentials(), "bedrock", _region(url)).add_auth(
            request
        )
        return {name: str(value) for name, value in request.headers.items()}


class BedrockConverseDialect:
    """Amazon Bedrock's ConverseStream API."""

    name = NAME
    framing: Literal["eventstream"] = "eventstream"

    def __init__(self) -> None:
        self._signer: _Signer | None = None

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/model/{model}/converse-stream` (or `/converse`), with a Bedrock API key
        as a bearer token, else signed with SigV4."""
        path = "converse-stream" if stream else "converse"
        url = provider.url(f"/model/{quote(provider.model, safe='')}/{path}")
        body = msgspec.json.encode(converse_body(request))
        headers = {"content-type": "application/json", **provider.headers}
        if stream:
            headers["accept"] = "application/vnd.amazon.eventstream"
        if provider.api_key is not None:
            headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
        else:
            if self._signer is None:
                self._signer = _Signer()
            headers = self._signer.sign(url, headers, body)
        return HttpRequest(url=url, headers=headers, body=body)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's messages."""
        return ConverseStreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming Converse reply as the stream the API would have sent."""
        reply = strict_decode(_decode_any, body, NAME)
        if not isinstance(reply, dict):
            return []
        out: list[LaneEvent] = [MessageStart()]
        message = (reply.get("output") or {}).get("message") or {}
        for index, block in enumerate(message.get("content") or ()):
            out.extend(_whole_block(index, block))
        usage = reply.get("usage")
        out.append(
            MessageDelta(
                finish_reason=reply.get("stopReason"),
                usage=_usage(usage) if isinstance(usage, dict) else None,
            )
        )
        out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"message"}` typed by the `x-amzn-ErrorType` header (`ThrottlingException:...`)."""
        kind = headers.get("x-amzn-errortype") or headers.get("x-amzn-ErrorType") or ""
        return _error(kind.partition(":")[0], body, status=status)


# --- the stream ----------------------------------------------------------------------------------

_decode_any = msgspec.json.Decoder()


def _error(kind: str, payload: bytes, *, status: int | None = None) -> ProviderError:
    message = ""
    try:
        data = _decode_any.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        data = None
    if isinstance(data, dict):
        message = str(data.get("message") or data.get("Message") or "")
    elif payload:
        message = payload.decode("utf-8", "replace")
    return provider_error(
        NAME,
        status=status,
        error_types=(kind or None,),
        message=message,
        in_stream=status is None,
        provider_fields={"type": kind} if kind else None,
    )


def _usage(u: dict[str, Any]) -> RawUsage:
    def count(name: str) -> int | None:
        value = u.get(name)
        return value if isinstance(value, int) else None

    read, written, given = (
        count("cacheReadInputTokens"),
        count("cacheWriteInputTokens"),
        count("inputTokens"),
    )
    return RawUsage(
        cached_tokens=read,
        prompt_tokens=None if given is None else given + (written or 0),
        response_tokens=count("outputTokens"),
        cache_write_tokens=written,
    )


def _whole_block(index: int, block: Any) -> list[LaneEvent]:
    if not isinstance(block, dict):
        return []
    if "text" in block:
        return [
            PartStart(index=index, kind="text"),
            PartDelta(index, "text", str(block["text"])),
            PartStop(index, "text"),
        ]
    if "toolUse" in block:
        use = block["toolUse"]
        return [
            PartStart(
                index=index, kind="tool_call", name=use.get("name", ""), call_id=use["toolUseId"]
            ),
            PartDelta(index, "tool_call", msgspec.json.encode(use.get("input", {})).decode()),
            PartStop(index, "tool_call"),
        ]
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict):
        out: list[LaneEvent] = [PartStart(index=index, kind="thinking")]
        text = reasoning.get("reasoningText") or {}
        if "redactedContent" in reasoning:
            out.append(PartDelta(index, "thinking", REDACTED, {"signature": _b64(reasoning)}))
        else:
            out.append(PartDelta(index, "thinking", str(text.get("text", ""))))
            if text.get("signature"):
                out.append(PartDelta(index, "thinking", "", {"signature": text["signature"]}))
        out.append(PartStop(index, "thinking"))
        return out
    return []


def _b64(reasoning: dict[str, Any]) -> str:
    value = reasoning.get("redactedContent", "")
    return value if isinstance(value, str) else base64.b64encode(bytes(value)).decode()


class ConverseStreamDecoder:
    """One attempt's ConverseStream messages."""

    __slots__ = ("_done", "_kinds", "_stopped")

    def __init__(self) -> None:
        self._kinds: dict[int, LaneKind] = {}  # open block index -> its lane's kind
        self._stopped = False  # `messageStop` came: `metadata` (the usage) ends the reply
        self._done = False

    def feed(self, frame: EventStreamMessage) -> list[LaneEvent]:
        """Take one event-stream message; return its lane events."""
        if self._done:
            return []
        kind = frame.message_type
        if kind != "event":
            self._done = True
            name = frame.header(":exception-type") or frame.header(":error-code") or kind
            return [ProviderErrorEvent(_error(name, frame.payload))]
        event = frame.header(":event-type")
        if event not in _EVENTS:
            return []  # an event type added later
        data = strict_decode(_decode_any, frame.payload, NAME)
        if not isinstance(data, dict):
            return []
        if event == "contentBlockDelta":
            return self._delta(_index(data), data.get("delta") or {})
        if event == "contentBlockStart":
            start = data.get("start") or {}
            use = start.get("toolUse") if isinstance(start, dict) else None
            index = _index(data)
            if isinstance(use, dict):
                self._kinds[index] = "tool_call"
                return [
                    PartStart(
                        index=index,
                        kind="tool_call",
                        name=str(use.get("name", "")),
                        call_id=str(use.get("toolUseId", "")),
                    ),
                    PartDelta(index, "tool_call", ""),
                ]
            return []
        if event == "contentBlockStop":
            lane = self._kinds.pop(_index(data), None)
            return [] if lane is None else [PartStop(_index(data), lane)]
        if event == "messageStart":
            return [MessageStart()]
        if event == "messageStop":
            self._stopped = True
            return [MessageDelta(finish_reason=data.get("stopReason"))]
        usage = data.get("usage")  # metadata
        self._done = True
        out: list[LaneEvent] = []
        if isinstance(usage, dict):
            out.append(MessageDelta(usage=_usage(usage)))
        out.append(MessageStop())
        return out

    def _delta(self, index: int, delta: Any) -> list[LaneEvent]:
        if not isinstance(delta, dict):
            return []
        out: list[LaneEvent] = []
        if "text" in delta:
            out += self._open(index, "text")
            out.append(PartDelta(index, "text", str(delta["text"])))
        elif "toolUse" in delta:
            use = delta["toolUse"] or {}
            out.append(PartDelta(index, "tool_call", str(use.get("input", ""))))
        elif "reasoningContent" in delta:
            reasoning = delta["reasoningContent"] or {}
            out += self._open(index, "thinking")
            if "text" in reasoning:
                out.append(PartDelta(index, "thinking", str(reasoning["text"])))
            if "signature" in reasoning:
                out.append(
                    PartDelta(index, "thinking", "", {"signature": str(reasoning["signature"])})
                )
            if "redactedContent" in reasoning:
                out.append(PartDelta(index, "thinking", REDACTED, {"signature": _b64(reasoning)}))
        return out

    def _open(self, index: int, kind: LaneKind) -> list[LaneEvent]:
        if index in self._kinds:
            return []
        self._kinds[index] = kind
        return [PartStart(index=index, kind=kind)]

    def close(self) -> list[LaneEvent]:
        """End of input: a reply whose stop came but whose usage did not is still whole."""
        if self._stopped and not self._done:
            self._done = True
            return [MessageStop()]
        return []


_EVENTS = frozenset(
    {
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    }
)


def _index(data: dict[str, Any]) -> int:
    value = data.get("contentBlockIndex", 0)
    return value if isinstance(value, int) else 0
