"""`RunOptions`: how a run reaches its providers and what its public stream shows, in one object.

`run_turn`, the chain it runs for a list of providers, and every step of `run_agent` take the
same options. Rather than restate a dozen keywords at each layer (and lose one on the way), the
entry points gather them into one frozen `RunOptions` and pass that on; a layer that must
change one (the chain keeps no history of its own steps, the agent lends every step its HTTP
client) passes on a copy made with `replace`. A host may build one `RunOptions` for many runs
and hand it over with `options=`, as httpx takes one `Timeout` or `Limits`.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import attrs
import httpx

from .._core._cost import Prices, as_money, as_prices
from .._core._policy import Policy
from .._core._upstream import Upstream
from ._admission import Admission
from ._breakers import CircuitBreakers
from ._ratelimit import RateLimiter
from ._telemetry import Telemetry

__all__ = ["RunOptions"]


@attrs.frozen(kw_only=True)
class RunOptions:
    """How a run (a turn, a chain, an agent's steps) reaches its providers and what its public
    stream shows. Every field has the default a bare `run_turn` uses.

    Args:
        policy: deadlines, retries and the rescue; `Policy()` when None.
        client: the httpx client the HTTP upstream sends over, still the caller's to close;
            when None (and no `upstream`) the run makes one and closes it at the end.
        upstream: what carries the requests (`rillet.transports.upstream`: HTTP, WebSocket,
            replay, or the application's own); when None, HTTP or WebSocket by the URL's scheme.
        limiter: the client-side rate limiter; the process's shared one when None.
        admission: the provider-stream slots a turn holds while it talks to its provider; the
            process's shared ones when None (waiting shows as `status` `queued`).
        stream: False sends non-streaming requests (the rescue's) instead of a stream,
            retried as a stream would be.
        reasoning: show reasoning text in the public stream.
        tool_arguments: show a tool call's arguments in the public stream.
        history: False keeps no replay history (`uni_events()` / `run_events()` then raise
            `NoHistoryError`; sinks still see everything): for servers running many turns
            whose events go out through sinks.
        breakers: a chain's circuit breakers; the process's shared ones when None.
        chain_on_permanent: hand a permanent request error (a 400, a bad key) to the chain's
            next provider too, instead of ending the chain with it.
        telemetry: where OpenTelemetry spans and metrics go (`rillet[otel]`); the process's
            global providers when None, and nothing at all when none is configured.
        prices: what the models cost (a `Price`, a mapping of them by model name, a
            `PriceTable`, `GenAIPrices`, or the host's own `Prices`): each reply's cost is then
            in its `usage` event and `TurnResult.cost()`.
        max_cost: the most the run may spend, in the prices' currency (needs `prices`): a
            request whose prompt alone would cost more is not sent, and each reply is capped
            at the tokens the rest buys; the run then ends `max_cost`. A limited run sends
            no hedged request (`Policy.hedge_after`): the provider may bill both.
    """

    policy: Policy | None = None
    client: httpx.AsyncClient | None = None
    upstream: Upstream | None = None
    limiter: RateLimiter | None = None
    admission: Admission | None = None
    stream: bool = True
    reasoning: bool = False
    tool_arguments: bool = False
    history: bool = True
    breakers: CircuitBreakers | None = None
    chain_on_permanent: bool = False
    telemetry: Telemetry | None = None
    prices: Prices | None = attrs.field(default=None, converter=as_prices)
    max_cost: Decimal | None = attrs.field(default=None, converter=as_money)

    def __attrs_post_init__(self) -> None:
        if self.max_cost is not None and self.prices is None:
            raise ValueError("max_cost needs prices: pass prices= too (a Price, or a table)")
        if self.max_cost is not None and self.max_cost < 0:
            raise ValueError("max_cost must not be negative")

    def replace(self, **changes: Any) -> RunOptions:
        """A copy with `changes` (field names as keywords)."""
        return attrs.evolve(self, **changes)

    @classmethod
    def merged(cls, options: RunOptions | None, keywords: dict[str, Any]) -> RunOptions:
        """`options` with the option `keywords` a caller passed beside it. A keyword left at
        its default changes nothing; one that differs from the default while `options` is
        given is a `TypeError` (two places would say the same thing, one of them unread)."""
        fields = attrs.fields_dict(cls)
        unknown = sorted(set(keywords) - set(fields))
        if unknown:
            raise TypeError(f"not run options: {', '.join(unknown)}")
        given = {k: v for k, v in keywords.items() if v is not fields[k].default}
        if options is None:
            return cls(**given)
        if given:
            raise TypeError(
                "pass the run's options either as options=RunOptions(...) or as keywords, not "
                f"both: {', '.join(sorted(given))} given beside options="
            )
        return options


DEFAULT_OPTIONS = RunOptions()
