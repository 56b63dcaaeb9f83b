"""What makes a turn easy to start: callbacks for each fragment, and a clear refusal outside trio.

`run_turn(on_text=..., on_thinking=..., on_reset=...)` attaches a `FragmentSink`; `run_turn` and
`open_turn` call `require_trio` first, so an asyncio caller learns at once that rillet runs on
trio instead of meeting trio's "must be called from async context".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from .._core._events import TextDelta, ThinkingDelta, UniEvent
from .._core._markers import AttemptReset

if TYPE_CHECKING:
    from ._graph import SinkBatch

__all__ = ["FragmentSink", "require_trio"]


def require_trio(name: str) -> None:
    """Refuse, in words, to run anywhere but trio: awaited from asyncio, trio's own error
    ("must be called from async context") would not say what is wrong."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        pass
    else:
        return
    library = "no async library"
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            library = "asyncio"
    raise RuntimeError(
        f"rillet runs on trio, but {name} was called from {library}: run it inside "
        "trio.run(main) (from an asyncio program, in a thread that calls trio.run, or through "
        'trio-asyncio); see the README, "Embedding it"'
    )


@attrs.define(eq=False)
class FragmentSink:
    """`run_turn`'s `on_text` / `on_thinking` / `on_reset`: called on the turn's task with each
    fragment as it is decoded, and with each reset before the fragments that follow it."""

    on_text: Callable[[str], object] | None
    on_thinking: Callable[[str], object] | None
    on_reset: Callable[[int], object] | None

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Call the callbacks, in order."""
        on_text, on_thinking = self.on_text, self.on_thinking
        for item in batch.uni:
            if type(item) is AttemptReset:
                if self.on_reset is not None:
                    self.on_reset(item.attempt)
                continue
            assert isinstance(item, UniEvent)
            for content in item.content_items:
                kind = type(content)
                if kind is TextDelta and on_text is not None:
                    text = content.text  # type: ignore[union-attr]
                    if text:
                        on_text(text)
                elif kind is ThinkingDelta and on_thinking is not None:
                    thinking = content.thinking  # type: ignore[union-attr]
                    if thinking:
                        on_thinking(thinking)
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Call the callbacks, in order."""
        self.deliver_nowait(batch)

    async def close(self) -> None:
        """Nothing to release."""
