"""The delivery server's doors: who may read and start a run, what never leaks, and the page,
health and metrics (the harness: `server_support`).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from typing import TYPE_CHECKING

import msgspec
import pytest
import trio
import trio.testing
from rillet._core._dialect import Secret
from rillet._core._runevents import (
    AnswerDelta,
    RunDone,
)
from rillet._hub._hub import Hub, HubSink
from rillet.transports.server import Limits, ServerConfig, ServerConfigError, serve
from rillet.transports.testing import (
    status_reply,
)

from ..server_support import (
    PROVIDER_KEY,
    act,
    chat_provider,
    raw_exchange,
    read_sse,
    serving,
    text_reply,
)

if TYPE_CHECKING:
    from rillet._turn._turn import SinkBatch

# --- who may read and start -----------------------------------------------------------------------


async def test_another_runs_token_and_an_unknown_run_get_the_same_bytes() -> None:
    head = "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with trio.fail_after(5):
        async with serving() as served:
            mine, other = await served.start(), await served.start()
            wrong = f"/v1/runs/{mine['run_id']}/events?token={other['token']}"
            unknown = f"/v1/runs/{'ab' * 12}/events?token={other['token']}"
            nothing = f"/v1/runs/{mine['run_id']}/events"
            answers = [
                await raw_exchange(served.url, head.format(target).encode())
                for target in (wrong, unknown, nothing)
            ]
            bearer = await served.client.get(
                f"/v1/runs/{mine['run_id']}/events",
                headers={"authorization": f"Bearer {other['token']}"},
            )
    assert answers[0].startswith(b"HTTP/1.1 404 ")
    assert answers[0] == answers[1] == answers[2]
    assert bearer.status_code == 404
    assert bearer.content == answers[0].split(b"\r\n\r\n", 1)[1]


async def test_a_client_that_sends_the_server_key_everywhere_reads_its_run_by_its_token() -> None:
    """`Authorization: Bearer <server key>` on every request, the run named by `?token=`."""
    key = "server-key-0123456789"
    with trio.fail_after(10):
        async with serving(api_key=Secret(key)) as served:
            auth = {"authorization": f"Bearer {key}"}
            started = await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=auth)
            run = started.json()
            events = await served.client.get(run["events_url"], headers=auth)
            wrong = await served.client.get(
                f"/v1/runs/{run['run_id']}/events?token={'x' * 43}", headers=auth
            )
    assert started.status_code == 201
    assert events.status_code == 200
    assert '"type":"run.done"' in events.text
    assert wrong.status_code == 404  # the server key is not a run's token


async def test_a_run_started_without_a_host_header_names_the_address_it_reached() -> None:
    """HTTP/1.0 may send no `Host`: the run's URLs name the address and port the client reached
    (the server listens on port 0, any), and they work."""
    body = b'{"prompt": "Hi"}'
    head = b"POST /v1/runs HTTP/1.0\r\nContent-Type: application/json\r\n"
    with trio.fail_after(10):
        async with serving() as served:
            raw = await raw_exchange(
                served.url, head + b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            answer = msgspec.json.decode(raw.split(b"\r\n\r\n", 1)[1])
            events = await served.client.get(answer["events_url"])
    assert raw.startswith(b"HTTP/1.1 201 ")
    assert answer["events_url"].startswith(served.url + "/v1/runs/")
    assert answer["ws_url"].startswith(served.url.replace("http", "ws", 1) + "/v1/runs/")
    assert events.status_code == 200
    assert '"type":"run.done"' in events.text


async def test_without_the_server_key_401_and_no_run_starts() -> None:
    key = "server-key-0123456789"
    with trio.fail_after(5):
        async with serving(api_key=Secret(key)) as served:
            missing = await served.client.post("/v1/runs", json={"prompt": "Hi"})
            wrong = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"authorization": "Bearer nope"}
            )
            runs = served.hub.statistics()["runs"]
            requests = len(served.loopback.requests)
            right = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"authorization": f"Bearer {key}"}
            )
    assert missing.status_code == wrong.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["type"] == "unauthorized"
    assert runs == 0
    assert requests == 0
    assert right.status_code == 201


async def test_serving_off_loopback_without_a_key_is_refused_at_start() -> None:
    provider = chat_provider("http://127.0.0.1:9")
    with pytest.raises(ServerConfigError, match="server key"):
        await serve(ServerConfig(provider=provider, host="0.0.0.0", port=0))
    ServerConfig(provider=provider, host="0.0.0.0", api_key=Secret("k" * 16)).check()
    ServerConfig(provider=provider, host="::1").check()
    ServerConfig(provider=provider, host="localhost").check()


async def test_a_body_over_the_limit_is_413_and_starts_nothing() -> None:
    limits = Limits(max_body=1024)
    big = msgspec.json.encode({"prompt": "x" * 2000})
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = b"".join(b"%x\r\n%s\r\n" % (100, big[i : i + 100]) for i in range(0, 1500, 100))
    with trio.fail_after(5):
        async with serving(limits=limits) as served:
            declared = await served.client.post(
                "/v1/runs", content=big, headers={"content-type": "application/json"}
            )
            streamed = await raw_exchange(served.url, head + chunks)  # no end: cut off at 413
            runs = served.hub.statistics()["runs"]
    assert declared.status_code == 413
    assert declared.json()["error"]["type"] == "body_too_large"
    assert streamed.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in streamed.lower()
    assert runs == 0


async def test_subscribers_over_the_per_run_and_per_client_limits_get_429() -> None:
    script = [text_reply(headers_delay=0.3)]
    with trio.fail_after(5):
        for limits in (
            Limits(max_subscribers_per_run=2),
            Limits(max_subscribers_per_client=2),
        ):
            async with serving(script, limits=limits) as served:
                run = await served.start()
                async with (
                    served.client.stream("GET", run["events_url"]) as one,
                    served.client.stream("GET", run["events_url"]) as two,
                ):
                    assert one.status_code == two.status_code == 200
                    third = await served.client.get(run["events_url"])
                assert third.status_code == 429
                assert third.json()["error"]["type"] == "too_many_subscribers"
                again = await read_sse(served.client, run["events_url"])  # freed on close
                assert again.status == 200


async def test_a_request_head_not_finished_in_time_is_closed(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.02
    with trio.fail_after(60):
        async with serving() as served:
            host, port = served.url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            start = trio.current_time()
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert await stream.receive_some(1024) == b""  # closed, no answer
            waited = trio.current_time() - start
            await stream.aclose()
            healthy = await served.client.get("/healthz")
    assert waited == pytest.approx(10, abs=0.5)
    assert healthy.status_code == 200


async def test_unknown_routes_are_404_and_wrong_methods_405() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            unknown = await served.client.get("/nope")
            runs = await served.client.get("/v1/runs")
            stream = await served.client.get("/v1/stream")
            health = await served.client.post("/healthz", json={})
    assert unknown.status_code == 404
    assert runs.status_code == stream.status_code == health.status_code == 405
    assert runs.headers["allow"] == "POST"
    assert health.headers["allow"] == "GET, HEAD"


async def test_cross_site_requests_and_rebound_names_are_refused() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            other_site = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"origin": "https://evil.example"}
            )
            same_site = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"origin": served.url}
            )
            as_text = await served.client.post(
                "/v1/runs", content=b'{"prompt": "Hi"}', headers={"content-type": "text/plain"}
            )
            rebound = await served.client.get("/healthz", headers={"host": "evil.example"})
    assert other_site.status_code == 403
    assert same_site.status_code == 201
    assert as_text.status_code == 415  # a type a page may send cross-site without asking
    assert rebound.status_code == 403


async def test_keep_alive_answers_requests_in_turn_on_one_connection() -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with trio.fail_after(5):
        async with serving() as served:
            answer = await raw_exchange(served.url, request * 2 + last)
    assert answer.count(b"HTTP/1.1 200 ") == 3
    assert answer.count(b'{"status":"ok"}') == 3


async def test_a_run_can_be_cancelled_with_its_act_token() -> None:
    script = [text_reply([f"{n} " for n in range(200)], chunk_delay=0.01)]
    with trio.fail_after(5):
        async with serving(script) as served:
            run = await served.start()
            wrong = await served.client.delete(
                f"/v1/runs/{run['run_id']}", headers={"authorization": "Bearer nope"}
            )
            cancel = await served.client.delete(f"/v1/runs/{run['run_id']}", headers=act(run))
            stream = await read_sse(served.client, run["events_url"])
    assert wrong.status_code == 404
    assert cancel.status_code == 202
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("cancelled", "cancelled")


class SlowSink(HubSink):
    """A hub sink that takes its time: batches queue up on their way to it."""

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.sleep(0.005)
        await super().deliver(batch)


class SlowHub(Hub):
    def sink(self, run_id: str) -> HubSink:
        self.create(run_id)
        return SlowSink(self, run_id)


async def test_a_run_cancelled_with_batches_in_flight_still_ends_gapless_with_run_done() -> None:
    script = [text_reply([f"{n} " for n in range(400)], chunk_delay=0.001)]
    with trio.fail_after(5):
        async with serving(script, hub=SlowHub()) as served:
            run = await served.start()
            await served.wait_for(run["run_id"], 20)
            await served.client.delete(f"/v1/runs/{run['run_id']}", headers=act(run))
            stream = await read_sse(served.client, run["events_url"])
    assert stream.seqs == list(range(1, len(stream.seqs) + 1))
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert done.status == "cancelled"


# --- what never leaks -----------------------------------------------------------------------------


async def test_text_that_looks_like_sse_fields_arrives_as_one_exact_delta() -> None:
    sneaky = "x\n\nevent: admin\nid: 1\r\ndata: y\x00"
    with trio.fail_after(5):
        async with serving([text_reply([sneaky])]) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
    assert all(e.event == "message" for e in stream.events)
    assert [e.id for e in stream.events] == [f"{run['run_id']}:{n}" for n in stream.seqs]
    deltas = [e for e in stream.run_events if isinstance(e, AnswerDelta)]
    assert [d.delta for d in deltas] == [sneaky]


async def test_provider_keys_and_messages_never_reach_events_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leak = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    script = [status_reply(401, body=leak)]
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(5):
        async with serving(script, provider_key=PROVIDER_KEY) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
            sent = served.loopback.requests[0].headers["authorization"]
    assert sent == f"Bearer {PROVIDER_KEY}"  # the key was used...
    body = b"".join(e.data.encode() for e in stream.events)
    assert PROVIDER_KEY.encode() not in body  # ...and never came back
    assert b"Incorrect API key" not in body
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", "authentication_failed")
    assert PROVIDER_KEY not in caplog.text


# --- the page, health and metrics -----------------------------------------------------------------


async def test_the_page_is_served_with_a_policy_that_allows_only_its_own_script() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            page = await served.client.get("/")
            head = await served.client.head("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "EventSource" in page.text
    script = re.search(r"<script>(.*?)</script>", page.text, re.DOTALL)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    csp = page.headers["content-security-policy"]
    assert f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(page.content))


async def test_health_and_metrics() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            await read_sse(served.client, run["events_url"])
            health = await served.client.get("/healthz")
            metrics = (await served.client.get("/metrics.json")).json()
    assert health.json() == {"status": "ok"}
    assert metrics["runs_started"] == 1
    assert metrics["runs_active"] == 0
    assert metrics["subscribers"] == 0
    assert metrics["events_per_second"] > 0
    ttfe = metrics["time_to_first_event_ms"]
    assert ttfe["count"] == 1
    assert ttfe["p50"] is not None
    assert ttfe["p50"] <= ttfe["p95"] <= ttfe["p99"]
