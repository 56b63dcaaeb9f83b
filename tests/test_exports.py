"""The public surface, in trio's manner: every public name is reachable from exactly one public
module, its `__module__` is that module, every `__all__` lists only what exists, no public
signature names a class that lives only in a private module, the installed package is `rillet`
alone, and no rendered doc ever shows a key from the environment."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import pydoc
import re
import subprocess
import sys
import tomllib
import warnings
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import rillet
import rillet.lowlevel
from rillet._core import _deprecated

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
PACKAGES: list[str] = CONFIG["tool"]["setuptools"]["packages"]


def _is_private(module: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in module.split("."))


def _code_packages() -> list[str]:
    """The packages that hold code: not the folders of data (the page and its vendored
    scripts), which are packages only so that the build carries their files."""
    return [p for p in PACKAGES if (spec := importlib.util.find_spec(p)) and spec.origin]


def _all_modules() -> list[ModuleType]:
    """Every module the distribution installs (but `__main__`), imported."""
    packages = _code_packages()
    names: set[str] = set(packages)
    for package in packages:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            if info.name != "__main__":
                names.add(f"{package}.{info.name}")
    return [importlib.import_module(n) for n in sorted(names)]


MODULES = _all_modules()
PUBLIC = [m for m in MODULES if not _is_private(m.__name__)]


def _exported(module: ModuleType) -> list[tuple[str, Any]]:
    return [(n, getattr(module, n)) for n in getattr(module, "__all__", [])]


def _defines(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj)


def test_the_modules_are_found() -> None:
    names = {m.__name__ for m in PUBLIC}
    public = {
        "rillet",
        "rillet.frames",
        "rillet.lowlevel",
        "rillet.providers",
        "rillet.transports",
        "rillet.redis",
    }
    assert public <= names
    assert "rillet.transports.server" in names
    assert any(_is_private(m.__name__) for m in MODULES)


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_every_public_module_lists_what_exists(module: ModuleType) -> None:
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module.__name__} has no __all__"
    assert len(exported) == len(set(exported)), "a name is listed twice"
    assert [n for n in exported if not hasattr(module, n)] == []


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_module_of_every_public_definition_is_where_it_is_exported(module: ModuleType) -> None:
    wrong = [
        f"{name}: {obj.__module__}"
        for name, obj in _exported(module)
        if _defines(obj) and obj.__module__ != module.__name__
    ]
    assert wrong == []


def test_every_public_name_has_exactly_one_public_home() -> None:
    homes: dict[int, list[str]] = {}
    for module in PUBLIC:
        for name, obj in _exported(module):
            if _defines(obj):
                homes.setdefault(id(obj), []).append(f"{module.__name__}.{name}")
    assert [h for h in homes.values() if len(h) > 1] == []


def _classes_by_name() -> dict[str, list[type]]:
    found: dict[str, list[type]] = {}
    for module in MODULES:
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and obj.__module__.startswith("rillet")
                and obj not in found.setdefault(obj.__name__, [])
            ):
                found[obj.__name__].append(obj)
    return found


def _annotations(obj: object) -> list[str]:
    """The annotation texts of a public function or class (its fields, methods, properties)."""
    texts: list[str] = []
    # attrs names the parameter of a private field `_x` plainly `x`: still no one's surface
    hidden: set[str] = set()
    if inspect.isclass(obj) and attrs.has(obj):
        hidden = {f.alias for f in attrs.fields(obj) if f.name.startswith("_")}

    def of(function: object, skip: set[str] | None = None) -> None:
        for key, value in getattr(function, "__annotations__", {}).items():
            if key.startswith("_") or key in (skip or ()):  # a private field or parameter
                continue
            texts.append(value if isinstance(value, str) else repr(value))

    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if klass.__module__.startswith("rillet"):
                of(klass)
        for attr, value in vars(obj).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if isinstance(value, property):
                of(value.fget)
            elif callable(value) or isinstance(value, (classmethod, staticmethod)):
                of(getattr(value, "__func__", value), hidden if attr == "__init__" else None)
    elif callable(obj):
        of(obj)
    return texts


def _callables() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for module in PUBLIC:
        for name, obj in _exported(module):
            if callable(obj):
                out.append((f"{module.__name__}.{name}", obj))
    return out


def _leaks(exports: list[tuple[str, object]], classes: dict[str, list[type]]) -> list[str]:
    found: set[str] = set()
    for where, obj in exports:
        for text in _annotations(obj):
            # a dotted name (`httpx.Request`) is another module's, not one of ours
            for word in re.findall(r"(?<![\w.])[A-Za-z_]\w*", text):
                for cls in classes.get(word, []):
                    if _is_private(cls.__module__):
                        found.add(f"{where} uses {cls.__module__}.{word}")
    return sorted(found)


def test_no_public_signature_names_a_class_that_only_a_private_module_has() -> None:
    assert _leaks(_callables(), _classes_by_name()) == []


def test_the_check_for_leaks_sees_a_private_class() -> None:
    class Hidden:
        pass

    Hidden.__module__ = "rillet._hidden"

    def shown(x: Hidden) -> None:
        """Takes a class no public module exports."""

    shown.__annotations__ = {"x": "Hidden | None", "return": "None"}
    assert _leaks([("rillet.shown", shown)], {"Hidden": [Hidden]}) == [
        "rillet.shown uses rillet._hidden.Hidden"
    ]
    Hidden.__module__ = "rillet"
    assert _leaks([("rillet.shown", shown)], {"Hidden": [Hidden]}) == []


def test_the_core_is_exported() -> None:
    for name in ("UniEvent", "UniMessage", "RilletError"):
        assert name in rillet.__all__
    for name in ("Grammar", "Accumulator", "WireDecoder", "LaneEvent", "AttemptReset", "Upstream"):
        assert name in rillet.lowlevel.__all__
        assert name not in rillet.__all__
    for name in ("Hub", "RunHub", "Subscription", "AnswerDelta", "RunDone", "UniItem"):
        assert name in rillet.__all__
    assert rillet.Turn.__module__ == "rillet"
    assert rillet.TurnResult.__module__ == "rillet"


MOVED = sorted(rillet._MOVED_TO_LOWLEVEL)


def test_the_moved_names_are_the_lowlevel_module() -> None:
    assert MOVED
    assert not set(MOVED) & set(rillet.__all__)  # one public home each
    assert rillet.lowlevel.Grammar.__module__ == "rillet.lowlevel"
    assert rillet.lowlevel.map_finish_reason.__module__ == "rillet.lowlevel"


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_still_resolves_and_warns_once(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_deprecated, "warned", set())  # as in a process that never looked it up
    message = (
        f"rillet.{name} is deprecated and goes in the next release: use rillet.lowlevel.{name}"
    )
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as record:
        found = getattr(rillet, name)
    assert [str(w.message) for w in record] == [message]
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert found is getattr(rillet.lowlevel, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(rillet, name) is found  # the second look-up is silent


def test_from_rillet_import_a_moved_name_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_deprecated, "warned", set())
    with pytest.warns(DeprecationWarning, match=r"rillet\.Grammar is deprecated") as record:
        from rillet import Grammar
    assert len(record) == 1
    assert Grammar is rillet.lowlevel.Grammar


@pytest.mark.parametrize("name", ["NoSuchName", "Dialect", "lowlevel_"])
def test_an_unknown_name_still_raises_attribute_error(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match=name):
            getattr(rillet, name)
        assert not hasattr(rillet, name)


def test_dir_lists_the_public_names_and_not_the_moved_ones() -> None:
    listed = set(dir(rillet))
    assert set(rillet.__all__) <= listed
    assert "lowlevel" in listed
    assert listed.isdisjoint(MOVED)


def test_structs_decode_after_their_module_was_renamed() -> None:
    event = rillet.decode_uni_event(
        b'{"role":"assistant","event_type":"stop","content_items":[],'
        b'"usage_metadata":{"prompt_tokens":1},"finish_reason":"stop","created_at":1}'
    )
    assert event.finish_reason == "stop"
    assert repr(event).startswith("UniEvent(")


def test_version_comes_from_the_metadata() -> None:
    from importlib.metadata import version

    assert rillet.__version__ == version("rillet")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", rillet.__version__)


@pytest.mark.parametrize("name", ["rillet", "rillet.transports"])
def test_py_typed_ships_in_the_package(name: str) -> None:
    assert resources.files(name).joinpath("py.typed").is_file()


@pytest.mark.parametrize("name", ["pipeline", "transports", "tests", "bench"])
def test_only_rillet_is_importable_from_the_install(name: str, tmp_path: Path) -> None:
    # from a folder that is not the repository, as any program using the install would
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=False,
    )
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr


def test_rillet_and_its_transports_import_from_the_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import rillet, rillet.transports; print(rillet.__version__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == rillet.__version__


def _doc(obj: object) -> str:
    return pydoc.plain(pydoc.render_doc(obj))


DUMMY_KEY = "sk-dummy-key-4f8e2b7c9d1a3e5f"


def test_no_rendered_doc_shows_a_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "MMSP_API_KEY"):
        monkeypatch.setenv(var, DUMMY_KEY)
    rendered = 0
    for name, obj in _callables():
        text = _doc(obj)
        assert DUMMY_KEY not in text, name
        assert DUMMY_KEY[-8:] not in text, name
        try:
            signature = str(inspect.signature(obj))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            signature = ""
        assert "environ" not in signature, name
        rendered += 1
    for module in PUBLIC:
        assert DUMMY_KEY not in _doc(module)
    assert rendered > 100


def test_a_configured_provider_never_shows_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from rillet.providers import describe_providers, provider_from_env

    monkeypatch.setenv("OPENAI_API_KEY", DUMMY_KEY)
    provider = provider_from_env("openai")
    assert DUMMY_KEY not in repr(provider)
    assert DUMMY_KEY not in str(describe_providers())
    assert DUMMY_KEY not in _doc(provider_from_env)
