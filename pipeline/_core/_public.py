"""What makes a public module's names look like its own: `__module__` set to the module a user
imports them from, so reprs, `help()`, pickles and generated docs name `rillet.Turn`, never the
private module that happens to define it (trio does the same)."""

from __future__ import annotations

import contextlib
import inspect
import typing
from typing import Any

import msgspec

__all__ = ["fixup_module_metadata"]


def _settle(obj: type) -> None:
    # Annotations are strings (`from __future__ import annotations`) resolved against the module
    # `__module__` names: resolve a class's own now, while that is still the module defining it,
    # so `inspect.signature`, `typing.get_type_hints` and msgspec keep working once it is not.
    own = inspect.get_annotations(obj)
    if own and any(isinstance(v, str) for v in own.values()):
        try:
            hints = typing.get_type_hints(obj, include_extras=True)
        except Exception:  # a name only imported for type checkers: leave them as they are
            hints = None
        if hints is not None:
            obj.__annotations__ = {k: hints.get(k, v) for k, v in own.items()}
    if issubclass(obj, msgspec.Struct):
        with contextlib.suppress(TypeError, ValueError):  # a Struct no decoder can take
            msgspec.json.Decoder(obj)


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Point `__module__` of every class and function in `namespace['__all__']` that a private
    `rillet` module defines at `module_name`, the public module that exports it."""
    seen: set[int] = set()

    def fix(qualname: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or not module.startswith("rillet."):
            return
        if not any(part.startswith("_") for part in module.split(".")):
            return
        if isinstance(obj, type):
            _settle(obj)
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # pragma: no cover - a builtin slot
            return
        if isinstance(obj, type):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and (callable(value) or isinstance(value, type)):
                    fix(f"{qualname}.{attr}", getattr(value, "__func__", value))

    for name in namespace["__all__"]:
        obj = namespace[name]
        if isinstance(obj, type) or callable(obj):
            fix(name, obj)
