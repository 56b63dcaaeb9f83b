"""Tools an agent can run: a function, the JSON schema the model sees, and how one call runs.

A tool is an async function, or a sync one that runs in a worker thread. Its arguments' schema
comes from its signature (the types, the defaults, the docstring's `Args:` lines) or is given
explicitly; a call's arguments are checked against the signature (`msgspec.convert` into a
Struct made from it) before the function runs. What goes wrong (arguments that do not fit, an
unknown tool, an exception, the tool's deadline) goes back to the model as the tool's result,
and the public run events see only a safe `reason_code`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, overload

import attrs
import msgspec
import trio

from .._core._events import ToolCallDone, ToolResultDone
from .._core._request import ToolSpec
from .._turn._guest import on_host

__all__ = ["Tool", "ToolOutput", "ToolStatus", "run_tool", "tool"]

ToolStatus = Literal["ok", "error", "denied", "cancelled"]
_THREAD_GRACE = 2.0  # seconds a cancelled sync tool gets before its thread is abandoned
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECTION = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@attrs.frozen
class Tool:
    """A function the model may call, with the schema it is shown.

    Attributes:
        name: the name the model calls it by.
        description: what it does (the docstring's first paragraph unless given).
        parameters: its arguments' JSON schema (derived from the signature unless given).
        function: the async or sync function; it is called with the arguments as keywords.
        needs_approval: whether each call waits for the host's approval.
        timeout: seconds one call may take (None: no deadline of its own).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] = attrs.field(repr=False)
    needs_approval: bool = False
    timeout: float | None = 60.0
    _arguments: type[msgspec.Struct] | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def spec(self) -> ToolSpec:
        """What the request tells the model about this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    @property
    def is_async(self) -> bool:
        """Whether the function is a coroutine function, or an object whose `__call__` is one
        (else it runs in a worker thread)."""
        call = getattr(self.function, "__call__", None)  # noqa: B004 - an async __call__
        return inspect.iscoroutinefunction(self.function) or inspect.iscoroutinefunction(call)

    def convert(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments checked against the signature and converted to its types
        (liberally: `"3"` for an `int` is accepted); raises `msgspec.ValidationError`."""
        if self._arguments is None:
            return dict(arguments)
        value = msgspec.convert(dict(arguments), self._arguments, strict=False)
        return {f: getattr(value, f) for f in self._arguments.__struct_fields__}


@overload
def tool(
    function: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    needs_approval: bool = False,
    timeout: float | None = 60.0,
) -> Tool: ...


@overload
def tool(
    function: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    needs_approval: bool = False,
    timeout: float | None = 60.0,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    needs_approval: bool = False,
    timeout: float | None = 60.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` of a function: `tool(f)`, or as a decorator `@tool` / `@tool(...)`.

    The schema is derived from the signature and the docstring unless `parameters` is given;
    the arguments are still checked against the signature before each call."""

    def make(fn: Callable[..., Any]) -> Tool:
        tool_name = name or _name_of(fn)
        if not _NAME.fullmatch(tool_name):
            raise ValueError(
                f"a tool's name is 1-64 letters, digits, '_' or '-' (every provider's rule), "
                f"not {tool_name!r}: give name="
            )
        struct = _arguments_struct(fn, tool_name)
        doc = inspect.getdoc(fn) or ""
        schema = parameters if parameters is not None else _schema(struct, _arg_docs(doc))
        return Tool(
            name=tool_name,
            description=description if description is not None else _summary(doc),
            parameters=schema,
            function=fn,
            needs_approval=needs_approval,
            timeout=timeout,
            arguments=struct,
        )

    return make if function is None else make(function)


def _name_of(fn: Callable[..., Any]) -> str:
    """A function's own name, a partial's function's, or an object's class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _arguments_struct(fn: Callable[..., Any], name: str) -> type[msgspec.Struct] | None:
    """A Struct with one field per keyword-callable parameter, or None for a signature that
    takes `**kwargs` (anything goes)."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint only a type checker can resolve: take the names as they are
        hints = {}
    fields: list[Any] = []
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue
        annotation = hints.get(param.name, Any)
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, annotation))
        elif isinstance(param.default, list | dict | set | bytearray):  # a fresh one each call
            fresh = functools.partial(copy.deepcopy, param.default)
            fields.append((param.name, annotation, msgspec.field(default_factory=fresh)))
        else:
            fields.append((param.name, annotation, param.default))
    title = "".join(part.capitalize() for part in re.split(r"\W+", name) if part) or "Arguments"
    return msgspec.defstruct(title, fields, kw_only=True)


def _schema(struct: type[msgspec.Struct] | None, docs: dict[str, str]) -> dict[str, Any]:
    """The JSON schema of a Struct, inlined at the top (no `$ref`), with each argument's
    docstring line as its description."""
    if struct is None:
        return {"type": "object"}
    raw = msgspec.json.schema(struct)
    defs: dict[str, Any] = raw.get("$defs", {})
    top = dict(defs.pop(struct.__name__, raw))
    top.pop("title", None)
    top.setdefault("properties", {})
    properties = {k: dict(v) for k, v in top["properties"].items()}
    for info in msgspec.structs.fields(struct):  # a factory's default is still shown
        if info.default_factory is not msgspec.NODEFAULT and info.encode_name in properties:
            properties[info.encode_name].setdefault("default", info.default_factory())
    for field, text in docs.items():
        if field in properties and text:
            properties[field].setdefault("description", text)
    top["properties"] = properties
    if defs:
        top["$defs"] = defs
    return top


def _summary(doc: str) -> str:
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _arg_docs(doc: str) -> dict[str, str]:
    """`name: text` lines of a Google-style `Args:` section (continuation lines joined)."""
    out: dict[str, str] = {}
    in_section = False
    current: str | None = None
    for line in doc.splitlines():
        if _SECTION.match(line):
            in_section, current = True, None
            continue
        if not in_section:
            continue
        if line and not line[0].isspace():
            break  # the next section
        match = _ARG_LINE.match(line)
        if match and (current is None or len(line) - len(line.lstrip()) <= _indent(doc, current)):
            current = match.group(1).lstrip("*")
            out[current] = match.group(3).strip()
        elif current is not None and line.strip():
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out


def _indent(doc: str, name: str) -> int:
    for line in doc.splitlines():
        match = _ARG_LINE.match(line)
        if match and match.group(1).lstrip("*") == name:
            return len(line) - len(line.lstrip())
    return 0


@attrs.frozen
class ToolOutput:
    """How one tool call ended: what goes back to the model and what the run events show.

    Attributes:
        call: the model's call.
        text: the result the model reads (for a failure, what went wrong, briefly).
        status: `ok`, `error`, `denied` or `cancelled`.
        reason_code: a safe code for a failure (`tool_error`, `tool_arguments_invalid`,
            `tool_timeout`, `unknown_tool`, `denied`...).
        duration: seconds the call took.
    """

    call: ToolCallDone
    text: str
    status: ToolStatus = "ok"
    reason_code: str | None = None
    duration: float = 0.0

    @property
    def item(self) -> ToolResultDone:
        """The result as the content item every dialect sends back."""
        return ToolResultDone(text=self.text, tool_call_id=self.call.tool_call_id)


def result_text(value: object) -> str:
    """A tool's return value as the text the model reads: a string as it is, anything else
    as JSON (`str()` for what JSON cannot hold)."""
    if isinstance(value, str):
        return value
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError):
        return str(value)


async def run_tool(
    found: Tool | None,
    call: ToolCallDone,
    *,
    thread_limiter: trio.CapacityLimiter | None = None,
    thread_grace: float = _THREAD_GRACE,
) -> ToolOutput:
    """Run one call of a tool under its own cancel scope and deadline. Everything but a
    cancel of the caller ends as a `ToolOutput`; the model reads what went wrong."""
    start = trio.current_time()

    def out(text: str, status: ToolStatus = "ok", code: str | None = None) -> ToolOutput:
        return ToolOutput(call, text, status, code, trio.current_time() - start)

    if found is None:
        return out(f"error: there is no tool named {call.name!r}", "error", "unknown_tool")
    try:
        arguments = found.convert(call.arguments)
    except msgspec.ValidationError as exc:
        return out(f"error: invalid arguments: {exc}", "error", "tool_arguments_invalid")
    output = out("")
    with trio.CancelScope() as scope:
        if found.timeout is not None:
            scope.deadline = start + found.timeout
        try:
            if found.is_async:  # on the application's asyncio loop, when it hosts this run
                value = await on_host(found.function, **arguments)
            else:
                value = await _in_thread(found.function, arguments, thread_limiter, thread_grace)
        except Exception as exc:  # the tool's own failure is the model's to read
            output = out(f"error: {type(exc).__name__}: {exc}", "error", "tool_error")
        else:
            output = out(result_text(value))
    if scope.cancelled_caught:  # the tool's own deadline
        return out(f"error: the tool took longer than {found.timeout} s", "error", "tool_timeout")
    return output


async def _in_thread(
    function: Callable[..., Any],
    arguments: dict[str, Any],
    limiter: trio.CapacityLimiter | None,
    grace: float,
) -> Any:
    """Call a sync function in a worker thread. On a cancel the thread gets `grace` seconds
    to return; then it is abandoned, still holding its `limiter` token until it returns."""
    box: list[Any] = []
    errors: list[BaseException] = []
    thread_scope = trio.CancelScope(shield=True)

    def call() -> Any:
        return function(**arguments)

    finished = trio.Event()

    async def runner() -> None:
        with thread_scope:
            try:
                box.append(
                    await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=limiter)
                )
            except Exception as exc:
                errors.append(exc)
        finished.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner)
            try:
                await finished.wait()
            finally:
                thread_scope.deadline = min(thread_scope.deadline, trio.current_time() + grace)
    except BaseExceptionGroup as group:  # only the wait can fail: a cancel, passed on bare
        if len(group.exceptions) == 1:  # so that `except trio.Cancelled` still sees it
            raise group.exceptions[0] from None
        raise
    if errors:
        raise errors[0]
    assert box  # without a result, only a cancel leaves the nursery, and it propagates
    return box[0]
