"""The server fuzzer's cases (`test_server_fuzz`): a valid request to each route (`TEMPLATES`),
the mutations that spoil it (`MUTATIONS`, by stage: the JSON body, the body's bytes, the head's
fields, the body's framing, WebSocket frames after the handshake, the bytes on the wire), and
`make_case`, which draws case `n` of a seed from `Random(f"{seed}:{n}")`: the same bytes every
run, whatever ran before it.
"""

from __future__ import annotations

import base64
import json
import random
import re
import struct
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

KEY = "fuzz-server-key-0123456789abcdef"
MODEL = "gpt-4o-mini"
MAX_BODY = 64 * 1024  # the fuzzed server's body limit
_AUTO = b"\x00auto"  # a Content-Length computed when the request is encoded


# --- requests -------------------------------------------------------------------------------------


@attrs.define
class Draft:
    """One request being built: mutations change its parts, `encode` makes its bytes."""

    method: bytes
    target: bytes
    headers: list[list[bytes]]
    doc: Any = None  # the JSON body, while it is one (encoded into `body` last)
    body: bytes = b""
    version: bytes = b"HTTP/1.1"
    chunks: list[bytes] | None = None  # a chunked body's raw framing, replacing `body`
    ws_key: bytes | None = None
    frames: list[bytes] = attrs.field(factory=list)  # WebSocket frames after the handshake

    def header(self, name: bytes) -> list[bytes] | None:
        return next((h for h in self.headers if h[0].lower() == name.lower()), None)

    def drop(self, name: bytes) -> None:
        self.headers = [h for h in self.headers if h[0].lower() != name.lower()]

    def encode(self) -> bytes:
        body = b"".join(self.chunks) if self.chunks is not None else self.body
        lines = [self.method + b" " + self.target + b" " + self.version]
        for name, value in self.headers:
            value = str(len(self.body)).encode() if value == _AUTO else value
            lines.append(name + b": " + value)
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


@attrs.define
class Case:
    """What one case sends, and how."""

    number: int
    route: str
    mutations: list[str]
    requests: list[Draft]
    wire: bytes  # every request, as sent
    pieces: list[int]  # the writes: sizes in order (the rest in one write)
    half_close: bool


@attrs.frozen
class Context:
    """What the templates fill in: the server's address and runs to name."""

    host: bytes
    runs: list[tuple[str, str]]  # (run_id, token) of finished runs
    live: list[tuple[str, str]]  # runs that never end (until the test cancels them)


def _auth() -> list[bytes]:
    return [b"Authorization", b"Bearer " + KEY.encode()]


def _get(ctx: Context, target: bytes, *, auth: bool = True) -> Draft:
    headers = [[b"Host", ctx.host], [b"User-Agent", b"fuzz/1"]]
    if auth:
        headers.append(_auth())
    return Draft(b"GET", target, headers)


def _post(ctx: Context, target: bytes, doc: Any) -> Draft:
    headers = [
        [b"Host", ctx.host],
        _auth(),
        [b"Content-Type", b"application/json"],
        [b"Content-Length", _AUTO],
    ]
    return Draft(b"POST", target, headers, doc=doc)


def _run(ctx: Context, rng: random.Random, *, live: bool = False) -> tuple[str, str]:
    return rng.choice(ctx.live if live else ctx.runs)


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": rng.choice(["Hi", "hello there", [{"type": "text", "text": "Hi"}]]),
        }
    ]


def t_healthz(ctx: Context, rng: random.Random) -> Draft:
    return _get(ctx, b"/healthz", auth=False)


def t_page(ctx: Context, rng: random.Random) -> Draft:
    return _get(ctx, rng.choice([b"/", b"/index.html", b"/favicon.ico"]), auth=False)


def t_metrics(ctx: Context, rng: random.Random) -> Draft:
    return _get(ctx, b"/metrics.json")


def t_models(ctx: Context, rng: random.Random) -> Draft:
    return _get(ctx, b"/v1/models")


def t_model(ctx: Context, rng: random.Random) -> Draft:
    return _get(ctx, b"/v1/models/" + rng.choice([MODEL, "anthropic/claude", "nope"]).encode())


def t_start_run(ctx: Context, rng: random.Random) -> Draft:
    if rng.random() < 0.5:
        return _post(ctx, b"/v1/runs", {"prompt": "Hi"})
    doc = {
        "messages": [{"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}],
        "model": MODEL,
        "max_tokens": 64,
        "temperature": 0.5,
        "system_prompt": "Be brief.",
    }
    return _post(ctx, b"/v1/runs", doc)


def _run_target(ctx: Context, rng: random.Random, tail: str, *, live: bool = False) -> bytes:
    run_id, token = _run(ctx, rng, live=live)
    query = f"?token={token}"
    if rng.random() < 0.3:
        query += f"&after={rng.randint(0, 8)}"
    return f"/v1/runs/{run_id}{tail}{query}".encode()


def t_events(ctx: Context, rng: random.Random) -> Draft:
    draft = _get(ctx, _run_target(ctx, rng, "/events"), auth=False)
    draft.headers.append([b"Accept", b"text/event-stream"])
    if rng.random() < 0.3:
        run_id = draft.target.split(b"/")[3]
        draft.headers.append([b"Last-Event-ID", run_id + b":%d" % rng.randint(0, 8)])
    return draft


def t_websocket(ctx: Context, rng: random.Random) -> Draft:
    draft = _get(ctx, _run_target(ctx, rng, "/ws", live=rng.random() < 0.7), auth=False)
    key = base64.b64encode(rng.randbytes(16))
    draft.headers += [
        [b"Upgrade", b"websocket"],
        [b"Connection", b"Upgrade"],
        [b"Sec-WebSocket-Key", key],
        [b"Sec-WebSocket-Version", b"13"],
        [b"Origin", b"http://" + ctx.host],
    ]
    draft.ws_key = key
    draft.frames = [client_frame(0x1, b'{"type":"ping"}')] if rng.random() < 0.5 else []
    return draft


def t_cancel(ctx: Context, rng: random.Random) -> Draft:
    # the server key acts on any run; the read token in the query alone does not
    draft = _get(ctx, _run_target(ctx, rng, ""))
    draft.method = b"DELETE"
    return draft


def t_approval(ctx: Context, rng: random.Random) -> Draft:
    run_id, token = _run(ctx, rng)
    draft = _post(ctx, f"/v1/runs/{run_id}/approvals/a1?token={token}".encode(), {"approve": True})
    draft.drop(b"Authorization")
    return draft


def t_chat(ctx: Context, rng: random.Random) -> Draft:
    doc: dict[str, Any] = {"model": MODEL, "messages": _messages(rng)}
    if rng.random() < 0.6:
        doc["stream"] = True
        if rng.random() < 0.5:
            doc["stream_options"] = {"include_usage": True}
    if rng.random() < 0.3:
        doc["tools"] = [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ]
    if rng.random() < 0.3:  # a turn after a tool call: the call, then its result
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        doc["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]
    return _post(ctx, b"/v1/chat/completions", doc)


def t_mmsp(ctx: Context, rng: random.Random) -> Draft:
    message = {"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}
    doc = {"model": MODEL, "messages": [message], "config": {"max_tokens": 32}}
    return _post(ctx, b"/v1/stream", doc)


def t_ui(ctx: Context, rng: random.Random) -> Draft:
    doc: dict[str, Any] = {
        "id": "chat-1",
        "trigger": "submit-message",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}],
    }
    if rng.random() < 0.4:  # a step with a tool the client ran, its output sent back
        tool: dict[str, Any] = {"type": "tool-f", "toolCallId": "c1", "state": "output-available"}
        tool |= {"input": {"q": 1}, "output": {"a": 2}}
        parts = [{"type": "step-start"}, {"type": "text", "text": "Looking."}, tool]
        doc["messages"].append({"id": "a1", "role": "assistant", "parts": parts})
    return _post(ctx, b"/v1/ui/chat", doc)


TEMPLATES: dict[str, Callable[[Context, random.Random], Draft]] = {
    "healthz": t_healthz,
    "page": t_page,
    "metrics": t_metrics,
    "models": t_models,
    "model": t_model,
    "start_run": t_start_run,
    "events": t_events,
    "websocket": t_websocket,
    "cancel": t_cancel,
    "approval": t_approval,
    "chat": t_chat,
    "mmsp": t_mmsp,
    "ui": t_ui,
}


# --- mutations ------------------------------------------------------------------------------------

_SENTINELS = {  # JSON no Python value encodes to, written in after `json.dumps`
    "\x00deep": "[" * 100_000 + "]" * 100_000,
    "\x00bigint": "9" * 5000,
    "\x00nan": "NaN",
    "\x00surrogate": '"\\ud800"',
    "\x00deep_string": '"' + "[" * 100_000 + "]" * 100_000 + '"',  # JSON that is a string
}


def absurd(rng: random.Random) -> Any:
    """A value no field expects."""
    return rng.choice(
        [
            "",
            "x" * rng.choice([1, 81, 300, 5000]),
            -1,
            0,
            2**63,
            -(2**63) - 1,
            10**30,
            1.5,
            1e308,
            True,
            None,
            [],
            {},
            [None],
            {"type": None},
            "\u0000\u0001",
            "☃" * 90,
            [0] * rng.choice([3, 20_000]),
            [{"role": "user", "content": None}] * 50,
            *_SENTINELS,
        ]
    )


_FIELDS = [
    "prompt",
    "messages",
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "tools",
    "tool_choice",
    "thinking_level",
    "config",
    "n",
    "reasoning_effort",
    "system",
    "system_prompt",
    "maxOutputTokens",
    "thinkingLevel",
    "toolChoice",
    "parts",
    "role",
    "content",
    "content_items",
    "approve",
    "reason",
    "id",
    "trigger",
    "type",
    "text",
]


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (the root's is `()`)."""
    out = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _nodes(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _nodes(value, (*path, index))
    return out


def _replace(draft: Draft, path: tuple[Any, ...], value: Any) -> None:
    if not path:
        draft.doc = value
        return
    parent = draft.doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value


def _container(draft: Draft, rng: random.Random, kind: type) -> Any:
    found = [p for p in _nodes(draft.doc) if isinstance(_at(draft.doc, p), kind)]
    return _at(draft.doc, rng.choice(found)) if found else None


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def j_wrong_type(draft: Draft, rng: random.Random) -> None:
    _replace(draft, rng.choice(_nodes(draft.doc)), absurd(rng))


def j_drop_key(draft: Draft, rng: random.Random) -> None:
    target = _container(draft, rng, dict)
    if target:
        del target[rng.choice(list(target))]


def j_add_key(draft: Draft, rng: random.Random) -> None:
    target = _container(draft, rng, dict)
    if target is not None:
        target[rng.choice([*_FIELDS, "unknown", "x" * 200])] = absurd(rng)


def j_content(draft: Draft, rng: random.Random) -> None:
    """A message's content (or parts, or items) of a wrong type or shape."""
    keys = ("content", "parts", "content_items", "text", "role")
    found = [p for p in _nodes(draft.doc) if p and p[-1] in keys]
    if found:
        value = rng.choice(
            [
                absurd(rng),
                [absurd(rng)],
                [{"type": absurd(rng)}],
                [{"type": "text", "text": absurd(rng)}],
            ]
        )
        _replace(draft, rng.choice(found), value)


def j_list_root(draft: Draft, rng: random.Random) -> None:
    draft.doc = rng.choice([[draft.doc], absurd(rng), {"body": draft.doc}])


def _encode_doc(draft: Draft, rng: random.Random) -> None:
    if draft.doc is None and not draft.body:
        return
    text = json.dumps(draft.doc, ensure_ascii=rng.random() < 0.5)
    for sentinel, raw in _SENTINELS.items():
        text = text.replace(json.dumps(sentinel), raw)
    draft.body = text.encode("utf-8", "surrogatepass")


def b_truncate(draft: Draft, rng: random.Random) -> None:
    """The body cut short: declared whole (the rest never comes) or as cut."""
    cut = rng.randrange(len(draft.body) + 1)
    length = draft.header(b"content-length")
    if length is not None and length[1] == _AUTO and rng.random() < 0.5:
        length[1] = str(len(draft.body)).encode()
    draft.body = draft.body[:cut]


def b_oversize(draft: Draft, rng: random.Random) -> None:
    draft.body += b" " * (MAX_BODY + rng.choice([1, 4096]))


def b_not_json(draft: Draft, rng: random.Random) -> None:
    draft.body = rng.choice(
        [
            b"",
            b"null",
            b"[]",
            b'"s"',
            b"{",
            b"prompt=hi",
            b"\xff\xfe\x00",
            rng.randbytes(40),
            b'{"prompt": "hi"}}}',
            b'{"prompt": "\xc3\x28"}',
            b"{" * 3000,
            b"\xef\xbb\xbf{}",
        ]
    )


def h_drop(draft: Draft, rng: random.Random) -> None:
    names = [
        b"Host",
        b"Content-Length",
        b"Content-Type",
        b"Authorization",
        b"Origin",
        b"Upgrade",
        b"Sec-WebSocket-Key",
        b"Connection",
        b"Sec-WebSocket-Version",
    ]
    present = [n for n in names if draft.header(n) is not None]
    if present:
        draft.drop(rng.choice(present))


def h_duplicate(draft: Draft, rng: random.Random) -> None:
    if draft.headers:
        name, value = rng.choice(draft.headers)
        other = value if rng.random() < 0.5 else _absurd_value(rng)
        draft.headers.insert(rng.randrange(len(draft.headers) + 1), [name, other])


def _absurd_value(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"-1",
            b"99999999999999999999999",
            b"+5",
            b" 5 ",
            b"5, 5",
            b"0x10",
            b"\x00",
            b"",
            b"\xff\xfe\x80",
            b"x" * rng.choice([100, 8000, 20_000]),
            b"\t",
            "ünï☃".encode(),
            b"chunked",
            b"Bearer",
            b"Bearer " + b"x" * 100,
            b"Basic YTpi",
            b"websocket",
            b"close",
            b"Upgrade, keep-alive",
            b"100-continue",
            b"application/json; charset=latin-1",
            b"text/plain",
            b"*/*",
            b"null",
            b"http://evil.example",
            b"a" * 24,
        ]
    )


def h_absurd(draft: Draft, rng: random.Random) -> None:
    names = [
        b"Host",
        b"Content-Length",
        b"Content-Type",
        b"Authorization",
        b"Origin",
        b"Upgrade",
        b"Connection",
        b"Sec-WebSocket-Key",
        b"Sec-WebSocket-Version",
        b"Last-Event-ID",
        b"Expect",
        b"Transfer-Encoding",
        b"X-Rillet-Session",
        b"Accept",
    ]
    name = rng.choice([*names, *(h[0] for h in draft.headers)])
    value = _absurd_value(rng)
    existing = draft.header(name)
    if existing is not None:
        existing[1] = value
    else:
        draft.headers.append([name, value])


def h_auth(draft: Draft, rng: random.Random) -> None:
    draft.drop(b"Authorization")
    value = rng.choice(
        [
            None,
            b"Bearer wrong",
            b"bearer " + KEY.encode(),
            b"Bearer " + KEY.encode() + b"x",
            b"Bearer  " + KEY.encode() + b" ",
            b"Token " + KEY.encode(),
            b"Bearer " + KEY[:-1].encode(),
        ]
    )
    if value is not None:
        draft.headers.append([b"Authorization", value])


def h_method(draft: Draft, rng: random.Random) -> None:
    draft.method = rng.choice(
        [
            *b"PUT PATCH OPTIONS TRACE CONNECT HEAD GET POST DELETE get XYZ".split(),
            b"G\x00T",
            b"M" * 300,
            b"",
            b"GET GET",
        ]
    )


def h_target(draft: Draft, rng: random.Random) -> None:
    path, _, query = draft.target.partition(b"?")
    draft.target = rng.choice(
        [
            path + b"/",
            path + b"?" + query + b"&token=&after=-1&after=x",
            path + b"%00",
            path.upper(),
            b"//" + path,
            path + b"/../..",
            b"*",
            b"http://evil.example" + path,
            b"http://127.0.0.1" + path,
            path + b"?" + b"a=" * 4000,
            path + "/é".encode(),
            path + b"#frag",
            b"",
            b"/v1/runs/" + b"f" * 300 + b"/events",
            path + b"?after=1.5",
            path + b"?" + query + b"&after=99999999999999999999",
            b"/v1/models/" + b"%2F" * 50,
        ]
    )


def h_version(draft: Draft, rng: random.Random) -> None:
    draft.version = rng.choice(
        [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"http/1.1", b"HTTP/9.9", b"HTTP/1"]
    )
    if draft.version == b"HTTP/1.0" and rng.random() < 0.5:
        draft.drop(b"Host")


def h_origin(draft: Draft, rng: random.Random) -> None:
    draft.drop(b"Origin")
    draft.headers.append(
        [
            b"Origin",
            rng.choice(
                [
                    b"http://evil.example",
                    b"null",
                    b"http://[::1",
                    b"http://127.0.0.1:99999",
                    b"https://127.0.0.1",
                    b"ws://x",
                    b"%",
                    b"http://localhost",
                ]
            ),
        ]
    )


def h_host(draft: Draft, rng: random.Random) -> None:
    host = draft.header(b"host")
    value = rng.choice(
        [
            b"evil.example",
            b"127.0.0.1:99999",
            b"[::1]",
            b"",
            b"a b",
            b"127.0.0.1:",
            b"localhost",
            b"127.0.0.1:80:80",
            b"[::1",
            b"127.0.0.1\x00.evil",
        ]
    )
    if host is None:
        draft.headers.append([b"Host", value])
    else:
        host[1] = value


def h_expect(draft: Draft, rng: random.Random) -> None:
    draft.headers.append([b"Expect", rng.choice([b"100-continue", b"200-ok", b"100-Continue"])])


def h_transfer_encoding(draft: Draft, rng: random.Random) -> None:
    if rng.random() < 0.5:
        draft.drop(b"Content-Length")
    value = rng.choice(
        [b"gzip", b"chunked, chunked", b"identity", b" chunked", b"xchunked", b"gzip, chunked"]
    )
    draft.headers.append([b"Transfer-Encoding", value])


def h_many_headers(draft: Draft, rng: random.Random) -> None:
    if rng.random() < 0.5:
        draft.headers += [[b"X-F%d" % n, b"v" * 60] for n in range(rng.choice([50, 300]))]
    else:
        draft.headers.append([b"X-Long", b"y" * rng.choice([15_000, 17_000, 70_000])])


def f_chunked(draft: Draft, rng: random.Random) -> None:
    """The body in chunks, framed well or not."""
    draft.drop(b"Content-Length")
    if rng.random() < 0.2:  # both: refused (S22)
        draft.headers.append([b"Content-Length", str(len(draft.body)).encode()])
    draft.headers.append([b"Transfer-Encoding", b"chunked"])
    chunks, body = [], draft.body
    while body:
        size = rng.choice([1, 2, 7, 64, 1000, 1 << 16])
        piece, body = body[:size], body[size:]
        chunks.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    chunks.append(b"0\r\n\r\n")
    flaw = rng.choice(
        [
            "none",
            "none",
            "ext",
            "bad_hex",
            "no_end",
            "trailer",
            "too_big",
            "negative",
            "upper",
            "zeros",
            "bare_lf",
            "space",
            "empty_chunks",
        ]
    )
    at = rng.randrange(len(chunks))
    if flaw == "ext":
        chunks[at] = chunks[at].replace(b"\r\n", b";x=" + b"e" * rng.choice([3, 5000]) + b"\r\n", 1)
    elif flaw == "bad_hex":
        chunks[at] = b"zz" + chunks[at]
    elif flaw == "no_end":
        chunks.pop()
    elif flaw == "trailer":
        chunks[-1] = b"0\r\nX-Trailer: " + b"t" * rng.choice([4, 20_000]) + b"\r\n\r\n"
    elif flaw == "too_big":
        chunks[at] = (
            b"ffffffffffffffff"
            + chunks[at].partition(b"\r\n")[1]
            + chunks[at].partition(b"\r\n")[2]
        )
    elif flaw == "negative":
        chunks[at] = b"-" + chunks[at]
    elif flaw == "upper":
        chunks[at] = chunks[at].upper()
    elif flaw == "zeros":
        chunks[at] = b"0000000" + chunks[at]
    elif flaw == "bare_lf":
        chunks[at] = chunks[at].replace(b"\r\n", b"\n")
    elif flaw == "space":
        chunks[at] = b" " + chunks[at]
    elif flaw == "empty_chunks":
        chunks[at:at] = [b"0;x\r\n"] * 3
    draft.chunks = chunks


JSON_MUTATIONS = [
    j_wrong_type,
    j_wrong_type,
    j_drop_key,
    j_add_key,
    j_content,
    j_content,
    j_list_root,
]
BODY_MUTATIONS = [b_truncate, b_oversize, b_not_json]
HEAD_MUTATIONS = [
    h_drop,
    h_duplicate,
    h_absurd,
    h_absurd,
    h_auth,
    h_auth,
    h_method,
    h_target,
    h_version,
    h_origin,
    h_host,
    h_expect,
    h_transfer_encoding,
    h_many_headers,
]
FRAMING_MUTATIONS = [f_chunked]


# --- WebSocket frames -----------------------------------------------------------------------------


def client_frame(
    opcode: int,
    payload: bytes,
    *,
    fin: bool = True,
    rsv: int = 0,
    mask: bytes | None = b"\x01\x02\x03\x04",
    declared: int | None = None,
) -> bytes:
    """One frame as a client sends it (masked unless `mask` is None); `declared` lies about its
    length."""
    size = len(payload) if declared is None else declared
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    bit = 0x80 if mask is not None else 0
    if size < 126:
        head += bytes([bit | size])
    elif size < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", size)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_frame(code: int, reason: bytes = b"") -> bytes:
    return client_frame(0x8, struct.pack("!H", code) + reason)


def w_frames(draft: Draft, rng: random.Random) -> None:
    """Random frames after the handshake."""
    makers: list[Callable[[], bytes | list[bytes]]] = [
        lambda: client_frame(0x1, b'{"type":"ping"}'),
        lambda: client_frame(0x1, b"not json"),
        lambda: client_frame(0x1, b"[" * 5000),
        lambda: client_frame(0x2, rng.randbytes(10)),
        lambda: client_frame(0x1, b"\xff\xfe\xc3\x28"),
        lambda: client_frame(rng.choice([3, 4, 5, 6, 7, 0xB, 0xC, 0xF]), b"x"),
        lambda: client_frame(0x1, b"{}", mask=None),
        lambda: client_frame(0x1, b"{}", rsv=rng.choice([1, 2, 4, 7])),
        lambda: client_frame(0x0, b"{}"),
        lambda: [client_frame(0x1, b'{"a":', fin=False), client_frame(0x0, b"1}")],
        lambda: [client_frame(0x1, b'{"a":', fin=False), client_frame(0x1, b"{}")],
        lambda: client_frame(0x9, b"p", fin=False),
        lambda: client_frame(0x9, b"p" * 126),
        lambda: client_frame(0xA, b""),
        lambda: close_frame(rng.choice([0, 999, 1004, 1005, 1006, 1015, 2999, 5000, 65535])),
        lambda: close_frame(1000, b"\xff\xfe"),
        lambda: client_frame(0x8, b"\x03"),
        lambda: client_frame(0x8, b"\x03\xe8" + b"r" * 124),
        lambda: client_frame(0x1, b"{}", declared=1 << 62),
        lambda: client_frame(0x1, b"{}", declared=300),
        lambda: client_frame(0x1, b"x" * 70_000),
        lambda: client_frame(0x1, b"{}" * 10)[: rng.randrange(1, 12)],
        lambda: rng.randbytes(rng.choice([1, 7, 64])),
        lambda: [client_frame(0x1, b"{}") for _ in range(60)],
        lambda: [client_frame(0x1, b"[", fin=False)] + [client_frame(0x0, b" ", fin=False)] * 200,
    ]
    for _ in range(rng.randint(1, 5)):
        made = rng.choice(makers)()
        draft.frames += made if isinstance(made, list) else [made]


# --- bytes on the wire ----------------------------------------------------------------------------


def _head_span(wire: bytes) -> int:
    end = wire.find(b"\r\n\r\n")
    return end if end > 0 else len(wire)


def w_flip(wire: bytes, rng: random.Random) -> bytes:
    data = bytearray(wire)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(_head_span(wire))
        data[at] ^= 1 << rng.randrange(8)
    return bytes(data)


def w_insert(wire: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(_head_span(wire) + 1)
    byte = rng.choice(
        [
            b"\r",
            b"\n",
            b"\x00",
            b" ",
            b":",
            b"\t",
            b"\x7f",
            b"\x80",
            b"\r\n",
            bytes([rng.randrange(256)]),
        ]
    )
    return wire[:at] + byte + wire[at:]


def w_delete(wire: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(_head_span(wire))
    return wire[:at] + wire[at + rng.randint(1, 3) :]


def w_bare_lf(wire: bytes, rng: random.Random) -> bytes:
    ends = [m.start() for m in re.finditer(rb"\r\n", wire[: _head_span(wire) + 2])]
    if not ends:
        return wire
    at = rng.choice(ends)
    return wire[:at] + wire[at + 1 :]


def w_fold(wire: bytes, rng: random.Random) -> bytes:
    at = wire.find(b"\r\n") + 2
    return wire[:at] + b"X-Folded: a\r\n " + b"b\r\n" + wire[at:]


def w_prefix(wire: bytes, rng: random.Random) -> bytes:
    return (
        rng.choice(
            [
                b"\r\n",
                b"\r\n\r\n",
                b"\n",
                b" ",
                b"\x16\x03\x01\x00\xa5",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            ]
        )
        + wire
    )


def w_junk(wire: bytes, rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice([1, 50, 300, 5000]))


WIRE_MUTATIONS = [w_flip, w_flip, w_insert, w_insert, w_delete, w_bare_lf, w_fold, w_prefix, w_junk]

MUTATIONS: dict[str, list[Any]] = {
    "json": JSON_MUTATIONS,
    "body": BODY_MUTATIONS,
    "head": HEAD_MUTATIONS,
    "framing": FRAMING_MUTATIONS,
    "ws": [w_frames],
    "wire": WIRE_MUTATIONS,
}
"""Each stage's mutations: a case draws a stage (by weight), then one of its mutations."""


# --- cases ----------------------------------------------------------------------------------------

_STAGES = ("json", "body", "head", "framing", "ws", "wire")


def _mutated(
    ctx: Context, rng: random.Random, route: str, count: int
) -> tuple[Draft, bytes, list[str]]:
    """A request to `route` with `count` mutations: the draft, its bytes, the mutations' names."""
    draft = TEMPLATES[route](ctx, rng)
    weights = {"head": 3, "wire": 1}
    if draft.doc is not None:
        weights |= {"json": 4, "body": 1, "framing": 1}
    if draft.ws_key is not None:
        weights |= {"ws": 6}
    stages = list(weights)
    picked = rng.choices(stages, [weights[stage] for stage in stages], k=count)
    chosen = sorted(
        ((stage, rng.choice(MUTATIONS[stage])) for stage in picked),
        key=lambda c: _STAGES.index(c[0]),
    )
    wire_steps = []
    encoded = False
    for stage, mutation in chosen:
        if stage in ("body", "head", "framing", "ws", "wire") and not encoded:
            _encode_doc(draft, rng)
            encoded = True
        if stage == "wire":
            wire_steps.append(mutation)
        else:
            mutation(draft, rng)
    if not encoded:
        _encode_doc(draft, rng)
    wire = draft.encode()
    for mutation in wire_steps:
        wire = mutation(wire, rng)
    return draft, wire, [m.__name__ for _, m in chosen]


def make_case(ctx: Context, seed: int, number: int) -> Case:
    """Case `number` of `seed`: the same bytes every run."""
    rng = random.Random(f"{seed}:{number}")
    route = rng.choice(sorted(TEMPLATES))
    draft, wire, names = _mutated(ctx, rng, route, rng.choice([0, 1, 1, 2, 2, 3]))
    requests = [draft]
    if draft.ws_key is None and rng.random() < 0.12:
        for _ in range(rng.randint(1, 2)):
            more, more_wire, more_names = _mutated(
                ctx, rng, rng.choice(sorted(TEMPLATES)), rng.choice([0, 1])
            )
            requests.append(more)
            wire += more_wire
            names += ["pipelined", *more_names]
    pieces: list[int] = []
    if rng.random() < 0.15:
        names.append("split")
        pieces = [rng.choice([1, 1, 2, 5, 17, 100]) for _ in range(rng.randint(2, 40))]
    half_close = rng.random() > 0.08
    if not half_close:
        names.append("kept_open")
    return Case(number, route, names, requests, wire, pieces, half_close)
