"""A turn's cost in money: its usage by kind, and the prices a host gives.

**Usage by kind.** What a provider bills differs by kind: an uncached prompt token, one read
from its prompt cache (a tenth of the price, or less), one written to it (Anthropic bills a
quarter more), a generated one (reasoning included). MMSP's usage keeps four counts, with cache
writes folded into the prompt; `TokenUsage` keeps all five apart, the way the OpenTelemetry
GenAI conventions and the price tables count them: `input` is every prompt token, cached or
not, and the cache counts are shares of it.

**Prices.** rillet ships none of its own: they change, and differ by account, region and
contract. A host gives one `Price` per model, a `PriceTable` of them by model name, or a
`GenAIPrices`, which looks them up in the `genai-prices` package's table (`rillet[prices]`,
tiered prices included). Whatever gives them is a `Prices`: asked for a usage's cost under a
model's name, it answers in money, or None when it has no price for that model. Arithmetic is
exact (`Decimal`), so a bill is never off by a rounding step.

**A cost limit.** `spend_cap` turns a run's remaining money (`RunOptions.max_cost`) into a
limit on the next request: it refuses a request whose prompt alone would cost more (nothing is
sent: `CostLimitExceeded`), and otherwise caps the reply's tokens at what the rest buys. The
prompt's tokens are estimated (the request's characters over four, never fewer than its
words), so a run can overspend by that estimate's error on its last request, never by a reply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs
import msgspec

from ._budget import ContextBudget, least_tokens
from ._errors import ConfigurationError, CostLimitExceeded

if TYPE_CHECKING:
    from ._events import UsageMetadata
    from ._request import TurnRequest

__all__ = [
    "GenAIPrices",
    "Price",
    "PriceTable",
    "Prices",
    "TokenUsage",
    "as_money",
    "as_prices",
    "load_prices",
    "spend_cap",
    "usage_cost",
]

_MILLION = Decimal(1_000_000)


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A reply's tokens by the kinds a provider bills apart (None: not reported).

    Attributes:
        input: every prompt token, read from the cache or written to it included.
        cache_read: of `input`, the tokens read from the provider's prompt cache.
        cache_write: of `input`, the tokens written to it.
        output: every generated token, reasoning included.
        reasoning: of `output`, the reasoning (thinking) tokens.
    """

    input: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    output: int | None = None
    reasoning: int | None = None

    @classmethod
    def of(cls, usage: UsageMetadata, cache_write: int | None = None) -> TokenUsage:
        """MMSP's counts (the prompt without cache reads, the response without thinking) and
        the provider's cache writes (a share of MMSP's prompt, so never more than it), by
        kind. A count no one reported stays None; a negative one (a provider's arithmetic)
        counts as none."""
        prompt, read = _count(usage.prompt_tokens), _count(usage.cached_tokens)
        response, thoughts = _count(usage.response_tokens), _count(usage.thoughts_tokens)
        generated = (
            None if response is None and thoughts is None else (response or 0) + (thoughts or 0)
        )
        return cls(
            input=None if prompt is None and read is None else (prompt or 0) + (read or 0),
            cache_read=read,
            cache_write=None if cache_write is None else min(max(cache_write, 0), prompt or 0),
            output=generated,
            reasoning=thoughts,
        )


def _count(value: int | None) -> int | None:
    return None if value is None else max(value, 0)


def _money(value: Decimal | int | str) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))


@attrs.frozen(kw_only=True)
class Price:
    """One model's prices, each per million tokens, in the host's currency.

    Args:
        input: an uncached prompt token.
        output: a generated token; thinking tokens are billed as output.
        cached_input: a prompt token read from the provider's cache; defaults to `input`.
        cache_write: a prompt token written to the cache (Anthropic bills these above
            `input`); defaults to `input`.
    """

    input: Decimal = attrs.field(converter=_money)
    output: Decimal = attrs.field(converter=_money)
    cached_input: Decimal | None = attrs.field(
        default=None, converter=attrs.converters.optional(_money)
    )
    cache_write: Decimal | None = attrs.field(
        default=None, converter=attrs.converters.optional(_money)
    )

    def charge(self, usage: TokenUsage) -> Decimal:
        """What `usage` costs at these prices, exactly: each kind at its own price (cache reads
        at `cached_input`, writes at `cache_write`, the rest of the prompt at `input`,
        reasoning as output). A count not reported costs nothing.

        Args:
            usage: the tokens by kind.
        """
        read = usage.cache_read or 0
        uncached = max((usage.input or 0) - read, 0)
        written = min(usage.cache_write or 0, uncached)  # never more than the prompt holds
        plain = uncached - written
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        total = (
            plain * self.input
            + read * cached_price
            + written * write_price
            + (usage.output or 0) * self.output
        )
        return total / _MILLION

    def cost(self, usage: TokenUsage, model: str, *, url: str = "") -> Decimal:
        """`charge`, as a `Prices` answers: one price for whatever model answered."""
        del model, url
        return self.charge(usage)


@runtime_checkable
class Prices(Protocol):
    """What gives a run its prices: a `Price`, a `PriceTable`, a `GenAIPrices`, or the host's
    own (its contract's rates, say)."""

    def cost(self, usage: TokenUsage, model: str, *, url: str = "") -> Decimal | None:
        """What `usage` cost on `model` (served from `url`, the provider's base URL, when a
        table prices by where), or None when there is no price for that model."""
        ...


def _frozen_table(prices: Mapping[str, Price]) -> Mapping[str, Price]:
    return dict(prices)


@attrs.frozen
class PriceTable:
    """Each model's `Price`, by the model's name as the run asks for it (or as the provider
    names the one that answered, a dated version often).

    Args:
        prices: the prices by model name.
    """

    prices: Mapping[str, Price] = attrs.field(converter=_frozen_table)

    def cost(self, usage: TokenUsage, model: str, *, url: str = "") -> Decimal | None:
        """`usage` at `model`'s price; None when the table has none for it."""
        del url
        price = self.prices.get(model)
        return None if price is None else price.charge(usage)


@attrs.frozen
class GenAIPrices:
    """Prices from the `genai-prices` package's table (`pip install 'rillet[prices]'`): many
    providers' models, cache reads and writes and tiers (a long prompt's higher rate) included,
    in US dollars. The provider is found by its base URL, else by the model's name. It holds
    nothing but the package's name, so it pickles (to a server's workers)."""

    def __attrs_post_init__(self) -> None:
        try:
            import genai_prices  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "prices",
                None,
                "GenAIPrices needs the genai-prices package: pip install 'rillet[prices]'",
            ) from None

    def cost(self, usage: TokenUsage, model: str, *, url: str = "") -> Decimal | None:
        """`usage` at the table's price for `model`; None when the table has no such model."""
        import genai_prices as table

        counted = table.Usage(
            input_tokens=usage.input or 0,
            cache_read_tokens=usage.cache_read or 0,
            cache_write_tokens=usage.cache_write or 0,
            output_tokens=usage.output or 0,
        )
        if url:
            try:
                return Decimal(table.calc_price(counted, model, provider_api_url=url).total_price)
            except LookupError:
                pass  # not a provider the table knows by its URL (a gateway, a loopback)
        try:
            return Decimal(table.calc_price(counted, model).total_price)
        except LookupError:
            return None


def load_prices(spec: str) -> Prices:
    """The prices a command line names: `genai` for the `genai-prices` table, else a JSON
    file of each model's prices per million tokens,
    `{"gpt-4o": {"input": "2.50", "output": "10", "cached_input": "1.25"}, ...}`
    (`cache_write` too; strings or numbers).

    Raises:
        ConfigurationError: the file cannot be read, or a price in it is not one.
    """
    if spec == "genai":
        return GenAIPrices()
    try:
        with open(spec, "rb") as file:
            table = msgspec.json.decode(file.read(), type=dict[str, dict[str, str | float]])
        return PriceTable(
            {
                model: Price(**{k: str(v) for k, v in fields.items()})
                for model, fields in table.items()
            }
        )
    except (OSError, msgspec.DecodeError, TypeError, ArithmeticError, ValueError) as exc:
        raise ConfigurationError(
            "prices",
            None,
            f"cannot read prices from {spec!r} ({exc}): give `genai` or a JSON file of each "
            'model\'s prices per million tokens, {"gpt-4o": {"input": "2.50", "output": "10"}}',
        ) from None


def as_money(value: Decimal | float | str | None) -> Decimal | None:
    """An amount as an exact decimal (a float by its shortest spelling: 0.1 is 0.1)."""
    if value is None or isinstance(value, Decimal):
        return value
    return Decimal(str(value))


def as_prices(prices: Prices | Price | Mapping[str, Price] | None) -> Prices | None:
    """What a host may pass as prices (a `Price`, a mapping of them by model name, or a
    `Prices`), as a `Prices`."""
    if prices is None or isinstance(prices, Price | Prices):
        return prices
    return PriceTable(prices)  # a mapping of prices by model name


def price_of(
    prices: Prices, usage: TokenUsage, models: tuple[str, ...], url: str = ""
) -> Decimal | None:
    """`usage` at the first of `models` (the one asked for, then the one that answered) that
    `prices` has a price for; None when it has none."""
    for model in models:
        if model:
            cost = prices.cost(usage, model, url=url)
            if cost is not None:
                return cost
    return None


def spend_cap(
    request: TurnRequest, prices: Prices, model: str, remaining: Decimal, *, url: str = ""
) -> int | None:
    """The most reply tokens `remaining` money buys for `request` on `model`, after its prompt
    (never more than the request's own `max_tokens`); None when replies are free.

    Raises:
        CostLimitExceeded: the prompt alone would cost more than `remaining` (or the rest
            buys not one reply token): the request is not to be sent.
        ConfigurationError: `prices` has no price for `model`, so no limit can be kept.
    """
    prompt = max(ContextBudget(context_window=1).estimate(request), least_tokens(request))
    prompt_cost = prices.cost(TokenUsage(input=prompt), model, url=url)
    per_million = prices.cost(TokenUsage(output=1_000_000), model, url=url)
    if prompt_cost is None or per_million is None:
        raise ConfigurationError(
            "prices", None, f"max_cost needs a price for the model {model!r}, and there is none"
        )
    left = remaining - prompt_cost
    if left <= 0:
        raise CostLimitExceeded(remaining, prompt_cost)
    if per_million <= 0:
        return None  # a free reply: no cap of ours
    tokens = math.floor(left * _MILLION / per_million)
    if tokens < 1:
        raise CostLimitExceeded(remaining, prompt_cost)
    return tokens if request.max_tokens is None else min(tokens, request.max_tokens)


def usage_cost(usage: UsageMetadata, price: Price, *, cache_write_tokens: int = 0) -> Decimal:
    """What a turn's usage costs at `price`, exactly.

    MMSP's usage counts cached reads apart from the prompt (`prompt_tokens` excludes them), so
    each token is priced once: uncached prompt tokens at `input`, cached reads at
    `cached_input`, and the share of the prompt written to the cache at `cache_write`. A count
    the provider did not report costs nothing. Never negative.

    Args:
        usage: the turn's usage, MMSP's way.
        price: the model's prices per million tokens.
        cache_write_tokens: how many of `usage.prompt_tokens` were written to the cache
            (Anthropic's `cache_creation_input_tokens`); they are billed at `cache_write`
            instead of `input`, never at both.
    """
    return price.charge(TokenUsage.of(usage, cache_write_tokens))
