"""Gemini's streamed function-call arguments, put back together into one JSON object.

With `functionCallingConfig.streamFunctionCallArguments` (Gemini 3 on Vertex AI) one call is
spread over several `functionCall` parts: the first has the `name` (and `id`) and
`willContinue: true`, later ones carry `partialArgs`, and an empty `functionCall` (no
`willContinue`) ends it. Each partial argument names where its value goes by an RFC 9535 JSON
path (`$.location`, `$.stops[1].city`, `$['odd key']`) and carries one typed value
(`stringValue`, `numberValue`, `boolValue`, `nullValue`); a string whose `willContinue` is true
goes on in the next partial argument for the same path, and the pieces are concatenated.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import msgspec
from rillet._core._errors import MalformedFrameError

__all__ = ["PartialArg", "StreamedCall"]

_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]|\[(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")\]")
_MAX_INDEX = 10_000
"""A list index past this is refused: a path must not make us build a huge list."""


class PartialArg(msgspec.Struct, frozen=True, rename="camel"):
    """One streamed argument value: where it goes, and the value (one of the four)."""

    json_path: str
    string_value: str | None = None
    number_value: int | float | None = None
    bool_value: bool | None = None
    null_value: str | None = None
    will_continue: bool = False


def _steps(path: str, provider: str) -> list[str | int]:
    """The keys and indexes of a JSON path (`$.a[0]['b']` -> `["a", 0, "b"]`)."""
    if not path.startswith("$"):
        raise MalformedFrameError(f"not a JSON path: {path!r}", path, provider=provider)
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        match = _STEP.match(path, at)
        if match is None:
            raise MalformedFrameError(f"not a JSON path: {path!r}", path, provider=provider)
        name, index, single, double = match.groups()
        if index is not None:
            if int(index) > _MAX_INDEX:
                raise MalformedFrameError(f"index too large: {path!r}", path, provider=provider)
            steps.append(int(index))
        else:
            quoted = single if single is not None else double
            key = name if name is not None else re.sub(r"\\(.)", r"\1", quoted or "")
            steps.append(key)
        at = match.end()
    if not steps:
        raise MalformedFrameError(f"a JSON path to no argument: {path!r}", path, provider=provider)
    return steps


def _container(step: str | int) -> Any:
    return [] if isinstance(step, int) else {}


class StreamedCall:
    """One function call whose arguments are streaming in: its header, and what came so far.

    Attributes:
        name: the function's name.
        call_id: Gemini's `functionCall.id`, or "" when it sent none.
        fidelity: the fidelity of the part that carried a thought signature, if one did.
        arguments: the arguments so far.
    """

    __slots__ = ("_continuing", "arguments", "call_id", "fidelity", "name", "provider")

    def __init__(
        self,
        name: str,
        call_id: str,
        fidelity: dict[str, Any] | None,
        provider: str,
        args: Any = None,
    ) -> None:
        self.name = name
        self.call_id = call_id
        self.fidelity = fidelity
        self.provider = provider
        self.arguments: dict[str, Any] = dict(args) if isinstance(args, dict) else {}
        self._continuing: set[str] = set()  # paths whose string goes on in the next piece

    def apply(self, partial: PartialArg) -> None:
        """Put one partial argument's value where its path says."""
        if partial.string_value is not None:
            value: Any = partial.string_value
        elif partial.number_value is not None:
            value = partial.number_value
        elif partial.bool_value is not None:
            value = partial.bool_value
        elif partial.null_value is not None:
            value = None
        else:
            return  # no value: nothing to set
        path = partial.json_path
        steps = _steps(path, self.provider)
        node: Any = self.arguments
        for step, after in itertools.pairwise(steps):
            node = self._child(node, step, after, path)
        last = steps[-1]
        old = self._get(node, last, path)
        if type(value) is str and path in self._continuing and type(old) is str:
            value = old + value
        self._set(node, last, value, path)
        if partial.will_continue and type(value) is str:
            self._continuing.add(path)
        else:
            self._continuing.discard(path)

    def _child(self, node: Any, step: str | int, after: str | int, path: str) -> Any:
        child = self._get(node, step, path)
        if child is None:
            child = _container(after)
            self._set(node, step, child, path)
        elif not isinstance(child, dict | list):
            raise self._mismatch(path)  # a path through a value already set
        return child

    def _get(self, node: Any, step: str | int, path: str) -> Any:
        if isinstance(step, int):
            if not isinstance(node, list):
                raise self._mismatch(path)
            return node[step] if step < len(node) else None
        if not isinstance(node, dict):
            raise self._mismatch(path)
        return node.get(step)

    def _set(self, node: Any, step: str | int, value: Any, path: str) -> None:
        if isinstance(step, int):
            if not isinstance(node, list):
                raise self._mismatch(path)
            node.extend([None] * (step + 1 - len(node)))
            node[step] = value
        elif isinstance(node, dict):
            node[step] = value
        else:
            raise self._mismatch(path)

    def _mismatch(self, path: str) -> MalformedFrameError:
        return MalformedFrameError(
            f"JSON path {path!r} does not fit the arguments so far", path, provider=self.provider
        )
