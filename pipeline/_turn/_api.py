"""The turn's entry points: `run_turn` and `open_turn` choose one provider's turn or a chain.

They sit above what they join (the single turn in `_turn`, the chain in `_chain`, which runs
single turns), so neither of those imports the other's caller.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypedDict

import trio

from .._core._deprecated import renamed
from .._core._dialect import Provider
from ._callbacks import FragmentSink, require_trio
from ._chain import run_chain
from ._handle import open_run
from ._options import RunOptions
from ._turn import Turn, TurnResult, run_one_turn

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from decimal import Decimal

    import httpx
    from typing_extensions import Unpack

    from .._core._cost import Prices
    from .._core._policy import Policy
    from .._core._request import TurnRequest
    from .._core._upstream import Upstream
    from ._admission import Admission
    from ._breakers import CircuitBreakers
    from ._graph import Sink
    from ._ratelimit import RateLimiter
    from ._telemetry import Telemetry

__all__ = ["TurnOptions", "open_turn", "run_turn"]


async def run_turn(
    request: TurnRequest,
    provider: Provider | Sequence[Provider],
    *,
    sinks: Sequence[Sink] = (),
    options: RunOptions | None = None,
    run_id: str | None = None,
    on_text: Callable[[str], object] | None = None,
    on_thinking: Callable[[str], object] | None = None,
    on_reset: Callable[[int], object] | None = None,
    policy: Policy | None = None,
    client: httpx.AsyncClient | None = None,
    upstream: Upstream | None = None,
    limiter: RateLimiter | None = None,
    admission: Admission | None = None,
    stream: bool = True,
    reasoning: bool = False,
    tool_arguments: bool = False,
    history: bool = True,
    breakers: CircuitBreakers | None = None,
    chain_on_permanent: bool = False,
    telemetry: Telemetry | None = None,
    prices: Prices | None = None,
    max_cost: Decimal | None = None,
    fallback_on_permanent: bool | None = None,
    task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
) -> TurnResult:
    """Run one turn to its end and return its result.

    Use `turn = await nursery.start(run_turn, request, provider)` to get the `Turn` handle as
    soon as its actors are running, then iterate `turn.uni_events()` / `turn.run_events()` or
    await `turn.result()`. `nursery.start` passes no keywords: bind them first,
    `nursery.start(functools.partial(run_turn, sinks=[...]), request, provider)`, or use
    `open_turn`, which takes them. Raises `RuntimeError` naming trio when awaited from asyncio.

    The simplest use needs no iterator: `on_text` is called with each fragment of the answer
    and `on_thinking` with each fragment of the reasoning, in order, each exactly once, on the
    turn's task (keep them quick). A retry after a stream broke mid-answer voids what came
    before: `on_reset(attempt)` is called first, and the fragments after it start the answer
    over (a display clears what it showed; a buffer empties). Without a retry it is never
    called.

    Args:
        request: the messages, tools and generation settings.
        provider: one provider, or an ordered list of them: a chain, one run id and one public
            stream whatever answers (`breakers` and `chain_on_permanent` then apply).
        sinks: where the run's events go as they come (`rillet.transports.sinks`, or your own).
        options: how the run reaches its providers, as one `RunOptions` (its fields are the
            keywords from `policy` on; give one or the other, not both).
        run_id: the run's id in its events; a random one when None.
        on_text: called with each fragment of the answer.
        on_thinking: called with each fragment of the reasoning.
        on_reset: called with the attempt number when a retry voids what came before.
        policy: see `RunOptions`; as are `client`, `upstream`, `limiter`, `admission`,
            `stream`, `reasoning`, `tool_arguments`, `history`, `breakers`,
            `chain_on_permanent`, `telemetry`, `prices` and `max_cost`.
        fallback_on_permanent: `chain_on_permanent`'s old name, taken for one release; warns.
        task_status: for `nursery.start`: the `Turn` handle once its actors run.
    """
    require_trio("run_turn")
    if fallback_on_permanent is not None:
        renamed("run_turn(fallback_on_permanent=...)", "run_turn(chain_on_permanent=...)")
        chain_on_permanent = fallback_on_permanent
    opts = RunOptions.merged(
        options,
        {
            "policy": policy,
            "client": client,
            "upstream": upstream,
            "limiter": limiter,
            "admission": admission,
            "stream": stream,
            "reasoning": reasoning,
            "tool_arguments": tool_arguments,
            "history": history,
            "breakers": breakers,
            "chain_on_permanent": chain_on_permanent,
            "telemetry": telemetry,
            "prices": prices,
            "max_cost": max_cost,
        },
    )
    if on_text is not None or on_thinking is not None or on_reset is not None:
        sinks = [*sinks, FragmentSink(on_text, on_thinking, on_reset)]
    if not isinstance(provider, Provider):
        return await run_chain(
            request,
            list(provider),
            sinks=sinks,
            run_id=run_id,
            options=opts,
            task_status=task_status,
        )
    return await run_one_turn(
        request, provider, sinks=sinks, run_id=run_id, options=opts, task_status=task_status
    )


class TurnOptions(TypedDict, total=False):
    """`run_turn`'s keyword options, as `open_turn` takes them (a type checker then knows
    every name and its type: a misspelt option is an error before anything runs)."""

    sinks: Sequence[Sink]
    options: RunOptions | None
    policy: Policy | None
    client: httpx.AsyncClient | None
    upstream: Upstream | None
    limiter: RateLimiter | None
    run_id: str | None
    reasoning: bool
    tool_arguments: bool
    history: bool
    admission: Admission | None
    stream: bool
    on_text: Callable[[str], object] | None
    on_thinking: Callable[[str], object] | None
    on_reset: Callable[[int], object] | None
    breakers: CircuitBreakers | None
    chain_on_permanent: bool
    telemetry: Telemetry | None
    prices: Prices | None
    max_cost: Decimal | None
    fallback_on_permanent: bool | None  # chain_on_permanent's old name, for one release


@asynccontextmanager
async def open_turn(
    request: TurnRequest, provider: Provider | Sequence[Provider], **options: Unpack[TurnOptions]
) -> AsyncIterator[Turn]:
    """Run a turn for the duration of the block; leaving the block cancels it if it is still
    running. Takes `run_turn`'s keyword options (`TurnOptions`)."""
    require_trio("open_turn")
    async with open_run(functools.partial(run_turn, request, provider, **options)) as turn:
        yield turn
