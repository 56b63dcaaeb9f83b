"""What every handler of the server shares: its configuration, the hub, the upstream client,
the nursery runs live in, the counters and the admission; and the checks they all make (the
server key, a JSON body, the model asked for, a place in the admission)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import msgspec
import trio
from rillet._core._dialect import Provider
from rillet._hub._hub import RunHub
from rillet._turn._admission import Admission

from ._capacity import ClientId, StreamAdmission, Ticket, client_of
from ._config import ServerConfig
from ._metrics import Metrics
from ._replies import ErrorReply

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Limits
    from ._control import Control  # noqa: TC004 - it needs coredis, an extra
    from ._http11 import HttpConnection, Request

__all__ = ["Shared", "decode_problem"]

logger = logging.getLogger("rillet.transports.server")

# a value msgspec quotes (its repr): an enum's or a tag's that the body gave
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_MAX_QUOTED = 60


def decode_problem(exc: Exception) -> str:
    """What the decoder said of a body it refused, each value it quotes from the body (an enum
    value, a tag) cut to at most 60 characters: a refusal never repeats a large part of the
    request."""

    def cut(quoted: re.Match[str]) -> str:
        text = quoted[0]
        return text if len(text) <= _MAX_QUOTED else f"{text[: _MAX_QUOTED - 4]}...{text[0]}"

    return _QUOTED.sub(cut, str(exc))


@attrs.define(eq=False)
class Shared:
    """The server's state and checks, handed to each group of handlers."""

    config: ServerConfig
    hub: RunHub
    client: httpx.AsyncClient
    nursery: trio.Nursery
    metrics: Metrics = attrs.field(factory=Metrics)
    admission: StreamAdmission = attrs.field()
    # the turns' own slots, as many as the server admits: a turn it admitted never queues again
    streams: Admission = attrs.field()
    # the control channel to other servers' runs (with a Redis hub only)
    control: Control | None = None

    @admission.default
    def _admission(self) -> StreamAdmission:
        return StreamAdmission.of(self.config.limits)

    @streams.default
    def _streams(self) -> Admission:
        return Admission(self.config.limits.max_streams)

    @property
    def limits(self) -> Limits:
        """The configured limits."""
        return self.config.limits

    def has_key(self, request: Request) -> bool:
        """Whether the request sends the server key (`Authorization: Bearer`, or `x-api-key`
        as Anthropic's clients send it), compared in constant time; False when the server has
        none."""
        key = self.config.api_key
        if key is None:
            return False
        sent = request.bearer() or request.headers.get("x-api-key") or ""
        # digests of equal length: the comparison tells nothing, not even the key's length
        given = hashlib.sha256(sent.encode()).digest()
        return hmac.compare_digest(given, hashlib.sha256(key.reveal().encode()).digest())

    def client_id(self, request: Request) -> ClientId:
        """Who the request comes from, for its shares (`client_of`): its address, and the
        server key when it sent it."""
        return client_of(request, keyed=self.has_key(request))

    def require_key(self, request: Request, *, mmsp: bool = False) -> None:
        """401 without the server key, when one is configured (compared in constant time)."""
        if self.config.api_key is None:
            return
        if not self.has_key(request):
            kind = "AuthenticationError" if mmsp else "unauthorized"
            raise ErrorReply(
                401,
                kind,
                "missing or wrong server key (Authorization: Bearer <key>)",
                headers=[("www-authenticate", "Bearer")],
            )

    async def read_json(
        self, http: HttpConnection, request: Request, decode: Callable[[bytes], Any], kind: str
    ) -> Any:
        """The request's JSON body decoded by `decode`: 415 for another type, 413 past
        `max_body`, 400 for what does not decode (errors of type `kind`)."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            # a browser may send other types cross-site without asking first: refuse them
            raise ErrorReply(415, kind, "the body must be application/json")
        body = await http.read_body(request, self.limits.max_body, self.limits.head_timeout)
        try:
            return decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise ErrorReply(400, kind, f"invalid request body: {decode_problem(exc)}") from None
        except RecursionError:  # nested deeper than the decoder follows: refused, not a crash
            raise ErrorReply(400, kind, "invalid request body: nested too deeply") from None

    def offered_models(self) -> tuple[str, ...]:
        """The models served: the configured list, else the provider's own model."""
        configured = self.config.provider
        if not self.config.models and isinstance(configured, Provider):
            return (configured.model,)
        return self.config.models

    def provider(self, model: str | None, *, mmsp: bool) -> Provider:
        """The provider for `model` (None: the first offered); 404 for a model not offered."""
        configured = self.config.provider
        models = self.offered_models()
        if model is None:
            if not models:
                raise ErrorReply(
                    400, "InvalidRequestError" if mmsp else "invalid_request", "no model"
                )
            model = models[0]
        if models and model not in models:
            raise ErrorReply(404, "NotFoundError" if mmsp else "unknown_model", "unknown model")
        if isinstance(configured, Provider):
            if configured.model == model:
                return configured
            return attrs.evolve(configured, model=model)
        try:
            return configured(model)
        except Exception as exc:
            logger.warning("no provider for a model: %s", type(exc).__name__)
            raise ErrorReply(
                400, "InvalidRequestError" if mmsp else "invalid_request", "model unavailable"
            ) from None

    def reserve(self, request: Request, *, mmsp: bool) -> Ticket:
        """A place in the admission for this request's client; 429 with `Retry-After` when the
        server's capacity or the client's share is taken."""
        ticket = self.admission.reserve(self.client_id(request))
        if ticket is None:
            raise ErrorReply(
                429,
                "RateLimitError" if mmsp else "too_many_runs",
                "too many runs at once; retry shortly",
                headers=[("retry-after", "1")],
            )
        return ticket
