"""A catalogue scenario written once, as data, and the two runners that play it.

A `Scenario` is a provider's script (`rillet.transports.testing.Reply`s, or a function of the
request) and what the turn must give: request times, outcome, the events in the catalogue's
notation, the text. `play_in_memory` plays it against `httpx.MockTransport` in virtual time
(each `Reply` turned into the in-memory harness's `Answer` by `answer_of`) and checks it with
`handler_support.check`; `play_over_loopback` plays it to the fault-injecting provider on
127.0.0.1 and checks it with `fault_support.check_loop`. A test runs its table through both
(`RUNNERS`), each under its runner's clock (`runner_clock`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
import trio
import trio.testing
from rillet._core._policy import Outcome
from rillet.providers._ollama import OllamaDialect
from rillet.transports.testing import PING, RecordedRequest, Reply, Script

from .fault_support import LIMIT, check_loop, loop_turn
from .handler_support import HANG, Answer, Item, Raise, Sent, check, play, policy

__all__ = [
    "RUNNERS",
    "Scenario",
    "answer_of",
    "play_in_memory",
    "play_over_loopback",
    "runner_clock",
]


@attrs.frozen
class Scenario:
    """One catalogue scenario, with what either runner must see.

    Attributes:
        id: the catalogue id and a few words (the test id).
        script: what the provider answers (a function of the request may count what it
            answered: build the table anew for each run).
        at: when each request reaches the provider (virtual seconds): their count is the
            requests the turn costs.
        outcome: the turn's outcome.
        saw: the run events in the catalogue's notation (`expect`).
        text: the answer text a consumer rebuilds, exactly once.
        ended: when the result is ready, if the scenario pins it.
        pol: `Policy` fields over the tests' default.
        dialect: `openai` (Chat Completions) or `ollama`.
        error: the type of the turn's error, if the scenario names one.
    """

    id: str
    script: Script
    at: tuple[float, ...]
    outcome: Outcome
    saw: Sequence[str]
    text: str
    ended: float | None = None
    pol: dict[str, Any] = attrs.field(factory=dict)
    dialect: str = "openai"
    error: type[BaseException] | None = None

    def __str__(self) -> str:
        return self.id


def answer_of(reply: Reply) -> Answer:
    """A loopback `Reply` as the in-memory harness's `Answer`: the same status, headers, body
    chunks, pacing and faults (a stall is `HANG`, pings every `ping_every` s until the client
    leaves, a drop ends the body with the error httpx raises for it)."""
    body: list[Item] = []
    sent = 0
    for i, chunk in enumerate(reply.chunks):
        if reply.stall_after is not None and i >= reply.stall_after:
            break
        if reply.drop_after_bytes is not None:
            chunk = chunk[: max(reply.drop_after_bytes - sent, 0)]
            if not chunk:
                break
        if reply.chunk_delay:
            body.append(reply.chunk_delay)
        body.append(chunk)
        sent += len(chunk)
    if reply.drop_after_bytes is not None:
        # an orderly close before the body's end is an incomplete message; a reset, a read error
        body.append(Raise(httpx.ReadError if reply.drop_with_reset else httpx.RemoteProtocolError))
    elif reply.stall_after is not None:
        if reply.ping_every is not None:
            body += [reply.ping_every, PING] * int(LIMIT / reply.ping_every)
        body.append(HANG)
    return Answer(
        status=reply.status,
        body=body,
        headers=dict(reply.headers),
        content_type=reply.content_type or None,
        wait=reply.headers_delay,
        hang=reply.stall_headers,
    )


def _answers(script: Script) -> Sequence[Answer] | Callable[[Sent, int], Answer]:
    """The script as the in-memory provider's answers; a function of the request sees the
    request as the loopback provider records it (its body as compact JSON)."""
    if isinstance(script, Sequence):
        return [answer_of(reply) for reply in script]

    def answer(sent: Sent, n: int) -> Answer:
        body = json.dumps(sent.body, separators=(",", ":")).encode() if sent.body else b""
        path = httpx.URL(sent.url).raw_path.decode()
        request = RecordedRequest("POST", path, dict(sent.headers), body, sent.at, n)
        return answer_of(script(request, n))

    return answer


def _dialect(scenario: Scenario) -> OllamaDialect | None:
    return OllamaDialect() if scenario.dialect == "ollama" else None


async def play_in_memory(scenario: Scenario) -> None:
    """Play the scenario against `httpx.MockTransport` in virtual time and check it."""
    with trio.fail_after(LIMIT):
        run = await play(
            _answers(scenario.script), pol=policy(**scenario.pol), dialect=_dialect(scenario)
        )
    check(run, **_expected(scenario))
    _check_error(scenario, run.result.error)


async def play_over_loopback(scenario: Scenario) -> None:
    """Play the scenario to the loopback provider over real sockets and check it."""
    run = await loop_turn(scenario.script, pol=policy(**scenario.pol), dialect=_dialect(scenario))
    check_loop(run, **_expected(scenario))
    _check_error(scenario, run.result.error)


def _expected(scenario: Scenario) -> dict[str, Any]:
    """What either runner's check takes from the record."""
    return {
        "at": scenario.at,
        "outcome": scenario.outcome,
        "saw": scenario.saw,
        "text": scenario.text,
        "ended": scenario.ended,
    }


def _check_error(scenario: Scenario, error: BaseException | None) -> None:
    if scenario.error is not None:
        assert isinstance(error, scenario.error)


RUNNERS = {"memory": play_in_memory, "loopback": play_over_loopback}
"""Each runner of a scenario, by the name its test ids carry."""


def runner_clock(runner: str) -> trio.testing.MockClock:
    """The runner's virtual clock: autojump at once in memory; on loopback only after 20 ms of
    real idleness (bytes in flight are not silence)."""
    return trio.testing.MockClock(autojump_threshold=0.0 if runner == "memory" else 0.02)
