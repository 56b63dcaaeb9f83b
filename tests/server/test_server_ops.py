"""What an operator sees of the server: Prometheus metrics at `/metrics` that count what
happened, and log lines (runs, requests, provider failures in words) that never carry a key.

Real servers on 127.0.0.1 with the loopback provider behind them; `/metrics` is parsed with
prometheus-client's own parser. The command line's logs are read from a `rillet serve`
subprocess's stderr.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from rillet._core._dialect import Secret
from rillet._core._policy import Policy
from rillet._core._runevents import RunDone, decode_run_event
from rillet.transports.server import Limits, ServerConfig, ServerConfigError
from rillet.transports.testing import Reply, open_loopback_provider, refused_url, status_reply

from ..cli.test_cli import _read_until, _spawn
from ..server_support import (
    PROVIDER_KEY,
    Served,
    chat_provider,
    dropped_then_ok,
    read_sse,
    serving,
    text_reply,
)

if TYPE_CHECKING:
    from collections.abc import Callable

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_AUTH_BODY = {
    "error": {
        "message": f"Incorrect API key provided: {PROVIDER_KEY}.",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
}


async def scrape(served: Served) -> Samples:
    """`GET /metrics`, parsed: every sample by name and labels."""
    reply = await served.client.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a sample not exposed (a labelled counter not yet counted)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape_until(served: Served, ready: Callable[[Samples], bool]) -> Samples:
    """Scrape until `ready` (a run's counts land as its task ends, just after its `run.done`)."""
    while not ready(samples := await scrape(served)):  # noqa: ASYNC110
        await trio.sleep(0.01)
    return samples


def requests(samples: Samples, status: str, provider: str = "openai-chat") -> float:
    """Provider requests counted with `status`."""
    return value(samples, "rillet_provider_requests_total", provider=provider, status=status)


def ended(runs: int) -> Callable[[Samples], bool]:
    return lambda s: value(s, "rillet_run_duration_seconds_count") >= runs


# --- metrics --------------------------------------------------------------------------------------


async def test_a_turn_that_retried_once_shows_two_provider_requests_and_one_retry() -> None:
    script = [status_reply(503, retry_after_ms=10), text_reply()]  # (not the default 5 s wait)
    with trio.fail_after(10):
        async with serving(script) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
            samples = await scrape_until(served, ended(1))
    assert stream.run_events[-1].status == "completed"  # type: ignore[union-attr]
    provider = "openai-chat"
    assert value(samples, "rillet_provider_requests_total", provider=provider, status="503") == 1
    assert value(samples, "rillet_provider_requests_total", provider=provider, status="200") == 1
    assert value(samples, "rillet_retries_total") == 1
    assert value(samples, "rillet_resets_total") == 0  # nothing had streamed before the retry
    assert value(samples, "rillet_runs_total", outcome="completed") == 1
    assert value(samples, "rillet_time_to_first_event_seconds_count") == 1
    assert value(samples, "rillet_run_duration_seconds_count") == 1
    assert value(samples, "rillet_runs_active") == 0
    assert value(samples, "rillet_runs_queued") == 0
    # the POST's answer and the whole SSE body went out before this scrape began
    assert value(samples, "rillet_bytes_sent_total") > len(stream.events) * 50


async def test_tokens_are_counted_by_kind_as_the_provider_reported_them() -> None:
    """OpenAI's recorded usage: 1,210 prompt tokens of which 1,024 read from the cache, 86
    completion tokens of which 64 reasoning."""
    from rillet.transports.testing import fixture_reply

    from ..wire_cases import wire_path

    reply = fixture_reply(wire_path("openai-chat", "usage_final_chunk"))
    with trio.fail_after(10):
        async with serving([reply]) as served:
            run = await served.start()
            await read_sse(served.client, run["events_url"])
            samples = await scrape_until(served, ended(1))
    tokens = {kind: value(samples, "rillet_tokens_total", kind=kind) for kind in KINDS}
    assert tokens == {
        "input": 1210 - 1024,
        "cache_read": 1024,
        "cache_write": 0,  # not reported: never counted
        "output": 86,
        "reasoning": 64,
    }


KINDS = ("input", "cache_read", "cache_write", "output", "reasoning")


async def test_the_money_spent_is_in_each_runs_usage_and_at_metrics_by_model() -> None:
    """The same recorded usage at the server's prices: each run's `usage` event says what it
    cost, and /metrics adds it up by the model asked for."""
    from decimal import Decimal

    from rillet import Price, PriceTable
    from rillet.transports.testing import fixture_reply

    from ..wire_cases import wire_path

    price = Price(input="0.25", cached_input="0.025", output="2")
    reply = fixture_reply(wire_path("openai-chat", "usage_final_chunk"))
    expected = ((1210 - 1024) * Decimal("0.25") + 1024 * Decimal("0.025") + 86 * 2) / 10**6
    with trio.fail_after(10):
        async with serving([reply, reply], prices=PriceTable({"gpt-4o-mini": price})) as served:
            costs = []
            for _ in range(2):
                run = await served.start()
                stream = await read_sse(served.client, run["events_url"])
                parsed = [json.loads(e.data) for e in stream.events]
                (usage,) = [e for e in parsed if e["type"] == "usage"]
                costs.append(Decimal(usage["cost"]))
            samples = await scrape_until(served, ended(2))
    assert costs == [expected, expected]
    spent = value(samples, "rillet_cost_total", model="gpt-4o-mini")
    assert spent == pytest.approx(float(expected * 2))


async def test_a_run_its_max_cost_cannot_pay_for_ends_max_cost_unsent() -> None:
    from rillet import Price

    with trio.fail_after(10):
        async with serving(prices=Price(input=100, output=100), max_cost="0.0001") as served:
            run = await served.start("a question " * 50)
            stream = await read_sse(served.client, run["events_url"])
            assert served.loopback.requests == []
    done = json.loads(stream.events[-1].data)
    assert (done["type"], done["code"], done["requests"]) == ("run.done", "max_cost", 0)
    with pytest.raises(ServerConfigError, match="needs prices"):
        ServerConfig(provider=chat_provider("http://127.0.0.1:9"), max_cost=1).check()


async def test_a_reset_is_counted_with_its_retry() -> None:
    words = ["one ", "two ", "three ", "four"]
    with trio.fail_after(10):
        async with serving(dropped_then_ok(words, 2)) as served:
            run = await served.start()
            await read_sse(served.client, run["events_url"])
            samples = await scrape_until(served, ended(1))
    # both attempts were answered 200: the first broke off mid-body
    assert requests(samples, "200") == 2
    assert value(samples, "rillet_retries_total") == 1
    assert value(samples, "rillet_resets_total") == 1
    assert value(samples, "rillet_runs_total", outcome="completed") == 1


async def test_a_provider_that_cannot_be_reached_counts_as_error_requests() -> None:
    policy = Policy(backoff_base=0.01, random=lambda: 0.0, transport_retries=1)
    with trio.fail_after(10):
        async with serving(provider=chat_provider(refused_url()), policy=policy) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            done = decode_run_event(served.log(run["run_id"])[-1])
            samples = await scrape_until(served, ended(1))
    assert isinstance(done, RunDone)
    assert done.requests == 3  # two streamed attempts and the non-streaming rescue
    assert requests(samples, "error") == done.requests
    assert (
        sum(v for (name, _), v in samples.items() if name == "rillet_provider_requests_total") == 3
    )
    assert value(samples, "rillet_retries_total") == done.attempts - 1 == 2
    assert value(samples, "rillet_runs_total", outcome="init_failed") == 1
    assert value(samples, "rillet_time_to_first_event_seconds_count") == 0


async def test_active_queued_and_subscribers_are_what_the_server_holds_now() -> None:
    stalled = Reply(stall_headers=True)
    limits = Limits(max_streams=1)
    with trio.fail_after(10):
        async with serving([stalled, stalled], limits=limits) as served:
            first = await served.start()
            await served.start()
            await served.loopback.wait_for_requests(1)
            async with served.client.stream("GET", first["events_url"]) as following:
                assert following.status_code == 200
                samples = await scrape_until(served, lambda s: value(s, "rillet_subscribers") == 1)
            after = await scrape_until(served, lambda s: value(s, "rillet_subscribers") == 0)
    assert value(samples, "rillet_runs_active") == 1
    assert value(samples, "rillet_runs_queued") == 1
    assert value(samples, "rillet_connections") >= 2  # the follower's and the scraper's
    assert value(after, "rillet_runs_active") == 1


async def test_two_servers_in_one_process_keep_their_own_counts() -> None:
    with trio.fail_after(10):
        async with serving() as one, serving() as two:
            run = await one.start()
            await one.wait_for(run["run_id"])
            counted = await scrape_until(one, ended(1))
            other = await scrape(two)
    assert value(counted, "rillet_runs_total", outcome="completed") == 1
    assert value(other, "rillet_runs_total", outcome="completed") == 0
    assert value(other, "rillet_run_duration_seconds_count") == 0
    assert value(other, "rillet_provider_requests_total", provider="openai-chat", status="200") == 0


async def test_mmsp_streams_are_counted_as_runs() -> None:
    hi = {"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}
    body = {"model": "gpt-4o-mini", "messages": [hi]}
    with trio.fail_after(10):
        async with serving() as served:
            reply = await served.client.post("/v1/stream", json=body)
            samples = await scrape_until(served, ended(1))
    assert reply.status_code == 200
    assert reply.text.endswith("data: [DONE]\n\n")
    assert value(samples, "rillet_runs_total", outcome="completed") == 1
    assert requests(samples, "200") == 1
    assert value(samples, "rillet_bytes_sent_total") >= len(reply.content)


async def test_metrics_need_the_server_key_and_json_stays_at_its_own_path() -> None:
    with trio.fail_after(10):
        async with serving(api_key=Secret("server-key-0123456789")) as served:
            refused = await served.client.get("/metrics")
            headers = {"authorization": "Bearer server-key-0123456789"}
            allowed = await served.client.get("/metrics", headers=headers)
            as_json = await served.client.get("/metrics.json", headers=headers)
    assert refused.status_code == 401
    assert allowed.status_code == 200
    assert "rillet_runs_active" in allowed.text
    assert as_json.json()["runs_active"] == 0


async def test_without_prometheus_client_metrics_say_how_to_get_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # the import then fails
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            reply = await served.client.get("/metrics")
            as_json = await served.client.get("/metrics.json")
    assert reply.status_code == 501
    assert "rillet[metrics]" in reply.json()["error"]["message"]
    assert as_json.status_code == 200
    assert as_json.json()["runs_started"] == 1


# --- logs, in process -----------------------------------------------------------------------------


def _fields(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, object]]:
    return [
        dict(getattr(r, "fields", {}), level=r.levelname, message=r.getMessage())
        for r in caplog.records
        if r.name == logger
    ]


async def test_a_run_leaves_a_start_an_end_and_a_line_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving([status_reply(503, retry_after_ms=10), text_reply()]) as served:
            run = await served.start()
            await read_sse(served.client, run["events_url"])
            await scrape_until(served, ended(1))
    runs = _fields(caplog, "rillet.transports.server")
    started = [r for r in runs if r.get("run_id") == run["run_id"] and "started" in str(r)]
    finished = [r for r in runs if r.get("run_id") == run["run_id"] and "outcome" in r]
    assert len(started) == 1
    assert started[0]["provider"] == "openai-chat"
    assert started[0]["model"] == "gpt-4o-mini"
    assert len(finished) == 1
    end = finished[0]
    assert end["outcome"] == "completed"
    assert end["requests"] == 2
    assert isinstance(end["first_event_s"], float)
    assert isinstance(end["duration_s"], float)
    assert f"run {run['run_id']} ended: outcome completed, 2 request(s)" in str(end["message"])
    access = _fields(caplog, "rillet.transports.server.access")
    post = [a for a in access if a["method"] == "POST" and a["path"] == "/v1/runs"]
    events = [a for a in access if str(a["path"]).endswith("/events")]
    assert [a["status"] for a in post] == [201]
    assert int(str(post[0]["bytes"])) > 0
    assert [a["status"] for a in events] == [200]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert run["token"] not in text  # the events URL's query carries it; the log does not
    assert "?" not in "".join(str(a["path"]) for a in access)


_HI = [{"role": "user", "content": "Hi"}]
TEXT_HI = {"type": "text.done", "text": "Hi"}
_WIRES: dict[str, tuple[str, str, dict[str, object]]] = {
    # served wire: (its kind in the log lines, path, request body)
    "mmsp": (
        "stream",
        "/v1/stream",
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content_items": [TEXT_HI]}]},
    ),
    "openai": ("chat", "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": _HI}),
    "openai-stream": (
        "chat",
        "/v1/chat/completions",
        {"model": "gpt-4o-mini", "messages": _HI, "stream": True},
    ),
    "ai-sdk": (
        "ui",
        "/v1/ui/chat",
        {"messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}]},
    ),
}


@pytest.mark.parametrize("wire", list(_WIRES))
async def test_every_served_wire_logs_a_start_and_an_end_as_a_run_does(
    wire: str, caplog: pytest.LogCaptureFixture
) -> None:
    kind, path, body = _WIRES[wire]
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving() as served:
            reply = await served.client.post(path, json=body)
            await scrape_until(served, ended(1))
    assert reply.status_code == 200, reply.text
    runs = [r for r in _fields(caplog, "rillet.transports.server") if r.get("kind") == kind]
    started = [r for r in runs if "started" in str(r["message"])]
    finished = [r for r in runs if "outcome" in r]
    assert len(started) == len(finished) == 1
    run_id = started[0]["run_id"]
    assert finished[0]["run_id"] == run_id
    assert (
        started[0]["message"] == f"{kind} {run_id} started: provider openai-chat, model gpt-4o-mini"
    )
    assert finished[0]["outcome"] == "completed"
    assert finished[0]["requests"] == 1
    assert str(finished[0]["message"]).startswith(
        f"{kind} {run_id} ended: outcome completed, 1 request(s), "
    )


async def test_a_provider_401_is_logged_with_its_cause_and_no_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving(
            [status_reply(401, body=_AUTH_BODY)], provider_key=PROVIDER_KEY
        ) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            await scrape_until(served, ended(1))
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(failures) == 1
    line = failures[0].getMessage()
    assert line.startswith(f"run {run['run_id']} failed: provider openai-chat, model gpt-4o-mini")
    assert "authentication failed (401)" in line
    assert "check the API key" in line
    everything = "\n".join(r.getMessage() for r in caplog.records)
    everything += "\n".join(json.dumps(getattr(r, "fields", {})) for r in caplog.records)
    assert PROVIDER_KEY not in everything
    assert "Incorrect API key" not in everything  # a provider's 401 body is never passed on


async def test_a_cancelled_run_is_not_logged_as_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving([Reply(stall_headers=True)]) as served:
            run = await served.start()
            await served.loopback.wait_for_requests(1)
            headers = {"authorization": f"Bearer {run['act_token']}"}
            cancel = await served.client.delete(f"/v1/runs/{run['run_id']}", headers=headers)
            samples = await scrape_until(served, ended(1))
    assert cancel.status_code == 202
    assert value(samples, "rillet_runs_total", outcome="cancelled") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    ends = [r for r in _fields(caplog, "rillet.transports.server") if "outcome" in r]
    assert [e["outcome"] for e in ends] == ["cancelled"]


async def test_the_library_adds_no_log_handler() -> None:
    script = textwrap.dedent(
        """
        import logging
        def handlers():
            found = {"": list(logging.getLogger().handlers)}
            for name, lg in logging.Logger.manager.loggerDict.items():
                if isinstance(lg, logging.Logger) and lg.handlers:
                    found[name] = list(lg.handlers)
            return found
        before = handlers()
        import trio, rillet, rillet.transports.server
        from rillet.transports.testing import open_loopback_provider, Reply, openai_text_stream
        async def main():
            reply = Reply(chunks=(openai_text_stream(["hi"]),))
            async with open_loopback_provider([reply]) as p:
                provider = rillet.providers.Provider(
                    dialect=rillet.providers.OpenAIChatDialect(),
                    base_url=p.url + "/v1",
                    model="m",
                )
                request = rillet.TurnRequest(messages=[rillet.user("hi")])
                result = await rillet.run_turn(request, provider)
                assert result.ok, result
        trio.run(main)
        assert handlers() == before, (before, handlers())
        assert before == {"": []}, before
        print("ok")
        """
    )
    done = await trio.run_process(
        [sys.executable, "-c", script], capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"ok\n"


# --- logs of `rillet serve` -----------------------------------------------------------------------


@pytest.mark.slow
async def test_serve_logs_a_provider_401_behind_the_page_on_stderr() -> None:
    async with open_loopback_provider([status_reply(401, body=_AUTH_BODY)]) as loopback:
        cmd = [sys.executable, "-m", "rillet", "serve", "--port", "0", "--log-format", "json"]
        cmd += ["--provider", f"{loopback.url}/v1", "--model", "m", "--api-key", PROVIDER_KEY]
        proc = _spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            err = await _read_until(proc.stderr, b"rillet serving", limit=30)
            url = err.split(b"rillet serving ")[1].split()[0].decode().rstrip("/")
            async with httpx.AsyncClient(base_url=url) as client:
                started = await client.post("/v1/runs", json={"prompt": "hi"})
                run = started.json()
                events = await client.get(run["events_url"])
            err += await _read_until(proc.stderr, b"failed: provider", limit=30)
            proc.send_signal(signal.SIGINT)
            _, rest = await trio.to_thread.run_sync(proc.communicate)
        finally:
            proc.kill()
            proc.wait()
    output = (err + rest).decode()
    assert started.status_code == 201
    assert '"status":"error"' in events.text
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    failed = [r for r in records if r["level"] == "warning" and r.get("run_id") == run["run_id"]]
    assert len(failed) == 1
    assert "authentication failed (401)" in failed[0]["message"]
    assert failed[0]["cause"].startswith("authentication failed (401)")
    ends = [r for r in records if r.get("outcome") and r["level"] == "info"]
    assert [(e["run_id"], e["outcome"], e["requests"]) for e in ends] == [
        (run["run_id"], "init_failed", 1)
    ]
    access = [r for r in records if r["logger"] == "rillet.transports.server.access"]
    assert ("POST", "/v1/runs", 201) in {(a["method"], a["path"], a["status"]) for a in access}
    assert PROVIDER_KEY not in output
    assert run["token"] not in output
    assert "Traceback" not in output


async def test_a_long_path_is_logged_cut_and_a_refusal_with_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving() as served:
            missing = await served.client.get("/" + "x" * 1000 + "?token=secret-in-query")
    assert missing.status_code == 404
    access = _fields(caplog, "rillet.transports.server.access")
    assert len(access) == 1
    assert access[0]["status"] == 404
    assert access[0]["path"] == "/" + "x" * 199 + "…"
    # the status line, the headers and the body were counted, not the body alone
    assert len(missing.content) < int(str(access[0]["bytes"])) < len(missing.content) + 400
    assert "secret-in-query" not in "\n".join(r.getMessage() for r in caplog.records)


async def test_a_run_cancelled_while_queued_ends_cancelled_without_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rillet")
    with trio.fail_after(10):
        async with serving([Reply(stall_headers=True)], limits=Limits(max_streams=1)) as served:
            await served.start()
            queued = await served.start()
            await served.loopback.wait_for_requests(1)
            headers = {"authorization": f"Bearer {queued['act_token']}"}
            cancel = await served.client.delete(f"/v1/runs/{queued['run_id']}", headers=headers)
            samples = await scrape_until(
                served, lambda s: value(s, "rillet_runs_total", outcome="cancelled") == 1
            )
    assert cancel.status_code == 202
    assert value(samples, "rillet_runs_queued") == 0
    assert value(samples, "rillet_runs_active") == 1  # the first still holds its slot
    assert len(served.loopback.requests) == 1
    ends = [r for r in _fields(caplog, "rillet.transports.server") if "outcome" in r]
    assert [(e["run_id"], e["outcome"], e["requests"]) for e in ends] == [
        (queued["run_id"], "cancelled", 0)
    ]


async def test_the_compatible_endpoints_refuse_what_max_cost_cannot_pay_for_with_402() -> None:
    """OpenAI's and Anthropic's endpoints say it in their own shapes: 402, the code, a sentence,
    nothing sent upstream, and no retry invited."""
    from rillet import Price

    question = {"role": "user", "content": "a question " * 50}
    with trio.fail_after(10):
        async with serving(prices=Price(input=100, output=100), max_cost="0.0001") as served:
            chat = await served.client.post(
                "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [question]}
            )
            messages = await served.client.post(
                "/v1/messages",
                json={"model": "gpt-4o-mini", "max_tokens": 100, "messages": [question]},
            )
            assert served.loopback.requests == []
    assert chat.status_code == 402
    error = chat.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "max_cost")
    assert "left to spend" in error["message"]
    assert chat.headers["x-should-retry"] == "false"
    assert messages.status_code == 402
    assert "left to spend" in messages.json()["error"]["message"]
