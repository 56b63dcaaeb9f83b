"""The layers are folders, and imports run one way between them.

Read from the source (every import statement, at any depth, including those under
`TYPE_CHECKING` and inside functions), so a lazy or type-only import cannot hide a dependency:

- each module belongs to the layer of its folder, and imports only from its own layer or below
  (the core imports nothing above it; nothing imports the command line);
- no import circle, type-only ones included, anywhere in `pipeline/` and `transports/`;
- the sans-I/O core and the dialects import no I/O library;
- no underscore name is imported from another module: what another module needs is part of
  its module's interface, named without an underscore (the module itself stays private).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipeline"
TRANSPORTS = ROOT / "transports"

# Bottom first: a module may import from its own layer and the layers before it. A module's
# layer is that of the longest root it falls under.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("rillet._core",)),
    ("providers", ("rillet.providers",)),
    ("upstream", ("rillet.transports.upstream", "rillet.transports.replay")),
    ("turn", ("rillet._turn",)),
    ("agent, hub, sinks", ("rillet._agent", "rillet._hub", "rillet.transports.sinks")),
    ("asyncio", ("rillet.asyncio",)),
    ("services", ("rillet._mcp", "rillet.transports.server", "rillet.transports.testing")),
    ("public", ("rillet", "rillet.transports")),
    ("command line", ("rillet._cli", "rillet.__main__")),
]
IO = ("rillet.transports", "httpx", "httpcore", "trio", "trio_websocket", "socket", "h11")
# The server's settings: plain attrs classes read only by the server's I/O modules.
SETTINGS = {TRANSPORTS / "server" / "_config.py"}
# What makes a module I/O: it talks to sockets, httpx, trio, files or the network server.
IO_MARKERS = ("trio", "httpx", "trio_websocket", "socket", "h11", "io", "rillet.transports")


def module_name(path: Path) -> str:
    """The installed name of a source file: `pipeline/` is `rillet`, `transports/` is
    `rillet.transports`."""
    if path.is_relative_to(TRANSPORTS):
        parts = ["rillet", "transports", *path.relative_to(TRANSPORTS).with_suffix("").parts]
    else:
        parts = ["rillet", *path.relative_to(PIPELINE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {
    module_name(p): p for folder in (PIPELINE, TRANSPORTS) for p in sorted(folder.rglob("*.py"))
}


def _imports(path: Path, package: str) -> list[tuple[str, str | None]]:
    """Every import in a file as (absolute module, imported name or None)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.extend((base, alias.name) for alias in node.names)
    return found


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _edges() -> dict[str, set[str]]:
    """Module -> the rillet modules it imports (a name that is a module counts as one)."""
    edges: dict[str, set[str]] = {}
    for name, path in SOURCES.items():
        out: set[str] = set()
        for base, imported in _imports(path, _package(name, path)):
            if imported is not None and f"{base}.{imported}" in SOURCES:
                out.add(f"{base}.{imported}")
            elif base in SOURCES:
                out.add(base)
        out.discard(name)
        edges[name] = out
    return edges


def _layer(name: str) -> int:
    best, length = -1, -1
    for rank, (_, roots) in enumerate(LAYERS):
        for root in roots:
            if (name == root or name.startswith(root + ".")) and len(root) > length:
                best, length = rank, len(root)
    assert best >= 0, f"{name} is in no layer"
    return best


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def _upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return [
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, outs in sorted(edges.items())
        for b in sorted(outs)
        if _layer(b) > _layer(a)
    ]


def test_imports_run_down_the_layers() -> None:
    assert _upward(_edges()) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    edges = {"rillet._core._events": {"rillet._hub._hub"}, "rillet._cli._main": {"rillet"}}
    assert _upward(edges) == [
        "rillet._core._events (core) imports rillet._hub._hub (agent, hub, sinks)"
    ]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    assert _cycles(_edges()) == []


def test_the_circle_check_sees_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


CORE = sorted(n for n in SOURCES if _within(n, ("rillet._core", "rillet.providers")))


@pytest.mark.parametrize("name", CORE)
def test_the_core_imports_nothing_from_the_io_side(name: str) -> None:
    path = SOURCES[name]
    imports = {b if i is None else f"{b}.{i}" for b, i in _imports(path, _package(name, path))}
    imports |= {b for b, _ in _imports(path, _package(name, path))}
    bad = sorted(i for i in imports if _within(i, IO))
    assert bad == [], f"{name} imports {bad}"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in TRANSPORTS.rglob("*.py") if p.name != "__init__.py" and p not in SETTINGS),
    ids=lambda p: str(p.relative_to(TRANSPORTS)),
)
def test_every_transport_module_does_io(path: Path) -> None:
    name = module_name(path)
    imports = {b for b, _ in _imports(path, _package(name, path))}
    assert any(_within(i, IO_MARKERS) for i in imports), (
        f"{path.relative_to(ROOT)} imports no I/O: a sans-I/O module belongs in the core"
    )


def test_private_names_stay_in_their_module() -> None:
    crossing: set[str] = set()
    for name, path in SOURCES.items():
        for base, imported in _imports(path, _package(name, path)):
            if (
                imported is not None
                and imported.startswith("_")
                and not imported.startswith("__")
                and base in SOURCES
                and f"{base}.{imported}" not in SOURCES
                and base != name
            ):
                crossing.add(f"{name[7:]} {base[7:]} {imported}")
    assert sorted(crossing) == []


def test_the_scan_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The check would catch an import hidden in a function or under TYPE_CHECKING."""
    probe = tmp_path / "probe.py"  # resolved as a dialect would be (package rillet.providers)
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rillet.transports import sinks\n"
        "def f():\n    import httpx\n    from ..transports import upstream\n"
    )
    found = {b if i is None else f"{b}.{i}" for b, i in _imports(probe, "rillet.providers")}
    assert {"rillet.transports.sinks", "httpx", "rillet.transports.upstream"} <= found


def test_the_old_names_still_resolve() -> None:
    import rillet.frames
    import rillet.transports

    for name in rillet.frames.__all__:
        assert getattr(rillet.transports, name) is getattr(rillet.frames, name)
    assert rillet.transports.__all__ == []
    with pytest.raises(AttributeError):
        _ = rillet.transports.NoSuchName


def test_the_root_holds_only_public_entry_modules() -> None:
    """`pipeline/`'s root is what a host imports; the layers are sub-packages."""
    root = sorted(p.name for p in PIPELINE.glob("*.py"))
    assert root == [
        "__init__.py",
        "__main__.py",
        "asyncio.py",
        "frames.py",
        "lowlevel.py",
        "mcp.py",
        "redis.py",
    ]


def test_the_architecture_names_every_folder() -> None:
    """docs/architecture.md describes the folders: a new sub-package is named there."""
    text = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    folders = sorted(
        p.parent for p in [*PIPELINE.rglob("__init__.py"), *TRANSPORTS.rglob("__init__.py")]
    )
    unnamed = [str(f.relative_to(ROOT)) for f in folders if f"{f.name}/" not in text]
    assert unnamed == []
