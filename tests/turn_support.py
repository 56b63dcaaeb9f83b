"""What the Turn API's tests share."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
from rillet._turn._api import open_turn
from rillet._turn._ratelimit import RateLimiter

from .handler_support import (
    OK,
    REQUEST,
    Answer,
    FakeProvider,
    policy,
    provider_for,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._core._runevents import (
        RunEvent,
    )
    from rillet._turn._turn import Turn, UniItem

DONE = OK[-1]


def client_for(fake: FakeProvider) -> httpx.AsyncClient:
    """An httpx client whose every request goes to the scripted provider."""
    return httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))


def options(client: httpx.AsyncClient, **more: Any) -> dict[str, Any]:
    """`run_turn`'s keyword options for a test: the client, the test policy, a fresh limiter."""
    return {"client": client, "policy": policy(), "limiter": RateLimiter(), **more}


@asynccontextmanager
async def opened(fake: FakeProvider, **more: Any) -> AsyncIterator[Turn]:
    """`open_turn` against the scripted provider, with the test options and `more`."""
    async with (
        client_for(fake) as client,
        open_turn(REQUEST, provider_for(), **options(client, **more)) as turn,
    ):
        yield turn


async def read_all(turn: Turn) -> list[RunEvent]:
    """Every run event, from the start to `run.done`."""
    return [event async for event in turn.run_events()]


async def read_uni(turn: Turn) -> list[UniItem]:
    """Every MMSP item, from the start to the end."""
    return [item async for item in turn.uni_events()]


def paced(answer: Answer, seconds: float = 1.0) -> Answer:
    """The same body with `seconds` between chunks."""
    body: list[Any] = []
    for item in answer.body:
        body += [seconds, item]
    return attrs.evolve(answer, body=body)
