"""Requests that cannot be sent as they are, or that a server answers in something other than
HTTP, fail at once, with a sentence that says why.

A key pasted with its line end, or read from a file with one, is taken without it. A key or an
extra header that still holds what no request header can carry (a line break inside, a control
or non-ASCII character) is refused when the provider is made, before any request. A request
httpx itself will not send (`LocalProtocolError`, `UnsupportedProtocol`) fails the same way on
every try: it costs one attempt, never five. So does a server whose reply is no HTTP at all (a
TLS port asked in plain HTTP answers with a TLS alert).
"""

from __future__ import annotations

import functools
import json

import httpx
import pytest
import trio
from rillet import ConfigurationError, Outcome, TurnRequest, run_turn, user
from rillet._core._explain import explain
from rillet.providers import OpenAIChatDialect, Provider, Secret
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

KEY = "sk-test-0123456789abcdef"
REQUEST = TurnRequest(messages=[user("Hi")])
JSON = "application/json"


@pytest.mark.parametrize("given", [KEY + "\n", KEY + "\r\n", f"  {KEY}\t", KEY])
async def test_a_key_is_sent_without_the_whitespace_around_it(given: str) -> None:
    reply = Reply(chunks=(openai_text_stream(["Hello"]),))
    async with open_loopback_provider([reply]) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(given))
        with trio.fail_after(10):
            result = await run_turn(REQUEST, provider)
    assert result.outcome is Outcome.COMPLETED
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("sk-abc\ndefghijklmnop", "at position 7: a line break"),
        ("sk-abcédefghijklmnop", "at position 7: not visible ASCII"),
        ("sk-abc defghijklmnop", "at position 7: a space"),
    ],
)
def test_a_key_no_header_can_carry_is_refused_before_any_request(key: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match=said) as caught:
        Provider(OpenAIChatDialect(), "http://127.0.0.1:9/v1", "m", api_key=Secret(key))
    assert "abc" not in str(caught.value)  # the key itself is never shown


def test_a_blank_key_is_no_key() -> None:
    provider = Provider(OpenAIChatDialect(), "http://127.0.0.1:9/v1", "m", api_key=Secret(" \n"))
    assert provider.api_key is None


@pytest.mark.parametrize(
    "headers",
    [{"x-team": "a\r\nx-evil: 1"}, {"x-team": "é"}, {"bad name": "v"}, {"x-team\n": "v"}],
)
def test_extra_headers_no_request_can_carry_are_refused(headers: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        Provider(OpenAIChatDialect(), "http://127.0.0.1:9/v1", "m", headers=headers)


async def test_a_request_httpx_will_not_send_costs_one_attempt() -> None:
    reply = Reply(chunks=(openai_text_stream(["Hello"]),))
    async with open_loopback_provider([reply] * 6) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        # a header of the caller's own client that h11 refuses to write
        async with httpx.AsyncClient(headers={"x-trace": "a\nb"}) as client:
            with trio.fail_after(10):
                result = await run_turn(REQUEST, provider, client=client)
    assert result.outcome is Outcome.INIT_FAILED
    assert result.requests == 1
    assert server.requests == []
    assert explain(result.error, provider).startswith("the request could not be sent as it is")


async def test_a_server_that_answers_in_tls_is_asked_once_and_the_scheme_is_named() -> None:
    """An `http://` URL for a TLS port: the server answers the plain request with a TLS alert
    record, the same every time."""
    asked: list[int] = []

    async def tls_port(stream: trio.SocketStream) -> None:
        asked.append(1)
        await stream.receive_some(65536)
        await stream.send_all(b"\x15\x03\x01\x00\x02\x02\x46")  # alert: protocol version
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, tls_port, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].socket.getsockname()[1]
        provider = Provider(
            OpenAIChatDialect(), f"http://127.0.0.1:{port}/v1", "m", api_key=Secret(KEY)
        )
        with trio.fail_after(10):
            result = await run_turn(REQUEST, provider)
        nursery.cancel_scope.cancel()
    assert (result.outcome, result.requests, len(asked)) == (Outcome.INIT_FAILED, 1, 1)
    assert explain(result.error, provider) == (
        f"the server at 127.0.0.1:{port} did not answer in HTTP — check the scheme"
        " (https:// for a TLS port?) and the port in --base-url"
    )


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_asked_once_never_followed_and_says_where_it_points(
    status: int,
) -> None:
    elsewhere = "https://api.example.com/v1/chat/completions"
    reply = Reply(status=status, headers=(("location", elsewhere),), chunks=(b"",))
    async with open_loopback_provider([reply] * 6) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        with trio.fail_after(10):
            result = await run_turn(REQUEST, provider)
    assert (result.outcome, result.requests, len(server.requests)) == (Outcome.INIT_FAILED, 1, 1)
    assert explain(result.error, provider) == (
        f"the server answered with a redirect ({status}) to {elsewhere} — put the address it"
        " names in --base-url (a redirect is never followed: the request carries the key)"
    )


@pytest.mark.parametrize("url", ["api.openai.com/v1", "htps://api.openai.com/v1"])
async def test_a_base_url_no_request_can_go_by_fails_once_saying_why(url: str) -> None:
    provider = Provider(OpenAIChatDialect(), url, "m", api_key=Secret(KEY))
    with trio.fail_after(10):
        result = await run_turn(REQUEST, provider)
    assert (result.outcome, result.requests) == (Outcome.INIT_FAILED, 1)
    assert explain(result.error, provider).startswith(
        "the base URL's scheme is not one HTTP speaks"
    )


def test_a_base_url_is_taken_without_the_whitespace_around_it() -> None:
    provider = Provider(OpenAIChatDialect(), " https://api.example.com/v1\n", "m")
    assert provider.base_url == "https://api.example.com/v1"


def _refusal(field: str, status: int = 400) -> Reply:
    """A compatible gateway refusing an optional field it does not know."""
    body = {
        "error": {
            "message": f"Unknown parameter: '{field}'.",
            "type": "invalid_request_error",
            "param": field,
            "code": "unknown_parameter",
        }
    }
    return Reply(
        status=status, chunks=(json.dumps(body).encode(),), content_type="application/json"
    )


@pytest.mark.parametrize(
    ("field", "sent"), [("stream_options", None), ("max_completion_tokens", "max_tokens")]
)
async def test_an_optional_field_a_server_refuses_is_left_out_from_then_on(
    field: str, sent: str | None
) -> None:
    ok = Reply(chunks=(openai_text_stream(["Hello"]),))
    request = TurnRequest(messages=[user("Hi")], max_tokens=50)
    async with open_loopback_provider([_refusal(field), ok, ok]) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        with trio.fail_after(10):
            first = await run_turn(request, provider)
            second = await run_turn(request, provider)  # the base URL's refusal is remembered
    bodies = [json.loads(r.body) for r in server.requests]
    assert (first.outcome, first.requests, first.text) == (Outcome.COMPLETED, 2, "Hello")
    assert (second.outcome, second.requests) == (Outcome.COMPLETED, 1)
    assert field in bodies[0]
    for body in bodies[1:]:
        assert field not in body
        if sent is not None:
            assert body[sent] == 50


async def test_a_refusal_of_something_else_is_still_asked_once() -> None:
    async with open_loopback_provider([_refusal("temperature")] * 3) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        with trio.fail_after(10):
            result = await run_turn(REQUEST, provider)
    assert (result.outcome, result.requests, len(server.requests)) == (Outcome.INIT_FAILED, 1, 1)


async def test_a_fastapi_refusal_is_read_for_the_field_it_names() -> None:
    detail = [{"type": "extra_forbidden", "loc": ["body", "stream_options"], "msg": "Extra inputs"}]
    refusal = Reply(
        status=422,
        chunks=(json.dumps({"detail": detail}).encode(),),
        content_type="application/json",
    )
    ok = Reply(chunks=(openai_text_stream(["Hello"]),))
    async with open_loopback_provider([refusal, ok]) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        with trio.fail_after(10):
            result = await run_turn(REQUEST, provider)
    assert (result.outcome, result.requests) == (Outcome.COMPLETED, 2)
    assert "stream_options" not in json.loads(server.requests[1].body)


async def test_a_turn_asked_not_to_stream_leaves_a_refused_field_out_too() -> None:
    ok = Reply(
        chunks=(
            json.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "Hello"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            ).encode(),
        ),
        content_type=JSON,
    )
    request = TurnRequest(messages=[user("Hi")], max_tokens=50)
    async with open_loopback_provider([_refusal("max_completion_tokens"), ok]) as server:
        provider = Provider(OpenAIChatDialect(), server.url, "m", api_key=Secret(KEY))
        with trio.fail_after(10):
            result = await run_turn(request, provider, stream=False)
    assert (result.outcome, result.requests, result.text) == (Outcome.COMPLETED, 2, "Hello")
    assert json.loads(server.requests[1].body)["max_tokens"] == 50
