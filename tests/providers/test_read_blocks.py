"""The commonest reads decoded in one step decode exactly what frame by frame decoding does.

Three dialects take a whole read at once: an Ollama read of whole NDJSON lines that are all
more text (`OllamaDialect`'s `feed_block`, one msgspec call for the block), a Chat Completions read
whose chunks are all more text, all more reasoning or all more of one call's arguments
(`field_run`, `arguments_run`: no check per chunk) and a Gemini read whose chunks
are all more of the open text or thinking lane (`_fragments`). Each is typed so that only
what the frame-by-frame path would read as more of the same lane passes; anything else falls
back to that path.
Here a stream of text has one odd frame put among its text frames, at several places, and is
read at several read sizes, once as the wire decoder drives it and once with the fast paths
and `feed_frames` hidden (every frame through `feed`): the UniEvents, and the error with its
frame, must be the same.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest
from rillet import RilletError
from rillet.frames import SSEDecoder
from rillet.lowlevel import WireDecoder
from rillet.providers import dialect_from_name

READ_SIZES = (1, 5, 37, 200, 1 << 20)


def _decode(dialect: Any, data: bytes, sizes: list[int], fast: bool) -> tuple[list[Any], str]:
    decoder = WireDecoder(dialect, clock=lambda: 0)
    if not fast:
        decoder._many = None
        decoder._lines = None
        if isinstance(decoder._framer, SSEDecoder):
            decoder._framer.raw = False
    out: list[Any] = []
    at = 0
    try:
        i = 0
        while at < len(data):
            size = sizes[i % len(sizes)]
            decoder.feed(data[at : at + size], out)
            at += size
            i += 1
        decoder.close(out)
    except RilletError as exc:
        return out, f"{type(exc).__name__}: {exc} @{getattr(exc, 'frame_index', None)}"
    return out, "complete"


def _fed(dialect_name: str, data: bytes, size: int = 400) -> WireDecoder:
    """A wire decoder fed `data` in reads of `size` bytes, then closed."""
    decoder = WireDecoder(dialect_from_name(dialect_name), clock=lambda: 0)
    out: list[Any] = []
    for at in range(0, len(data), size):
        decoder.feed(data[at : at + size], out)
    decoder.close(out)
    return decoder


def _taken(monkeypatch: pytest.MonkeyPatch, where: str) -> list[object]:
    """What the fast path at `where` (`module:name`, or `module:Class.name`) took, one entry a
    read: the tests of reads decoded alike would pass too if it never took one."""
    module, _, name = where.partition(":")
    owner: Any = importlib.import_module(module)
    *path, attribute = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, attribute)
    taken: list[object] = []

    def counted(*args: Any) -> Any:
        result = real(*args)
        if result:
            taken.append(result)
        return result

    monkeypatch.setattr(owner, attribute, counted)
    return taken


def _check(dialect_name: str, data: bytes) -> None:
    dialect = dialect_from_name(dialect_name)
    rng = random.Random(data)
    cuts = [[size] for size in READ_SIZES] + [
        [rng.randrange(1, 400) for _ in range(50)] for _ in range(3)
    ]
    for sizes in cuts:
        fast = _decode(dialect, data, sizes, fast=True)
        slow = _decode(dialect, data, sizes, fast=False)
        assert fast == slow, f"reads of {sizes[:5]}..."


# --- Ollama: whole NDJSON lines ---------------------------------------------------------------

_OLLAMA_TEXT = [
    b'{"model":"m","created_at":"t","message":{"role":"assistant","content":"w%d "},'
    b'"done":false}' % i
    for i in range(40)
]
_OLLAMA_END = (
    b'{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,'
    b'"done_reason":"stop","prompt_eval_count":3,"eval_count":40}'
)
_OLLAMA_ODD = {
    "two values on a line": b'{"message":{"content":"a"}},{"message":{"content":"b"}}',
    "leading spaces": b'   {"message":{"content":"spaced"}}',
    "a blank line": b"",
    "white space only": b"  \t ",
    "null thinking": b'{"message":{"content":"x","thinking":null}}',
    "thinking too": b'{"message":{"content":"x","thinking":"hmm"}}',
    "a thinking fragment": b'{"message":{"content":"","thinking":"let me see"}}',
    "empty tool calls": b'{"message":{"content":"x","tool_calls":[]}}',
    "a tool call": b'{"message":{"content":"","tool_calls":[{"function":{"name":"f",'
    b'"arguments":{"a":1}}}]}}',
    "a count of the wrong type": b'{"message":{"content":"x"},"eval_count":"many"}',
    "a null error": b'{"message":{"content":"x"},"error":null}',
    "an error": b'{"message":{"content":"x"},"error":"the runner crashed"}',
    "a null done": b'{"message":{"content":"x"},"done":null}',
    "done early": b'{"message":{"content":"x"},"done":true,"done_reason":"length"}',
    "empty content": b'{"message":{"content":""}}',
    "no message": b'{"done":false}',
    "a null message": b'{"message":null}',
    "not UTF-8": b'{"message":{"content":"caf\xc3"}}',
    "not UTF-8 where nothing is read": b'{"model":"m\xff","message":{"content":"x"}}',
    "not UTF-8 in a field of no name known": b'{"message":{"content":"x"},"node":"n\xff"}',
    "a CR before its LF": b'{"message":{"content":"cr"}}\r',
    "an array": b"[1, 2]",
    "trailing bytes": b'{"message":{"content":"x"}} tail',
    "not JSON": b'{"message":{"content":"x"',
    "a long line": b'{"message":{"content":"' + b"z" * 5000 + b'"}}',
}


_OLLAMA_UTF8 = [line.replace(b' "},', ' café \U0001f44b "},'.encode()) for line in _OLLAMA_TEXT]


@pytest.mark.parametrize("odd", sorted(_OLLAMA_ODD))
@pytest.mark.parametrize("text", ["ASCII", "UTF-8"])
def test_ollama_blocks_read_what_lines_read(odd: str, text: str) -> None:
    # (a block of ASCII bytes is UTF-8 whatever is read of it; any other, only if all is read)
    base = _OLLAMA_TEXT if text == "ASCII" else _OLLAMA_UTF8
    for at in (1, 2, 20, 39):
        lines = [*base[:at], _OLLAMA_ODD[odd], *base[at:], _OLLAMA_END]
        _check("ollama-chat", b"\n".join(lines) + b"\n")


def test_ollama_plain_text_takes_one_call_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _taken(monkeypatch, "rillet.providers._ollama:_StreamDecoder.feed_block")
    data = b"\n".join([*_OLLAMA_TEXT, _OLLAMA_END]) + b"\n"
    assert _fed("ollama-chat", data, 300).grammar.stopped
    assert len(taken) >= len(data) // 300 - 2


# --- Chat Completions: reads of nothing but more text --------------------------------------------

_CHAT_START = b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}'
_CHAT_TEXT = [
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"w%d "},"finish_reason":null}]}' % i
    for i in range(40)
]
_CHAT_END = [
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":40}}',
    b"data: [DONE]",
]


def _chunk(body: bytes) -> bytes:
    return b'data: {"id":"c1",' + body + b"}"


_CHAT_ODD = {
    "an error object": _chunk(
        b'"object":"error","message":"bad","choices":[{"delta":{"content":"x"}}]'
    ),
    "an empty finish reason": _chunk(
        b'"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":""}]'
    ),
    "choice 1": _chunk(b'"choices":[{"index":1,"delta":{"content":"x"}}]'),
    "a null index": _chunk(b'"choices":[{"index":null,"delta":{"content":"x"}}]'),
    "two choices": _chunk(
        b'"choices":[{"delta":{"content":"x"}},{"index":1,"delta":{"content":"y"}}]'
    ),
    "usage": _chunk(b'"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}'),
    "a false error": _chunk(b'"choices":[{"delta":{"content":"x"}}],"error":false'),
    "an error": _chunk(b'"choices":[{"delta":{"content":"x"}}],"error":{"message":"boom"}'),
    "empty content": _chunk(b'"choices":[{"delta":{"content":""}}]'),
    "a null delta": _chunk(b'"choices":[{"delta":null}]'),
    "no choices": _chunk(b'"choices":[]'),
    "content as a list": _chunk(b'"choices":[{"delta":{"content":[{"type":"text","text":"x"}]}}]'),
    "a null reasoning": _chunk(b'"choices":[{"delta":{"content":"x","reasoning":null}}]'),
    "reasoning content": _chunk(b'"choices":[{"delta":{"content":"x","reasoning_content":"r"}}]'),
    "a whole message beside": _chunk(
        b'"choices":[{"delta":{"content":"x"},"message":{"content":"whole"}}]'
    ),
    "x_groq": _chunk(b'"choices":[{"delta":{"content":"x"}}],"x_groq":{"id":"q"}'),
    "base_resp": _chunk(b'"choices":[{"delta":{"content":"x"}}],"base_resp":{"status_code":0}'),
    "a tool call": _chunk(
        b'"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t1",'
        b'"function":{"name":"f","arguments":"{}"}}]}}]'
    ),
    "an index of the wrong type": _chunk(b'"choices":[{"index":"0","delta":{"content":"x"}}]'),
    "a named error event": b'event: error\ndata: {"code":400,"details":"no"}',
    "a named event": b'event: delta\ndata: {"choices":[{"delta":{"content":"x"}}]}',
    "[DONE] early": b"data: [DONE]",
    "a comment": b": keep-alive",
    "an id line": b'id: 7\ndata: {"choices":[{"delta":{"content":"x"}}]}',
    "two data lines": b'data: {"choices":[{"delta":\ndata: {"content":"x"}}]}',
    "not UTF-8": _chunk(b'"choices":[{"delta":{"content":"caf\xc3"}}]'),
    "not JSON": b'data: {"choices":[',
    "two values": b'data: {"choices":[{"delta":{"content":"a"}}]},{"choices":[]}',
    "no space after the colon": b'data:{"choices":[{"delta":{"content":"x"}}]}',
}


@pytest.mark.parametrize("odd", sorted(_CHAT_ODD))
def test_chat_text_reads_read_what_chunks_read(odd: str) -> None:
    for at in (1, 2, 20, 39):
        frames = [_CHAT_START, *_CHAT_TEXT[:at], _CHAT_ODD[odd], *_CHAT_TEXT[at:], *_CHAT_END]
        _check("openai-chat", b"\n\n".join(frames) + b"\n\n")


def test_chat_text_reads_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _taken(monkeypatch, "rillet.providers._openai_chat._stream:field_run")
    data = b"\n\n".join([_CHAT_START, *_CHAT_TEXT, *_CHAT_END]) + b"\n\n"
    assert _fed("openai-chat", data).grammar.stopped
    assert len(taken) >= len(data) // 400 - 3


def _call(delta: bytes, rest: bytes = b"") -> bytes:
    return _chunk(b'"choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]' + rest)


def _fragment(arguments: bytes, index: bytes = b"0", more: bytes = b"") -> bytes:
    return _call(
        b'{"tool_calls":[{"index":'
        + index
        + more
        + b',"function":{"arguments":"'
        + arguments
        + b'"}}]}'
    )


_CALL_START = _call(
    b'{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1",'
    b'"type":"function","function":{"name":"lookup","arguments":""}}]}'
)
_CALL_FRAGMENTS = [_fragment(b'{\\"q\\": \\"' if i == 0 else b"w%d " % i) for i in range(40)]
_CALL_END = [
    _fragment(b'\\"}'),
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    b"data: [DONE]",
]
_CALL_ODD = {
    "another call": _call(
        b'{"tool_calls":[{"index":1,"id":"call_2","function":{"name":"f","arguments":""}}]}'
    ),
    "a fragment of another index": _fragment(b"x", b"1"),
    "the same id again": _fragment(b"x", b"0", b',"id":"call_1"'),
    "another id at the same index": _fragment(b"x", b"0", b',"id":"call_9"'),
    "a name again": _call(
        b'{"tool_calls":[{"index":0,"function":{"name":"lookup","arguments":"x"}}]}'
    ),
    "no function": _call(b'{"tool_calls":[{"index":0}]}'),
    "empty arguments": _fragment(b""),
    "arguments as an object": _call(
        b'{"tool_calls":[{"index":0,"function":{"arguments":{"a":1}}}]}'
    ),
    "no index": _call(b'{"tool_calls":[{"function":{"arguments":"x"}}]}'),
    "an index of the wrong type": _fragment(b"x", b'"0"'),
    "two calls in one delta": _call(
        b'{"tool_calls":[{"index":0,"function":{"arguments":"x"}},'
        b'{"index":0,"function":{"arguments":"y"}}]}'
    ),
    "empty content beside": _call(
        b'{"content":"","tool_calls":[{"index":0,"function":{"arguments":"x"}}]}'
    ),
    "text": _call(b'{"content":"some text"}'),
    "an error object": _chunk(
        b'"object":"error","choices":[{"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"x"}}]}}]'
    ),
    "an empty finish reason": _fragment(b"x").replace(
        b'"finish_reason":null', b'"finish_reason":""'
    ),
    "usage": _fragment(b"x").replace(b"null}]", b'null}],"usage":{"prompt_tokens":2}'),
    "[DONE] early": b"data: [DONE]",
}


@pytest.mark.parametrize("odd", sorted(_CALL_ODD))
def test_chat_argument_reads_read_what_chunks_read(odd: str) -> None:
    for at in (1, 2, 20, 39):
        frames = [
            _CHAT_START,
            _CALL_START,
            *_CALL_FRAGMENTS[:at],
            _CALL_ODD[odd],
            *_CALL_FRAGMENTS[at:],
            *_CALL_END,
        ]
        _check("openai-chat", b"\n\n".join(frames) + b"\n\n")


def test_chat_argument_reads_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _taken(monkeypatch, "rillet.providers._openai_chat._stream:arguments_run")
    frames = [_CHAT_START, _CALL_START, *_CALL_FRAGMENTS, *_CALL_END]
    data = b"\n\n".join(frames) + b"\n\n"
    assert _fed("openai-chat", data).grammar.stopped
    assert len(taken) >= len(data) // 400 - 3


def _thought(field: bytes, words: bytes, more: bytes = b"") -> bytes:
    return _call(b'{"' + field + b'":"' + words + b'"' + more + b"}")


_REASONING_ODD = {
    "text": _call(b'{"content":"now the answer"}'),
    "empty content beside": _thought(b"reasoning_content", b"x", b',"content":""'),
    "null content beside": _thought(b"reasoning_content", b"x", b',"content":null'),
    "text beside": _thought(b"reasoning_content", b"x", b',"content":"y"'),
    "both fields": _thought(b"reasoning_content", b"x", b',"reasoning":"x"'),
    "the other field": _thought(b"reasoning", b"x"),
    "an empty fragment": _thought(b"reasoning_content", b""),
    "details": _call(b'{"reasoning_details":[{"type":"reasoning.text","text":"d"}]}'),
    "a tool call": _CALL_START,
    "a refusal": _call(b'{"refusal":"no"}'),
    "an error object": _chunk(b'"object":"error","choices":[{"delta":{"reasoning_content":"x"}}]'),
    "a finish": _thought(b"reasoning_content", b"x").replace(
        b'"finish_reason":null', b'"finish_reason":"length"'
    ),
    "usage": _thought(b"reasoning_content", b"x").replace(
        b"null}]", b'null}],"usage":{"prompt_tokens":2}'
    ),
    "[DONE] early": b"data: [DONE]",
}


@pytest.mark.parametrize("odd", sorted(_REASONING_ODD))
@pytest.mark.parametrize("field", [b"reasoning_content", b"reasoning"])
def test_chat_reasoning_reads_read_what_chunks_read(odd: str, field: bytes) -> None:
    thoughts = [_thought(field, b"t%d " % i) for i in range(40)]
    for at in (1, 2, 20, 39):
        frames = [_CHAT_START, *thoughts[:at], _REASONING_ODD[odd], *thoughts[at:]]
        frames += [_CHAT_TEXT[0], *_CHAT_END]
        _check("openai-chat", b"\n\n".join(frames) + b"\n\n")


@pytest.mark.parametrize("field", [b"reasoning_content", b"reasoning"])
def test_chat_reasoning_reads_take_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, field: bytes
) -> None:
    taken = _taken(monkeypatch, "rillet.providers._openai_chat._stream:field_run")
    thoughts = [_thought(field, b"t%d " % i) for i in range(40)]
    data = b"\n\n".join([_CHAT_START, *thoughts, _CHAT_TEXT[0], *_CHAT_END]) + b"\n\n"
    assert _fed("openai-chat", data).grammar.stopped
    assert len(taken) >= 40 * len(thoughts[0]) // 400 - 3


# --- Gemini: reads of nothing but more of the open lane ------------------------------------------


def _gemini(part: bytes, rest: bytes = b"") -> bytes:
    return (
        b'data: {"candidates":[{"content":{"parts":[' + part + b'],"role":"model"},"index":0}],'
        b'"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":2},'
        b'"modelVersion":"g","responseId":"r1"' + rest + b"}"
    )


_GEMINI_TEXT = [_gemini(b'{"text":"w%d "}' % i) for i in range(40)]
_GEMINI_THOUGHTS = [_gemini(b'{"text":"t%d ","thought":true}' % i) for i in range(40)]
_GEMINI_END = _gemini(b'{"text":"."}').replace(b'"index":0', b'"index":0,"finishReason":"STOP"')
_GEMINI_ODD = {
    "a thought": _gemini(b'{"text":"hmm","thought":true}'),
    "text": _gemini(b'{"text":"plain"}'),
    "a signature": _gemini(b'{"text":"x","thoughtSignature":"c2ln"}'),
    "two parts": _gemini(b'{"text":"a"},{"text":"b"}'),
    "no parts": _gemini(b""),
    "empty text": _gemini(b'{"text":""}'),
    "null text": _gemini(b'{"text":null}'),
    "a null thought": _gemini(b'{"text":"x","thought":null}'),
    "a call": _gemini(b'{"functionCall":{"name":"f","args":{"a":1}}}'),
    "inline data": _gemini(b'{"inlineData":{"mimeType":"image/png","data":"iVBO"}}'),
    "a finish": _gemini(b'{"text":"x"}').replace(
        b'"index":0', b'"index":0,"finishReason":"MAX_TOKENS"'
    ),
    "an error": _gemini(b'{"text":"x"}', b',"error":{"code":500,"message":"boom"}'),
    "no usage": b'data: {"candidates":[{"content":{"parts":[{"text":"x"}]}}]}',
    "less usage": b'data: {"candidates":[{"content":{"parts":[{"text":"x"}]}}],'
    b'"usageMetadata":{"promptTokenCount":4}}',
    "no candidates": b'data: {"candidates":[],"usageMetadata":{"promptTokenCount":4}}',
    "a second candidate": _gemini(b'{"text":"x"}').replace(
        b'"index":0}]', b'"index":0},{"content":{"parts":[{"text":"y"}]},"index":1}]'
    ),
    "a count of the wrong type": _gemini(b'{"text":"x"}').replace(b":4,", b':"4",'),
    "not UTF-8": _gemini(b'{"text":"caf\xc3"}'),
    "a blocked prompt": b'data: {"promptFeedback":{"blockReason":"SAFETY"}}',
}


@pytest.mark.parametrize("odd", sorted(_GEMINI_ODD))
@pytest.mark.parametrize("crlf", [False, True], ids=["LF", "CRLF"])
def test_gemini_reads_read_what_chunks_read(odd: str, crlf: bool) -> None:
    for base in (_GEMINI_TEXT, _GEMINI_THOUGHTS):
        for at in (1, 2, 20, 39):
            frames = [*base[:at], _GEMINI_ODD[odd], *base[at:], _GEMINI_END]
            data = b"\n\n".join(frames) + b"\n\n"
            _check("gemini", data.replace(b"\n", b"\r\n") if crlf else data)


@pytest.mark.parametrize("base", ["text", "thinking"])
def test_gemini_reads_take_the_fast_path(monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    taken = _taken(monkeypatch, "rillet.providers._gemini._stream:GeminiStreamDecoder._fragments")
    chunks = _GEMINI_TEXT if base == "text" else _GEMINI_THOUGHTS
    data = b"\n\n".join([*chunks, _GEMINI_END]) + b"\n\n"
    assert _fed("gemini", data).grammar.stopped
    assert len(taken) >= len(data) // 400 - 3


def test_the_text_only_shapes_name_every_field_the_chunk_shapes_have() -> None:
    """A field added to a chunk's shape must be narrowed in its text-only shape as well: else
    the fast path would read a chunk carrying it as plain text, and lose it. (A text-only shape
    may read more fields: Ollama's reads every field a line may hold.)"""
    from rillet.providers import _ollama as ollama
    from rillet.providers._gemini import _stream as gemini
    from rillet.providers._openai_chat import _wire as chat

    pairs: list[tuple[Any, Any]] = [
        (chat._MoreText, chat.Delta),
        (chat._TextChoice, chat._Choice),
        (chat._TextChunk, chat.Frame),
        (ollama._MoreText, ollama._Message),
        (ollama._TextLine, ollama._Frame),
        (ollama._AsciiText, ollama._Message),
        (ollama._AsciiLine, ollama._Frame),
        (chat._MoreFunction, chat._Function),
        (chat._MoreCall, chat.ToolCall),
        (chat._MoreArguments, chat.Delta),
        (chat._ArgumentsChoice, chat._Choice),
        (chat._ArgumentsChunk, chat.Frame),
        (chat._MoreReasoningContent, chat.Delta),
        (chat._MoreReasoning, chat.Delta),
        (chat._ReasoningContentChoice, chat._Choice),
        (chat._ReasoningChoice, chat._Choice),
        (chat._ReasoningContentChunk, chat.Frame),
        (chat._ReasoningChunk, chat.Frame),
        (gemini._MorePart, gemini._Part),
        (gemini._MoreThought, gemini._Part),
        (gemini._MoreContent, gemini._Content),
        (gemini._ThoughtContent, gemini._Content),
        (gemini._MoreCandidate, gemini._Candidate),
        (gemini._ThoughtCandidate, gemini._Candidate),
        (gemini._MoreChunk, gemini.Chunk),
        (gemini._ThoughtChunk, gemini.Chunk),
    ]
    for narrow, wide in pairs:
        assert set(wide.__struct_fields__) <= set(narrow.__struct_fields__), narrow.__name__


_MIXES: dict[str, tuple[list[bytes], list[bytes], list[bytes], bytes]] = {
    # dialect: (its first frames, the common frames, the odd ones, how frames are joined)
    "ollama-chat": ([_OLLAMA_TEXT[0]], _OLLAMA_TEXT, list(_OLLAMA_ODD.values()), b"\n"),
    "openai-chat": (
        [_CHAT_START],
        _CHAT_TEXT + _CALL_FRAGMENTS[1:] + [_CALL_START],
        list(_CHAT_ODD.values()) + list(_CALL_ODD.values()),
        b"\n\n",
    ),
    "gemini": (
        [],
        _GEMINI_TEXT + _GEMINI_THOUGHTS,
        list(_GEMINI_ODD.values()),
        b"\n\n",
    ),
}


@pytest.mark.parametrize("dialect_name", sorted(_MIXES))
def test_mixed_streams_read_alike_either_way(dialect_name: str) -> None:
    """Streams of common frames with odd ones among them, several in a row at times, each ended
    as its dialect ends a reply (or not at all), read in random cuts."""
    first, common, odd, sep = _MIXES[dialect_name]
    ends = {"ollama-chat": [_OLLAMA_END], "openai-chat": _CHAT_END, "gemini": [_GEMINI_END]}
    rng = random.Random(dialect_name)
    for _ in range(60):
        frames = list(first)
        for _ in range(rng.randrange(5, 60)):
            pool = odd if rng.random() < 0.15 else common
            frames.append(rng.choice(pool))
        if rng.random() < 0.8:
            frames += ends[dialect_name]
        data = sep.join(frames) + sep
        if dialect_name == "gemini" and rng.random() < 0.5:
            data = data.replace(b"\n", b"\r\n")
        sizes = [rng.randrange(1, 700) for _ in range(40)]
        fast = _decode(dialect_from_name(dialect_name), data, sizes, fast=True)
        slow = _decode(dialect_from_name(dialect_name), data, sizes, fast=False)
        assert fast == slow, (frames, sizes[:5])
