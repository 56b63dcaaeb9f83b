"""What the deterministic-failure tests share."""

from __future__ import annotations

RESCUE_SEEN = ("D", "usage", "done")


def chunks_of(data: bytes, size: int = 4096) -> list[bytes]:
    """`data` in reads of `size` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)]
