"""The short way a reply's body is read (`BodyPath`: straight from httpcore's HTTP/1.1
connection) against httpx's own layers, on real sockets: the same bytes for every framing,
the same failures by name when the body is cut, the connection back in the pool after a
whole body; and a transport that reports each request's status (`ObservedTransport`, the
server's metrics) keeps the short way and reports as it would have."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from rillet._core._dialect import HttpRequest
from rillet._core._errors import UpstreamError
from rillet.transports.testing import Reply, open_loopback_provider
from rillet.transports.upstream import HttpUpstream, ObservedTransport
from rillet.transports.upstream._http import HttpExchange

if TYPE_CHECKING:
    from collections.abc import Callable

BODY = tuple(b'data: {"n": %d, "pad": "%s"}\n\n' % (i, b"x" * (i * 37 % 3000)) for i in range(200))


def _request(url: str) -> HttpRequest:
    return HttpRequest(url=f"{url}/v1/chat/completions", headers={}, body=b"{}")


async def _read(upstream: HttpUpstream, url: str, short: bool) -> tuple[bytes, str | None]:
    """The body as the exchange reads it, and the name of the failure that ended it."""
    exchange = await upstream.open(_request(url))
    assert isinstance(exchange, HttpExchange)
    assert (exchange._short is not None) is short
    body = bytearray()
    failed: str | None = None
    try:
        while chunk := await exchange.receive():
            body += chunk
    except UpstreamError as exc:
        failed = exc.kind
    except exchange.failures as exc:
        failed = exchange.failure(exc).kind
    finally:
        await exchange.aclose()
    return bytes(body), failed


def _both_ways(client: httpx.AsyncClient) -> dict[str, HttpUpstream]:
    long_way = HttpUpstream.wrapping(client)
    long_way._pool_path = None  # httpx's `send` and its layers, as for a client not plain
    return {"short": HttpUpstream.wrapping(client), "long": long_way}


@pytest.mark.parametrize(
    "reply",
    [
        Reply(chunks=BODY),  # chunked, one chunk per event
        Reply(chunks=(b"".join(BODY),)),  # chunked, one large chunk
        Reply(chunks=BODY, headers=(("content-length", str(sum(map(len, BODY)))),)),
    ],
    ids=["chunked", "one-chunk", "content-length"],
)
async def test_the_short_way_reads_the_bytes_httpx_reads(reply: Reply) -> None:
    with trio.fail_after(30):
        async with open_loopback_provider([reply, reply]) as server, httpx.AsyncClient() as client:
            read = {
                way: await _read(upstream, server.url, way == "short")
                for way, upstream in _both_ways(client).items()
            }
    assert read["short"] == read["long"] == (b"".join(BODY), None)


@pytest.mark.parametrize(
    "cut",
    [
        lambda: Reply(chunks=BODY, drop_after_bytes=5000),
        lambda: Reply(chunks=BODY, drop_after_bytes=5000, drop_with_reset=True),
    ],
    ids=["closed", "reset"],
)
async def test_a_body_cut_short_fails_by_the_name_httpx_gives_it(cut: Callable[[], Reply]) -> None:
    with trio.fail_after(30):
        async with (
            open_loopback_provider([cut(), cut()]) as server,
            httpx.AsyncClient() as client,
        ):
            read = {
                way: await _read(upstream, server.url, way == "short")
                for way, upstream in _both_ways(client).items()
            }
    short, long = read["short"], read["long"]
    assert short[1] is not None
    assert short[1] == long[1]
    assert short[0] == long[0]  # what came before the cut, the same


async def test_a_whole_body_read_the_short_way_gives_its_connection_back() -> None:
    reply = Reply(chunks=BODY)
    with trio.fail_after(30):
        async with open_loopback_provider([reply] * 3) as server, httpx.AsyncClient() as client:
            upstream = HttpUpstream.wrapping(client)
            for _ in range(3):
                assert (await _read(upstream, server.url, True))[1] is None
    assert len({request.connection for request in server.requests}) == 1  # one connection, reused


async def test_an_observed_transport_keeps_the_short_way_and_reports_every_status() -> None:
    seen: list[tuple[str, int | None]] = []
    script = [Reply(chunks=BODY), Reply(status=503, chunks=(b"busy",))]
    with trio.fail_after(30):
        async with open_loopback_provider(script) as server:
            transport = ObservedTransport(
                httpx.AsyncHTTPTransport(), lambda url, status: seen.append((url, status))
            )
            async with httpx.AsyncClient(transport=transport) as client:
                upstream = HttpUpstream.wrapping(client)
                assert (await _read(upstream, server.url, True))[1] is None
                exchange = await upstream.open(_request(server.url))
                assert exchange.status == 503
                await exchange.aclose()
                dead = httpx.AsyncClient(transport=transport)  # nobody listens there
                with pytest.raises(UpstreamError):
                    await HttpUpstream.wrapping(dead).open(_request("http://127.0.0.1:9"))
    url = f"{server.url}/v1/chat/completions"
    assert seen == [(url, 200), (url, 503), ("http://127.0.0.1:9/v1/chat/completions", None)]
