"""Streams kept for resuming: a served stream that runs apart from any connection, so a reader
that leaves (a reload, a dropped network) can come back for it.

Two wires keep them. The AI SDK's UI stream (`ServerConfig.ui_resume`): `useChat({ resume:
true })` asks `GET /v1/ui/chat/{id}/stream` after a reload and gets the chat's current stream
again from its first part, then what follows as it comes (the default transport replays,
`resumeStreamIsReplay`), or 204 when the chat has none. OpenAI's Responses API: a
`background: true` response is resumed at `GET /v1/responses/{id}?stream=true&starting_after=N`
from the event after the N-th (its chunks are its events, one each).

A kept stream's turn is the server's, its pump writes into a `KeptStream` (through
`ReplayConnection`, which stands in for the HTTP connection the pump would write to), and every
reader, the request that started it first, follows it. A
reader that leaves (a reload, a closed tab) leaves the run going; `DELETE
/v1/ui/chat/{id}/stream`, or a new message in the same chat, stops it. Only the client that
started a chat's stream may read or stop it; to anyone else there is none (204). A replay
holds at most `REPLAY_BYTES`; a stream that grows past it is stopped with an error part
saying why, which is the last thing its readers get.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio
from rillet._core._encode import SSE_HEARTBEAT

from ._capacity import ClientId
from ._streamed import until_gone

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._http11 import HttpConnection

__all__ = ["REPLAY_BYTES", "KeptStream", "ReplayConnection"]

REPLAY_BYTES = 16 * 1024 * 1024
"""The most a kept stream holds: far past any answer a person reads, and bounded."""


@attrs.define(eq=False)
class KeptStream:
    """One kept stream, as the chunks its readers get (see the module's docstring)."""

    owner: ClientId
    chunks: list[bytes] = attrs.field(factory=list)
    size: int = 0
    done: bool = False
    overflowed: bool = False  # past `REPLAY_BYTES`: its run was stopped
    stop: Callable[[], object] | None = None  # stops the run (its turn's cancel), once it has one
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def append(self, data: bytes) -> None:
        """More of the stream; past `REPLAY_BYTES` the run is stopped (what it still sends,
        its end, is kept)."""
        if not data:
            return
        self.chunks.append(data)
        self.size += len(data)
        if self.size > REPLAY_BYTES and not self.overflowed:
            self.overflowed = True
            if self.stop is not None:
                self.stop()
        self._wake()

    def close(self) -> None:
        """The stream has ended: its readers end after what it holds."""
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def follow(
        self,
        http: HttpConnection,
        headers: Iterable[tuple[str, str]],
        start: int = 0,
        heartbeat: float = math.inf,
    ) -> bool:
        """Send the stream to one reader from its chunk `start` (its first byte by default),
        then what follows as it comes, until it ends (True) or the reader leaves (False); an
        SSE comment goes out whenever nothing came for `heartbeat` seconds."""
        await http.start_stream(200, headers)
        sent = start

        async def body() -> None:
            nonlocal sent
            while True:
                if sent < len(self.chunks):
                    data = b"".join(self.chunks[sent:])
                    sent = len(self.chunks)
                    await http.send_data(data)
                    continue
                if self.done:
                    return
                with trio.move_on_after(heartbeat) as quiet:
                    await self._changed.wait()
                if quiet.cancelled_caught:
                    await http.send_data(SSE_HEARTBEAT)

        return await until_gone(http, body)


@attrs.define(eq=False)
class ReplayConnection:
    """What a wire's pump writes to when its stream is kept: the HTTP connection's writing
    side (`start_stream`, `send_data`, and the stream's `try_send` for writes from the turn's
    own task), every byte handed to `keep` (a replay's `append`, or nothing for a wire that
    keeps its events itself), nothing ever waiting."""

    keep: Callable[[bytes], object]
    streaming: bool = False
    chunked: bool = False  # the replay holds the stream's own bytes; readers frame them

    @property
    def stream(self) -> ReplayConnection:
        """Itself: `try_send`, `parked` and `flush` are the stream's."""
        return self

    @property
    def parked(self) -> bool:
        """Nothing is ever left to write."""
        return False

    async def start_stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """The head: each reader sends its own."""
        self.streaming = True
        await trio.lowlevel.checkpoint()

    async def send_data(self, data: bytes) -> None:
        """Keep `data` for the readers."""
        self.keep(data)
        await trio.lowlevel.checkpoint()

    def try_send(self, data: bytes) -> bool:
        """Keep `data` for the readers, at once."""
        self.keep(data)
        return True

    async def flush(self) -> None:
        """Nothing waits to be written."""
        await trio.lowlevel.checkpoint()
