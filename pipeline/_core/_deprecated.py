"""Old names kept for one release: each says once per process that it has a new name.

A renamed public name (a class, a keyword, an attribute, an enum member) keeps working for one
release and warns the first time it is used, a `DeprecationWarning` pointing at the caller's
line; later uses are silent, so an old name in a loop costs one set lookup.
"""

from __future__ import annotations

import warnings

__all__ = ["renamed", "warned"]

warned: set[str] = set()
"""The old names that have warned in this process (a test empties it to see one warn again)."""


def renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that `old` is now `new`, the first time in this process only.

    Args:
        old: the old name as the caller wrote it (`Policy(fallback=...)`).
        new: the name to write instead (`Policy(rescue=...)`).
        stacklevel: how far up the stack the caller's line is (3: the caller of the function
            that calls this).
    """
    if old in warned:
        return
    warned.add(old)
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
