"""Control of runs across servers: a cancel or an approval answer that reaches a server which
does not drive the run (another worker, another server sharing the Redis) is handed to the one
that does, over Redis pub/sub, and its answer comes back as the response.

Every server sharing a Redis subscribes to `rillet:control` (requests) and to
`rillet:control:<name>` (answers to its own requests). A request is JSON: `id`, `reply` (the
asking server's name), `op` (`cancel` or `answer`), `run_id`, and for an answer `approval_id`,
`approve` and `reason`. Only the server that drives the run answers (with the status and body it
would have given the client itself); the others ignore it. The asker has checked the run's
token before asking; what travels is what the client was allowed to do. No answer within
`timeout` seconds (the run's server is gone, or Redis is) is said plainly to the client: 409
`elsewhere`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import coredis
import msgspec
import trio
from coredis.exceptions import RedisError

__all__ = ["CHANNEL", "Control"]

logger = logging.getLogger("rillet.transports.server")

CHANNEL = "rillet:control"
_FAILURES = (RedisError, OSError, TimeoutError)


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class _Answer(msgspec.Struct, frozen=True):
    id: str
    status: int
    body: str


@attrs.define(eq=False)
class Control:
    """This server's end of the control channel.

    Attributes:
        url: the Redis URL the runs are shared through.
        handle: what this server does with a request (None: not its run, no answer).
        name: this server's name on the channel (random).
        timeout: seconds a request waits for the run's server to answer.
    """

    url: str
    handle: Callable[[dict[str, Any]], Awaitable[tuple[int, bytes] | None]]
    name: str = attrs.field(factory=lambda: secrets.token_hex(8))
    timeout: float = 2.0
    _client: coredis.Redis[bytes] | None = None
    _waiting: dict[str, tuple[trio.Event, list[_Answer]]] = attrs.field(factory=dict)

    @property
    def _replies(self) -> str:
        return f"{CHANNEL}:{self.name}"

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe, then answer requests for this server's runs until cancelled. Started
        once subscribed; a failure later (Redis gone) is logged and the subscription opened
        again a second later, never raised into the server."""
        started = False
        while True:
            try:
                client: coredis.Redis[bytes] = coredis.Redis.from_url(self.url, connect_timeout=5.0)
                async with (
                    client,
                    client.pubsub(
                        channels=[CHANNEL, self._replies], ignore_subscribe_messages=True
                    ) as ps,
                    trio.open_nursery() as nursery,
                ):
                    self._client = client
                    if not started:
                        started = True
                        task_status.started()
                    async for message in ps:
                        self._dispatch(message, nursery)
            except Exception as exc:  # the server runs on without it
                if not started:
                    raise
                logger.warning(
                    "the control channel failed (%s): cancels and answers for other servers' "
                    "runs wait until it is back",
                    _describe(exc),
                )
            except BaseExceptionGroup as group:  # cancelled: the client's closing may add its
                cancelled, _ = group.split(trio.Cancelled)  # own error (a closed stream)
                if cancelled is None:
                    raise
                raise cancelled from None
            await trio.sleep(1.0)

    def _dispatch(self, message: Any, nursery: trio.Nursery) -> None:
        if message.get("type") != "message":
            return
        channel = message.get("channel")
        data = message.get("data")
        if not isinstance(data, bytes):
            return
        if channel in (CHANNEL, CHANNEL.encode()):
            nursery.start_soon(self._serve, data)
        else:
            self._answered(data)

    async def _serve(self, data: bytes) -> None:
        """One request: answered if the run is this server's."""
        try:
            request = msgspec.json.decode(data)
            if not isinstance(request, dict) or request.get("reply") == self.name:
                return
            reply = str(request["reply"])
            answer = await self.handle(request)
        except (msgspec.DecodeError, KeyError):
            logger.warning("a control request that is not one was ignored")
            return
        if answer is None:
            return
        status, body = answer
        encoded = msgspec.json.encode(_Answer(str(request.get("id", "")), status, body.decode()))
        try:
            assert self._client is not None
            await self._client.publish(f"{CHANNEL}:{reply}", encoded)
        except _FAILURES as exc:
            logger.warning("a control answer was not sent: %s", type(exc).__name__)

    def _answered(self, data: bytes) -> None:
        try:
            answer = msgspec.json.decode(data, type=_Answer)
        except msgspec.DecodeError:
            return
        waiting = self._waiting.get(answer.id)
        if waiting is not None:
            waiting[1].append(answer)
            waiting[0].set()

    async def ask(self, request: dict[str, Any]) -> tuple[int, bytes] | None:
        """Hand `request` to the run's server: its status and body, or None when no server
        answered within `timeout` (or Redis could not be reached)."""
        request_id = secrets.token_hex(8)
        arrived = trio.Event()
        answers: list[_Answer] = []
        self._waiting[request_id] = (arrived, answers)
        try:
            with trio.move_on_after(self.timeout):
                assert self._client is not None
                message = {**request, "id": request_id, "reply": self.name}
                await self._client.publish(CHANNEL, msgspec.json.encode(message))
                await arrived.wait()
        except Exception as exc:  # Redis gone, or the channel being opened again: no answer
            logger.warning("a control request was not sent: %s", _describe(exc))
        finally:
            del self._waiting[request_id]
        if not answers:
            return None
        return answers[0].status, answers[0].body.encode()
