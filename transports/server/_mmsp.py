"""MMSP's server wire: `POST /v1/stream` (a turn's UniEvents as SSE `data:` lines ended by
`data: [DONE]`, errors as `{"error": {"type", "message", ...}}`) and `GET /v1/models`."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
from rillet._core._encode import SSE_DONE, sse_data
from rillet._core._errors import (
    CostLimitExceeded,
    FrameError,
    InvalidRequestError,
    ProviderError,
    RescueFailed,
    StreamError,
    TransportError,
    TurnTimeout,
)
from rillet._core._events import UniEvent, UniMessage, encode_json
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome
from rillet._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest

from ._replies import ErrorReply, to_json
from ._shared import Shared
from ._streamed import HeldHead
from ._wireturn import ChannelSink, DirectDeltas, run_wire_turn

if TYPE_CHECKING:
    from rillet._core._dialect import Provider
    from rillet._turn._turn import Turn, TurnResult

    from ._http11 import HttpConnection, Request

__all__ = ["Mmsp", "mmsp_error"]


class _UniConfig(msgspec.Struct, frozen=True, kw_only=True):
    """MMSP's UniConfig (the keys rillet acts on; `thinking_summary` and `prompt_caching` are
    accepted and left to the provider's defaults)."""

    max_tokens: int | None = None
    temperature: float | None = None
    tools: list[ToolSpec] | None = None
    thinking_summary: bool | None = None
    thinking_level: ThinkingLevel | None = None
    tool_choice: ToolChoice | None = None
    system_prompt: str | None = None
    prompt_caching: Any = None


class _StreamBody(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/stream`: MMSP's request."""

    model: str
    messages: list[UniMessage]
    config: _UniConfig = _UniConfig()


_decode_stream_body = msgspec.json.Decoder(_StreamBody).decode


def _stream_request(body: _StreamBody) -> TurnRequest:
    if not body.messages:
        raise ValueError("`messages` is empty")
    config = body.config
    return TurnRequest(
        messages=body.messages,
        system_prompt=config.system_prompt or None,
        tools=config.tools or [],
        tool_choice=config.tool_choice,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        thinking_level=config.thinking_level,
    )


@attrs.define(eq=False)
class Mmsp:
    """The MMSP routes."""

    shared: Shared

    async def models(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /v1/models`: the models offered, in OpenAI's shape."""
        self.shared.require_key(request, mmsp=True)
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "rillet"}
            for model in self.shared.offered_models()
        ]
        body = msgspec.json.encode({"object": "list", "data": data})
        await http.respond(200, body, head_only=request.method == "HEAD")

    async def model(self, http: HttpConnection, request: Request, model: str) -> None:
        """`GET /v1/models/{id}`: one offered model in OpenAI's shape, else OpenAI's 404
        `model_not_found` (what the SDK's `models.retrieve` reads)."""
        self.shared.require_key(request, mmsp=True)
        if model not in self.shared.offered_models():
            raise ErrorReply(
                404,
                "invalid_request_error",
                "the model does not exist or is not served here",
                param="model",
                code="model_not_found",
            )
        body = msgspec.json.encode(
            {"id": model, "object": "model", "created": 0, "owned_by": "rillet"}
        )
        await http.respond(200, body, head_only=request.method == "HEAD")

    async def stream(self, http: HttpConnection, request: Request, _: str) -> None:
        """`POST /v1/stream`: a turn streamed as MMSP's server does, once admitted."""
        self.shared.require_key(request, mmsp=True)
        body: _StreamBody = await self.shared.read_json(
            http, request, _decode_stream_body, "InvalidRequestError"
        )
        try:
            turn_request = _stream_request(body)
        except ValueError as exc:
            raise ErrorReply(400, "InvalidRequestError", str(exc)) from None
        provider = self.shared.provider(body.model, mmsp=True)
        ticket = self.shared.reserve(request, mmsp=True)
        pump = functools.partial(self._pump_mmsp, http, provider)
        await run_wire_turn(self.shared, http, ticket, turn_request, provider, pump, route="stream")

    async def _pump_mmsp(
        self,
        http: HttpConnection,
        provider: Provider,
        turn: Turn,
        sink: ChannelSink,
    ) -> None:
        """Stream the turn's UniEvents as MMSP does. The head waits for the first event (or the
        turn's end) up to one heartbeat, so a request refused upstream gets an HTTP error
        status; after that, errors are one `{"error"}` event and `[DONE]`.

        A retry that voids events the client already has cannot be said in MMSP's grammar: the
        stream then ends with `IncompleteStreamError` (what the client would have seen from the
        failed attempt itself), and the client's own retry takes over. A reset before anything
        was written just drops the voided events. Once the head is out, the turn writes plain
        deltas itself (`DirectDeltas`)."""
        head = HeldHead(http, self.shared.limits.heartbeat)
        sink.direct = DirectDeltas(head, _frame, self.shared.metrics.count)
        while (items := await head.receive(sink.receive)) is not None:
            if type(items) is bytes:  # encoded by the turn, which could not write them
                await head.send(items)
                sink.done()
                continue
            frames: list[bytes] = []
            stopped = reset = False
            for item in items:
                if type(item) is AttemptReset:
                    self.shared.metrics.reset()
                    if head.wrote:
                        reset = True
                        break
                    frames.clear()
                    continue
                assert isinstance(item, UniEvent)
                frames.append(_frame(item))
                stopped = item.event_type == "stop"
            if frames:
                self.shared.metrics.count(len(frames))
                await head.send(b"".join(frames))
            if not (reset or stopped):  # the end stays owed: nothing may be written after it
                sink.done()
            if reset:
                error = {
                    "type": "IncompleteStreamError",
                    "message": "the upstream attempt failed mid-stream; retry the request",
                    "missing": ["usage_metadata", "finish_reason"],
                    "finish_reason": None,
                    "usage_metadata": None,
                }
                await http.send_data(sse_data(to_json({"error": error})) + SSE_DONE)
                turn.cancel()
                return
            if stopped:
                await http.send_data(SSE_DONE)
                return
        result = await turn.result()
        if result.ok:  # a rescued reply without a stop cannot happen; end the stream anyway
            await head.start()
            await http.send_data(SSE_DONE)
            return
        error, status, headers = mmsp_error(result, provider)
        if not head.started:
            await http.respond(status, to_json({"error": error}), headers)
            return
        await http.send_data(sse_data(to_json({"error": error})) + SSE_DONE)


def mmsp_error(
    result: TurnResult, provider: Provider
) -> tuple[dict[str, Any], int, list[tuple[str, str]]]:
    """The MMSP error object for a failed turn (its `type` MMSP's error name, and `code` the
    run's safe code), the HTTP status for it, and extra headers.

    Messages are our own words; a provider's own message is passed on only for an invalid
    request (it says what was invalid), with the provider's key scrubbed from it. Every failure
    but a cancel says `x-should-retry: false` (the OpenAI and Anthropic SDKs read it): the turn
    already ran the ladder its failure deserved, and a client retrying on top would pay again,
    times its own retries, for what the server found hopeless (`Retry-After` still says when
    asking again may help).
    """
    body, status, headers = _mmsp_error(result, provider)
    body["code"] = result.code  # the run's safe code beside MMSP's own type (docs/codes.md)
    return body, status, headers


def _mmsp_error(
    result: TurnResult, provider: Provider
) -> tuple[dict[str, Any], int, list[tuple[str, str]]]:
    error = result.error
    if isinstance(error, RescueFailed):
        error = error.stream_error or error.rescue_error
    if result.outcome is Outcome.CANCELLED:
        return {"type": "Cancelled", "message": "the turn was cancelled"}, 503, []
    headers: list[tuple[str, str]] = [("x-should-retry", "false")]
    if isinstance(error, ProviderError):
        message = f"the upstream provider {error.provider} reported an error"
        if error.status is not None:
            message += f" (status {error.status})"
        if isinstance(error, InvalidRequestError) and error.provider_message:
            message += f": {_scrub(error.provider_message, provider)}"
        body: dict[str, Any] = {"type": type(error).__name__, "message": message}
        if error.status is not None:
            body["status"] = error.status
        status = error.status if error.status is not None and 400 <= error.status <= 599 else 502
        wait = result.retry_after if result.retry_after is not None else error.retry_after
        if wait is not None:
            body["retry_after"] = wait
            headers.append(("retry-after", str(max(1, math.ceil(wait)))))
        return body, status, headers
    if isinstance(error, StreamError):
        body = {"type": type(error).__name__, "message": str(error)}
        for name in (
            "missing",
            "finish_reason",
            "usage_metadata",
            "tool_name",
            "tool_call_id",
            "raw_arguments_length",
            "raw_arguments_preview",
        ):
            if hasattr(error, name):
                value = getattr(error, name)
                body[name] = list(value) if isinstance(value, tuple) else value
        return msgspec.to_builtins(body), 502, headers
    if isinstance(error, TurnTimeout):
        return {"type": "TurnTimeout", "message": str(error)}, 504, headers
    if isinstance(error, CostLimitExceeded):  # the run's money, not the provider's: nothing sent
        return {"type": "CostLimitExceeded", "message": str(error)}, 402, headers
    if isinstance(error, TransportError | FrameError):
        return {"type": type(error).__name__, "message": str(error)}, 502, headers
    return {"type": "UpstreamError", "message": "the turn failed"}, 502, headers


def _scrub(text: str, provider: Provider) -> str:
    key = provider.api_key.reveal() if provider.api_key is not None else ""
    return text.replace(key, "…") if len(key) >= 4 else text


def _frame(event: UniEvent) -> bytes:
    """An event as MMSP's stream carries it."""
    return sse_data(encode_json(event))
