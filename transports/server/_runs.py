"""The runs API: starting a run (`POST /v1/runs`), which then goes on in the server's nursery
whoever watches; cancelling it; who may read it (its read token) and who may act on it (its act
token, or the server key); following it from a cursor, counted against the subscriber limits;
and forgetting it after the hub has.

Reading and acting are different rights. The read token is in the events URL, which lands in
browser history, proxy logs and `Referer`s: it reads the run and nothing else. Cancelling and
answering approvals take the act token, which only the response that started the run carries,
as `Authorization: Bearer` (never from a query), or the server key; a read token there gets the
same 404 as an unknown run.

Agent runs (`AgentRuns`): a run started on a server configured with a tool set (`tools`) runs
the agent loop with those tools, its events in the same run log as a turn's; its
approvals are answered over HTTP (`POST /v1/runs/{id}/approvals/{approval_id}`, with the run's
act token), and one no one answers within `approval_timeout` is denied, so a run never waits
for ever holding its provider-stream slot.

Taking over (`takeover`, with a hub shared through Redis): a turn run is opened with its spec
(the model and the request, `_Spec`), which the hub keeps while the run is open. When the
server producing it is gone (its lease ran out), another server's hub claims the run and hands
it here: the run starts again from its spec on this server, its events following the log's
last with the next seq: a `status` (`taken_over`), an `attempt.reset` voiding what the lost
server streamed, then the new attempt's events (no second `run.started`). The run's tokens
stay valid (the hub keeps their digests), a cancel reaches it here, and its old server, should
it come back, can no longer append (its turn is stopped). Agent runs are not taken over: their
tools may have acted already, and running them again is not the server's to decide; they end
`server_lost`.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import logging
import re
import secrets
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import attrs
import msgspec
import trio
from rillet._agent._demo_tools import toolset
from rillet._agent._loop import Agent, run_agent
from rillet._core._codes import retryable
from rillet._core._errors import (
    AppendConflict,
    CursorExpired,
    CursorInvalid,
    HubError,
    HubUnavailable,
    UnknownRun,
)
from rillet._core._events import UniMessage
from rillet._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest, user
from rillet._core._runevents import (
    ApprovalRequired,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    RunStarted,
    StatusEvent,
)
from rillet._hub._hub import Subscription, parse_cursor
from rillet._turn._options import RunOptions
from rillet._turn._turn import Sink, SinkBatch, Turn, TurnResult, run_one_turn
from rillet.providers._openai_chat._inbound import BadRequest, chat_request, decode_chat_body

from ._capacity import ClientId, Shares, Ticket, session_share, uncount
from ._log import log_queued_cancel, log_run_end, log_run_start
from ._metrics import Metrics
from ._replies import ErrorReply, Refused, log_unavailable, not_found
from ._shared import Shared, decode_problem

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._core._dialect import Provider

    from ._capacity import Ticket
    from ._http11 import HttpConnection, Request

__all__ = ["AgentRuns", "RunRecord", "Runs"]

logger = logging.getLogger("rillet.transports.server")

_RUN_ID = re.compile(r"[0-9a-f]{1,64}")


@attrs.define(eq=False)
class RunRecord:
    """A run: who may read it and who may act on it (`access`: the digests of its read token
    and of its act token, which the hub shares with other servers), and its turn while this
    server runs it."""

    token: str
    act: str = ""
    turn: Turn | None = None
    agent: Agent | None = None  # an agent run's, while it runs (`AgentRuns`)
    waiting: trio.CancelScope | None = None  # its wait for admission, while queued
    access: bytes = attrs.field()

    @access.default
    def _digest(self) -> bytes:
        return token_digest(self.token) + (token_digest(self.act) if self.act else b"")

    @property
    def read_access(self) -> bytes:
        """The read token's digest."""
        return self.access[:DIGEST_SIZE]

    @property
    def act_access(self) -> bytes | None:
        """The act token's digest; None for a run kept without one."""
        act = self.access[DIGEST_SIZE:]
        return act if len(act) == DIGEST_SIZE else None


DIGEST_SIZE = 32  # bytes of a token's digest


def token_digest(token: str) -> bytes:
    """What is kept of a token: its SHA-256, compared in constant time."""
    return hashlib.sha256(token.encode()).digest()


@attrs.define(eq=False)
class HubFeed:
    """A run's sink into the hub, counting the events for `/metrics`. A run that waited in the
    queue has its own events first (`status` queued): the turn's events follow them, their seqs
    moved by `shift`, so the log stays gapless from seq 1."""

    inner: Sink
    metrics: Metrics
    run_id: str = ""
    turn: Turn | None = None
    shift: int = 0
    offset_ms: int = 0  # how long the run waited before its turn started
    started: float = attrs.field(factory=trio.current_time)
    continued: bool = False  # a run taken over: its log has its `run.started` already

    async def deliver(self, batch: SinkBatch) -> None:
        """Count the batch's run events and append them (moved past the server's own). A run
        whose append was refused because another server took it over stops its turn."""
        if self.continued and batch.run and type(batch.run[0]) is RunStarted:
            self.continued = False
            self.shift -= 1
            batch = SinkBatch(run=batch.run[1:], uni=batch.uni)
        if batch.run:
            self.metrics.count(len(batch.run))
            for event in batch.run:
                if type(event) is AttemptResetEvent:
                    self.metrics.reset()
            if self.shift:
                shift = self.shift
                offset = self.offset_ms
                moved = [
                    msgspec.structs.replace(e, seq=e.seq + shift, elapsed_ms=e.elapsed_ms + offset)
                    for e in batch.run
                ]
                batch = SinkBatch(run=moved, uni=batch.uni)
            await self.inner.deliver(batch)
            fenced = isinstance(getattr(self.inner, "failed", None), AppendConflict)
            if fenced and self.turn is not None:  # another server produces the run now
                self.turn.cancel()

    async def own(self, event: RunEvent) -> None:
        """One of the server's own events for the run (before the turn's, or instead)."""
        self.shift += 1
        await self.inner.deliver(SinkBatch(run=[event], uni=()))

    async def end(self, status: Literal["error", "cancelled"], code: str) -> None:
        """End the run before any turn of it reached a provider: the server's own `run.done`,
        then the hub's sink closed."""
        await self.own(
            RunDone(
                **self.envelope(),
                status=status,
                code=code,
                attempts=0,
                requests=0,
                retryable=retryable(code),
            )
        )
        await self.close()

    def envelope(self) -> dict[str, Any]:
        """The envelope of the server's next own event."""
        elapsed = int((trio.current_time() - self.started) * 1000)
        return {"run_id": self.run_id, "seq": self.shift + 1, "elapsed_ms": elapsed}

    async def close(self) -> None:
        """Close the hub's sink."""
        await self.inner.close()


class _RunBody(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/runs`: a prompt, or a conversation with its settings. The conversation's
    messages are rillet's own (`content_items`) or OpenAI's Chat Completions messages (`role`
    and `content`, a string or parts; `tool_calls`; `role: "tool"` results; system and developer
    messages join the system prompt)."""

    prompt: str | None = None
    messages: list[msgspec.Raw] | None = None
    model: str | None = None
    system_prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    thinking_level: ThinkingLevel | None = None
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None


_decode_run_body = msgspec.json.Decoder(_RunBody).decode


class _Spec(msgspec.Struct, frozen=True, kw_only=True):
    """What another server needs to take a run over: the model that answers it, where (the
    dialect and the base URL: a server that would send the model elsewhere leaves the run to
    others), and the request, as the run's first server read them."""

    model: str
    dialect: str
    base_url: str
    request: TurnRequest

    def served_by(self, provider: Provider) -> bool:
        """Whether `provider` is the upstream this run was started on."""
        return (type(provider.dialect).__name__, provider.base_url) == (
            self.dialect,
            self.base_url,
        )


_decode_spec = msgspec.json.Decoder(_Spec).decode


def _run_request(body: _RunBody) -> TurnRequest:
    if (body.prompt is None) == (body.messages is None):
        raise ValueError("send either `prompt` or `messages`")
    if body.prompt is not None:
        if not body.prompt.strip():
            raise ValueError("`prompt` is empty")
        messages = [user(body.prompt)]
    else:
        assert body.messages is not None
        if not body.messages:
            raise ValueError("`messages` is empty")
        messages, system = _messages(body.messages)
        if system is not None:
            if body.system_prompt is not None:
                raise ValueError("send the system prompt once: `system_prompt` or a system message")
            return msgspec.structs.replace(_settings(body, messages), system_prompt=system)
    return _settings(body, messages)


def _messages(raw: list[msgspec.Raw]) -> tuple[list[UniMessage], str | None]:
    """The conversation of a run's body, and the system prompt its messages carry: rillet's
    own messages as they are, OpenAI's read as the Chat Completions endpoint reads them.
    Raises `ValueError` saying what is wrong."""
    try:
        own = ["content_items" in _decode_keys(bytes(message)) for message in raw]
    except msgspec.ValidationError:
        raise ValueError("`messages` holds something other than message objects") from None
    if all(own):
        try:
            return [_decode_message(bytes(m)) for m in raw], None
        except msgspec.ValidationError as exc:  # its quotes of the body cut short
            raise ValueError(f"`messages`: {decode_problem(exc)}") from None
    if any(own):
        raise ValueError("`messages` mixes rillet's messages with OpenAI's: send one kind")
    wrapped = b'{"messages":[' + b",".join(bytes(m) for m in raw) + b"]}"
    try:
        request = chat_request(decode_chat_body(wrapped))
    except msgspec.ValidationError as exc:
        raise ValueError(f"`messages` (OpenAI's shape): {decode_problem(exc)}") from None
    except BadRequest as exc:
        raise ValueError(str(exc)) from None
    return list(request.messages), request.system_prompt


_decode_message = msgspec.json.Decoder(UniMessage).decode
_decode_keys = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


def _settings(body: _RunBody, messages: list[UniMessage]) -> TurnRequest:
    return TurnRequest(
        messages=messages,
        system_prompt=body.system_prompt,
        tools=body.tools,
        tool_choice=body.tool_choice,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        thinking_level=body.thinking_level,
    )


@attrs.define(eq=False)
class Runs:
    """The runs this server started (by id: who may read them, their turns) and the runs API.

    Attributes:
        runs: the runs kept, by id (forgotten once the hub has forgotten them).
        per_run: live subscriptions by run.
        per_client: live subscriptions by client and session (`Shares`).
    """

    shared: Shared
    runs: dict[str, RunRecord] = attrs.field(factory=dict)
    per_run: collections.Counter[str] = attrs.field(factory=collections.Counter)
    per_client: Shares = attrs.field()
    decoy: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))
    agents: AgentRuns = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.agents = AgentRuns(self)

    @per_client.default
    def _shares(self) -> Shares:
        limits = self.shared.limits
        per_client = limits.max_subscribers_per_client
        return Shares(per_client, session_share(per_client, limits.max_subscribers_per_session))

    async def start_run(self, http: HttpConnection, request: Request, _: str) -> None:
        """`POST /v1/runs`: 201 with the run's id, its read token (`token`, also in the URLs),
        its act token (`act_token`, here only) and URLs once its turn runs (or it is
        queued)."""
        self.shared.require_key(request)
        body: _RunBody = await self.shared.read_json(
            http, request, _decode_run_body, "invalid_request"
        )
        try:
            turn_request = _run_request(body)
        except ValueError as exc:
            raise ErrorReply(400, "invalid_request", str(exc)) from None
        provider = self.shared.provider(body.model, mmsp=False)
        ticket = self.shared.reserve(request, mmsp=False)
        run_id = secrets.token_hex(12)
        record = RunRecord(token=secrets.token_urlsafe(24), act=secrets.token_urlsafe(24))
        agent = self.agents.wanted(body.tools)
        spec = None
        if self.shared.config.takeover and not agent:
            spec = msgspec.json.encode(
                _Spec(
                    model=provider.model,
                    dialect=type(provider.dialect).__name__,
                    base_url=provider.base_url,
                    request=turn_request,
                )
            )
        try:
            try:
                inner = await self.shared.hub.open_run(run_id, access=record.access, spec=spec)
            except HubUnavailable as exc:
                logger.error("refusing a new run: %s", exc)
                raise log_unavailable().reply() from None
            sink = HubFeed(inner, self.shared.metrics, run_id)
            self.runs[run_id] = record
            runner = self.agents.run if agent else self._run
            try:
                await self.shared.nursery.start(
                    runner, turn_request, provider, run_id, sink, record, ticket
                )
            except RuntimeError:  # it failed before it could start (logged by `_run`)
                raise ErrorReply(500, "internal_error", "the run could not start") from None
        except BaseException:
            self.shared.admission.release(ticket)
            raise
        base = self._base(http, request)
        query = f"?token={record.token}"
        answer = {
            "run_id": run_id,
            "token": record.token,
            "act_token": record.act,
            "events_url": f"{base}/v1/runs/{run_id}/events{query}",
            "ws_url": f"ws{base.removeprefix('http')}/v1/runs/{run_id}/ws{query}",
        }
        await http.respond(201, msgspec.json.encode(answer))

    async def _run(
        self,
        request: TurnRequest,
        provider: Provider,
        run_id: str,
        sink: HubFeed,
        record: RunRecord,
        ticket: Ticket,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        *,
        replay: str | None = None,
    ) -> None:
        """One run, in the server's nursery: it goes on whoever watches, or nobody. Started
        once its turn runs (so it can be cancelled); the turn is let go when it ends (the hub
        keeps its events). A reply its provider keeps is noted in a hub that lets another
        server take the run over; `replay`, such a reply a taken-over run reads again."""
        hub = self.shared.hub
        keep = getattr(hub, "keep", None) if self.shared.config.takeover else None

        def kept(reply_id: str) -> None:
            assert keep is not None
            self.shared.nursery.start_soon(keep, run_id, reply_id)

        options = RunOptions(
            policy=self.shared.config.policy,
            client=self.shared.client,
            admission=self.shared.streams,
            reasoning=self.shared.config.reasoning,
            tool_arguments=self.shared.config.tool_arguments,
            prices=self.shared.config.prices,
            max_cost=self.shared.config.max_cost,
            history=False,  # the hub keeps the events; the turn need not keep a replay
        )

        async def turn_task(
            task_status: trio.TaskStatus[Turn] = trio.TASK_STATUS_IGNORED,
        ) -> TurnResult:
            return await run_one_turn(
                request,
                provider,
                sinks=[sink],
                options=options,
                run_id=run_id,
                task_status=task_status,
                replay=replay,
                on_kept=kept if keep is not None else None,
            )

        self.shared.metrics.runs_started += 1
        self.shared.metrics.serving(provider)
        log_run_start(run_id, provider, "run")
        try:
            if not self.shared.admission.try_admit(ticket):
                await self._queued(sink, record, ticket, task_status)
                if not ticket.admitted:
                    self.shared.metrics.cancelled_queued()
                    log_queued_cancel(run_id, provider)
                    return
                task_status = trio.TASK_STATUS_IGNORED
            async with trio.open_nursery() as nursery:
                record.turn = sink.turn = await nursery.start(turn_task)
                task_status.started()
                result = await record.turn.result()
                self.shared.metrics.finished(result)
                log_run_end(run_id, provider, "run", result)
        except Exception as exc:  # a bug in one run must not take the server down
            logger.error("run %s failed: %s", run_id, type(exc).__name__, exc_info=True)
        finally:
            self.shared.admission.release(ticket)
            record.turn = sink.turn = None

    async def take_over(self, run_id: str) -> bool:
        """Continue a run whose server is gone, from its spec (the hub's `takeover`): True once
        it runs here (or another server took it first); False when this server has no room
        for it now, or does not serve its model from the same upstream, so that another
        server takes it (or, after a while, it ends `server_lost`)."""
        from rillet._hub._redis import RedisHub  # the only hub that offers runs

        hub = self.shared.hub
        assert isinstance(hub, RedisHub)
        kept = await hub.spec(run_id)
        if kept is None:
            return True  # done, forgotten, or taken meanwhile: the hub reads which
        try:
            spec = _decode_spec(kept)
            provider = self.shared.provider(spec.model, mmsp=False)
        except (msgspec.ValidationError, ErrorReply) as exc:
            logger.warning("run %s: cannot be taken over here: %s", run_id, exc)
            return False
        if not spec.served_by(provider):
            return False
        ticket = self.shared.admission.reserve(ClientId(b"takeover:" + run_id.encode()))
        if ticket is None:
            return False
        try:
            claim = await hub.claim(run_id)
        except BaseException:
            self.shared.admission.release(ticket)
            raise
        if claim is None:
            self.shared.admission.release(ticket)
            return True
        self.shared.metrics.taken_over()
        record = RunRecord(token="", access=claim.access or b"")
        self.runs[run_id] = record
        sink = HubFeed(
            claim.sink,
            self.shared.metrics,
            run_id,
            shift=claim.last,
            offset_ms=claim.elapsed_ms,
            started=trio.current_time() - claim.elapsed_ms / 1000,
            continued=True,
        )
        try:
            await sink.own(StatusEvent(**sink.envelope(), phase="taken_over", attempt=0))
            await sink.own(AttemptResetEvent(**sink.envelope(), attempt=0))
            run = functools.partial(self._run, replay=claim.kept)
            await self.shared.nursery.start(
                run, spec.request, provider, run_id, sink, record, ticket
            )
        except BaseException:
            self.shared.admission.release(ticket)
            raise
        return True

    async def _queued(
        self, sink: HubFeed, record: RunRecord, ticket: Ticket, task_status: trio.TaskStatus[None]
    ) -> None:
        """Wait in the queue for a slot: the run's log says so first (`status`, phase
        `queued`), and the run is started for its client meanwhile. Cancelled while it waits,
        the run ends there (`run.done` cancelled) and never reaches the provider."""
        await sink.own(StatusEvent(**sink.envelope(), phase="queued", attempt=0))
        with trio.CancelScope() as record.waiting:
            task_status.started()
            await self.shared.admission.admit(ticket)
        record.waiting = None
        if ticket.admitted:
            sink.offset_ms = int((trio.current_time() - sink.started) * 1000)
            return
        await sink.end("cancelled", "cancelled")

    async def sweep(self) -> None:
        """Every `sweep_interval` seconds: the hub forgets expired runs, and the server the
        tokens of runs the hub has forgotten (not only when a run starts: an idle server must
        give its memory back too)."""
        while True:
            await trio.sleep(self.shared.limits.sweep_interval)
            try:
                await self.shared.hub.sweep()
                kept = await self.shared.hub.kept(list(self.runs))
            except HubUnavailable as exc:
                logger.warning("sweep skipped: %s", exc)
                continue
            for run_id in [r for r in self.runs if r not in kept]:
                self.runs.pop(run_id, None)

    def _base(self, http: HttpConnection, request: Request) -> str:
        """The URL the client reached: its `Host`, else the address it connected to (an
        HTTP/1.0 request may name none; the configured port may be 0, any)."""
        host = request.headers.get("host")
        if host is None or not re.fullmatch(r"[A-Za-z0-9.:\[\]-]+", host):
            reached = http.stream.local_address()
            if reached:
                return f"http://{reached}"
            return f"http://{self.shared.config.host}:{self.shared.config.port}"
        return f"http://{host}"

    async def authorized(
        self, request: Request, run_id: str, *, act: bool = False
    ) -> RunRecord | None:
        """The run when the request may read it (its read token as the Bearer credential or
        as `?token=`), or with `act`, act on it (its act token as the Bearer credential, or
        the server key); None for an unknown run or a wrong token alike (the same
        constant-time comparisons either way). A run another server started is known by the
        access the shared hub keeps; `Refused` (503) when it cannot be asked."""
        record = self.runs.get(run_id) if _RUN_ID.fullmatch(run_id) else None
        if record is None and _RUN_ID.fullmatch(run_id):
            try:
                access = await self.shared.hub.access(run_id)
            except HubUnavailable:
                raise log_unavailable() from None
            record = RunRecord(token="", access=access) if access is not None else None
        decoy = token_digest(self.decoy)
        if act:  # a URL leaks: the act token is taken from the header only
            expected = record.act_access if record is not None else None
            given: tuple[str, ...] = (request.bearer() or "",)
        else:  # a client that sends the server key with every request names the run in the
            # query: the header and the query are both compared
            expected = record.read_access if record is not None else None
            given = (request.bearer() or "", request.query.get("token", ""))
        matched = False
        for credential in given:
            matched |= hmac.compare_digest(token_digest(credential), expected or decoy)
        if act:
            matched |= self.shared.has_key(request)
        if matched and record is not None:
            return record
        return None

    async def cancel_run(self, http: HttpConnection, request: Request, run_id: str) -> None:
        """`DELETE /v1/runs/{id}` with its act token (or the server key): 202, the turn (or
        its wait) cancelled; 404 for an unknown run or any other credential alike."""
        try:
            record = await self.authorized(request, run_id, act=True)
        except Refused as refused:
            raise refused.reply() from None
        if record is None:
            raise not_found()
        if run_id in self.runs:
            status, body = self._cancel(run_id, self.runs[run_id])
        else:
            status, body = await self.elsewhere({"op": "cancel", "run_id": run_id})
        await http.respond(status, body)

    def _cancel(self, run_id: str, record: RunRecord) -> tuple[int, bytes]:
        if record.turn is not None:
            record.turn.cancel()
        elif record.agent is not None:
            record.agent.cancel()
        elif record.waiting is not None:
            record.waiting.cancel()
        return 202, msgspec.json.encode({"run_id": run_id})

    async def elsewhere(self, request: dict[str, Any]) -> tuple[int, bytes]:
        """A cancel or an answer for a run another server drives, handed to it (`_control`):
        its answer; 409 `elsewhere` when no server answers for the run. A run that is over
        (its server gone too: the hub ends it as `server_lost`) is answered here, as its
        server answers for a finished run: a cancel 202, an answer 409."""
        try:
            ended = await self.shared.hub.ended(str(request.get("run_id", "")))
        except HubUnavailable:
            ended = False  # the run's server may still answer over its own connection
        if ended:
            if request.get("op") == "cancel":
                return 202, msgspec.json.encode({"run_id": request["run_id"]})
            reply = _not_waiting()
            return reply.status, reply.body
        control = self.shared.control
        answer = None if control is None else await control.ask(request)
        if answer is None:
            reply = ErrorReply(
                409,
                "elsewhere",
                "the server that started the run did not answer (it may have stopped); "
                "retry, or send this to that server",
            )
            return reply.status, reply.body
        return answer

    async def controlled(self, request: dict[str, Any]) -> tuple[int, bytes] | None:
        """A control request from another server: answered when the run is this server's
        (the other server has checked the run's token); None otherwise."""
        run_id = str(request.get("run_id", ""))
        record = self.runs.get(run_id)
        if record is None:
            return None
        op = request.get("op")
        if op == "cancel":
            return self._cancel(run_id, record)
        if op == "answer":
            try:
                body = self.agents.decide(
                    record,
                    run_id,
                    str(request.get("approval_id", "")),
                    approve=bool(request.get("approve")),
                    reason=str(request.get("reason", "")),
                )
            except ErrorReply as reply:
                return reply.status, reply.body
            return 200, body
        return None

    @asynccontextmanager
    async def subscription(
        self, run_id: str, cursor: str | None, client: ClientId
    ) -> AsyncIterator[Subscription]:
        """Follow a run from a cursor, counted against the limits. Raises `Refused`."""
        limits = self.shared.limits
        try:
            after = parse_cursor(run_id, cursor)
            if self.per_run[run_id] >= limits.max_subscribers_per_run:
                raise HubError("too many subscribers for this run")
            if self.per_client.full(client):
                raise HubError("too many subscribers from this client")
            sub = await self.shared.hub.follow(run_id, after)
        except UnknownRun:
            self.runs.pop(run_id, None)
            raise Refused(404, "not_found", "no such run") from None
        except CursorInvalid as exc:
            raise Refused(400, "cursor_invalid", exc.reason) from None
        except CursorExpired as exc:
            raise Refused(
                410, "cursor_expired", "the log no longer keeps that seq", first_kept=exc.first_kept
            ) from None
        except HubUnavailable:
            raise log_unavailable() from None
        except HubError as exc:
            raise Refused(429, "too_many_subscribers", str(exc)) from None
        self.per_run[run_id] += 1
        self.per_client.take(client)
        try:
            yield sub
        finally:
            sub.close()
            if sub.drop_reason is not None:
                self.shared.metrics.subscribers_dropped += 1
            uncount(self.per_run, run_id)
            self.per_client.give(client)


_MAX_REASON = 1000  # characters of a denial's reason the model is told


class _Answer(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/runs/{id}/approvals/{approval_id}`: the host's answer."""

    approve: bool
    reason: str = ""


_decode_answer = msgspec.json.Decoder(_Answer).decode


class AgentRuns:
    """Starting agent runs and answering their approvals, for the runs API (`Runs`)."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def wanted(self, client_tools: list[Any]) -> bool:
        """Whether a new run is an agent run: the server has a tool set and the request
        brings no tools of its own (those the client runs itself, as in a plain turn)."""
        return self.runs.shared.config.tools is not None and not client_tools

    async def run(
        self,
        request: TurnRequest,
        provider: Provider,
        run_id: str,
        sink: HubFeed,
        record: RunRecord,
        ticket: Ticket,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One agent run, in the server's nursery (as `Runs._run` is for a turn)."""
        shared = self.runs.shared
        config = shared.config
        assert config.tools is not None
        shared.metrics.runs_started += 1
        try:
            if not shared.admission.try_admit(ticket):
                await self.runs._queued(sink, record, ticket, task_status)
                if not ticket.admitted:
                    return
                task_status = trio.TASK_STATUS_IGNORED
            async with trio.open_nursery() as nursery:
                agent: Agent = await nursery.start(
                    lambda task_status: run_agent(
                        request,
                        provider,
                        tools=toolset(config.tools or ""),
                        sinks=[sink],
                        client=shared.client,
                        run_id=run_id,
                        approvals="ask",
                        reasoning=config.reasoning,
                        tool_arguments=config.tool_arguments,
                        policy=config.policy,
                        admission=shared.streams,
                        prices=config.prices,
                        max_cost=config.max_cost,
                        task_status=task_status,
                    )
                )
                record.agent = agent
                task_status.started()
                # only the approvals' timer stops when the run ends: the run itself goes on
                # until its sinks have its last events (`result()` comes before them)
                timer = trio.CancelScope()
                nursery.start_soon(_deny_unanswered, agent, shared.limits.approval_timeout, timer)
                result = await agent.result()
                timer.cancel()
            for turn in result.turns:
                shared.metrics.finished(turn)
        except Exception as exc:  # a bug in one run must not take the server down
            logger.error("agent run %s failed: %s", run_id, type(exc).__name__, exc_info=True)
        finally:
            shared.admission.release(ticket)
            record.agent = None

    async def answer(self, http: HttpConnection, request: Request, arg: str) -> None:
        """`POST /v1/runs/{id}/approvals/{approval_id}` with the run's act token (or the server
        key) and `{"approve": true|false, "reason": "..."}`: 200 once the waiting tool call is
        let run or refused; 404 for an unknown run, its read token or another run's token (the
        same bytes); 409 for
        an approval that is not waiting (unknown, or answered already). A run another server
        drives is answered there (`Runs.elsewhere`)."""
        run_id, _, approval_id = arg.partition("/")
        try:
            record = await self.runs.authorized(request, run_id, act=True)
        except Refused as refused:
            raise refused.reply() from None
        if record is None:
            raise not_found()
        answer: _Answer = await self.runs.shared.read_json(
            http, request, _decode_answer, "invalid_request"
        )
        if len(answer.reason) > _MAX_REASON:
            raise ErrorReply(400, "invalid_request", f"`reason` is over {_MAX_REASON} characters")
        mine = self.runs.runs.get(run_id)
        if mine is not None:
            body = self.decide(
                mine, run_id, approval_id, approve=answer.approve, reason=answer.reason
            )
            status = 200
        else:  # another server drives the run: it decides
            status, body = await self.runs.elsewhere(
                {
                    "op": "answer",
                    "run_id": run_id,
                    "approval_id": approval_id,
                    "approve": answer.approve,
                    "reason": answer.reason,
                }
            )
        await http.respond(status, body)

    def decide(
        self, record: RunRecord, run_id: str, approval_id: str, *, approve: bool, reason: str
    ) -> bytes:
        """Let a waiting tool call of this server's run go, or refuse it: the response body;
        `ErrorReply` 409 for an approval that is not waiting."""
        agent = record.agent
        try:
            if agent is None:
                raise ValueError(approval_id)
            if approve:
                agent.approve(approval_id)
            else:
                agent.deny(approval_id, reason)
        except ValueError:
            raise _not_waiting() from None
        decision = "approved" if approve else "denied"
        body = {"run_id": run_id, "approval_id": approval_id, "decision": decision}
        return msgspec.json.encode(body)


def _not_waiting() -> ErrorReply:
    """The answer to an approval that is not waiting (unknown, answered, or its run over)."""
    return ErrorReply(
        409, "approval_not_waiting", "no such approval is waiting (answered already?)"
    )


async def _deny_unanswered(agent: Agent, seconds: float, scope: trio.CancelScope) -> None:
    """Deny each approval no one answers within `seconds`, until `scope` is cancelled."""
    with scope:
        async with trio.open_nursery() as nursery:
            async for event in agent.run_events():
                if type(event) is ApprovalRequired:
                    assert isinstance(event, ApprovalRequired)
                    nursery.start_soon(_deny_after, agent, event.approval_id, seconds)


async def _deny_after(agent: Agent, approval_id: str, seconds: float) -> None:
    await trio.sleep(seconds)
    if any(p.approval_id == approval_id for p in agent.pending_approvals):
        agent.deny(approval_id, "no answer in time")
