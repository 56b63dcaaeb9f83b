"""The layers do not loop: the sans-I/O core imports nothing from the I/O side, and the folder
that holds the I/O transports holds only I/O.

Read from the source (every import statement, at any depth, including those under
`TYPE_CHECKING` and inside functions), so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"
TRANSPORTS = ROOT / "transports"

# The sans-I/O core: the vocabularies, the grammar and accumulator, the answer text, the frame
# codecs and wire encoders, the wire decoder, the failure taxonomy, the request model, the
# handler's rules and read helpers, the run events, the conversation and its budget, the causes
# in words, and every dialect (found by globbing, so a new one is checked unlisted). What it
# must never import.
CORE = [
    "_errors.py",
    "_events.py",
    "_lanes.py",
    "_request.py",
    "_grammar.py",
    "_finish.py",
    "_arguments.py",
    "_accumulator.py",
    "_text.py",
    "_sse.py",
    "_ndjson.py",
    "_encode.py",
    "frames.py",
    "_wire.py",
    "_failures.py",
    "_upstream.py",
    "_openai_request.py",
    "_policy.py",
    "_runevents.py",
    "_reads.py",
    "_budget.py",
    "_conversation.py",
    "_explain.py",
    "_markers.py",
    *[f"providers/{p.name}" for p in sorted((PIPELINE / "providers").glob("*.py"))],
]
IO = ("rillet.transports", "httpx", "httpcore", "trio", "trio_websocket", "socket", "h11")
# The server's settings: plain attrs classes read only by the server's I/O modules.
SETTINGS = {TRANSPORTS / "server" / "_config.py"}
# What makes a module I/O: it talks to sockets, httpx, trio, files or the network server.
IO_MARKERS = ("trio", "httpx", "trio_websocket", "socket", "h11", "io", "rillet.transports")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved against its package)."""
    package = "rillet" if path.parent == PIPELINE else "rillet.providers"
    if path.is_relative_to(TRANSPORTS):
        parts = path.relative_to(TRANSPORTS).parent.parts
        package = ".".join(("rillet", "transports", *parts))
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


@pytest.mark.parametrize("name", CORE)
def test_the_core_imports_nothing_from_the_io_side(name: str) -> None:
    path = PIPELINE / name
    assert path.exists(), f"{name} is listed as core but does not exist"
    bad = sorted(i for i in _imports(path) if _within(i, IO))
    assert bad == [], f"{name} imports {bad}"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in TRANSPORTS.rglob("*.py") if p.name != "__init__.py" and p not in SETTINGS),
    ids=lambda p: str(p.relative_to(TRANSPORTS)),
)
def test_every_transport_module_does_io(path: Path) -> None:
    imports = _imports(path)
    assert any(_within(i, IO_MARKERS) for i in imports), (
        f"{path.relative_to(ROOT)} imports no I/O: a sans-I/O module belongs in the core"
    )


def test_the_scan_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The check would catch an import hidden in a function or under TYPE_CHECKING."""
    probe = tmp_path / "probe.py"  # resolved as a dialect would be (package rillet.providers)
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rillet.transports import sinks\n"
        "def f():\n    import httpx\n    from ..transports import upstream\n"
    )
    found = {i for i in _imports(probe) if _within(i, IO)}
    assert {"rillet.transports.sinks", "httpx", "rillet.transports.upstream"} <= found


def test_the_old_names_still_resolve() -> None:
    import rillet.frames
    import rillet.transports

    for name in rillet.frames.__all__:
        assert getattr(rillet.transports, name) is getattr(rillet.frames, name)
    assert rillet.transports.__all__ == []
    with pytest.raises(AttributeError):
        _ = rillet.transports.NoSuchName


def test_the_architecture_names_every_module() -> None:
    """docs/architecture.md's layer list stays true to the code: a new module is named there."""
    text = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    unnamed = [
        str(path.relative_to(ROOT))
        for folder in (PIPELINE, TRANSPORTS, TRANSPORTS / "server")
        for path in sorted(folder.glob("*.py"))
        if path.stem not in ("__init__", "__main__") and path.stem not in text
    ]
    assert not unnamed
