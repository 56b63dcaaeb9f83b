"""A turn's cost in money, from its usage and a price the host gives.

rillet ships no prices: they change, and differ by account, region and contract, so the host
passes its own `Price` per model. Arithmetic is exact (`Decimal`), so a bill is never off by a
rounding step.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ._events import UsageMetadata

_MILLION = Decimal(1_000_000)


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
    prompt = max(usage.prompt_tokens or 0, 0)
    written = min(max(cache_write_tokens, 0), prompt)
    read = max(usage.cached_tokens or 0, 0)
    out = max(usage.response_tokens or 0, 0) + max(usage.thoughts_tokens or 0, 0)
    cached_price = price.input if price.cached_input is None else price.cached_input
    write_price = price.input if price.cache_write is None else price.cache_write
    total = (
        (prompt - written) * price.input
        + written * write_price
        + read * cached_price
        + out * price.output
    )
    return total / _MILLION
