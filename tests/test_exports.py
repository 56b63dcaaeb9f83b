"""The public surface: every exported name exists, every public class or function a package
re-exports from its private modules is listed in its `__all__`, and both packages ship typed."""

from __future__ import annotations

import importlib
import inspect
import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

PACKAGES = ["pipeline", "pipeline.providers", "transports"]
ROOT = Path(__file__).resolve().parent.parent


def _package(name: str) -> ModuleType:
    return importlib.import_module(name)


def _is_private_module_of(module: str, package: str) -> bool:
    """Whether `module` lives inside `package` behind a leading-underscore name."""
    if not module.startswith(package + "."):
        return False
    return any(part.startswith("_") for part in module[len(package) + 1 :].split("."))


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_exists(name: str) -> None:
    package = _package(name)
    exported = package.__all__
    assert len(exported) == len(set(exported)), "a name is listed twice"
    missing = [n for n in exported if not hasattr(package, n)]
    assert missing == []


@pytest.mark.parametrize("name", PACKAGES)
def test_every_reexported_public_definition_is_listed(name: str) -> None:
    package = _package(name)
    unlisted = []
    for attr, obj in vars(package).items():
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if _is_private_module_of(getattr(obj, "__module__", ""), name) and (
            attr not in package.__all__
        ):
            unlisted.append(attr)
    assert unlisted == []


def test_the_private_module_check_sees_what_it_should() -> None:
    assert _is_private_module_of("pipeline._grammar", "pipeline")
    assert _is_private_module_of("pipeline.providers._base", "pipeline")
    assert not _is_private_module_of("pipeline.errors", "pipeline")
    assert not _is_private_module_of("transports._sse", "pipeline")


def test_the_core_is_exported() -> None:
    import pipeline
    import transports

    for name in ("Grammar", "Accumulator", "UniEvent", "UniMessage", "WireDecoder", "RilletError"):
        assert name in pipeline.__all__
    for name in ("SSEDecoder", "NDJSONDecoder", "encode_sse", "SSEEvent", "DEFAULT_MAX_FRAME"):
        assert name in transports.__all__


@pytest.mark.parametrize("name", ["pipeline", "transports"])
def test_py_typed_ships_in_the_package(name: str) -> None:
    marker = resources.files(name).joinpath("py.typed")
    assert marker.is_file()
    assert (ROOT / name / "py.typed").is_file()


def test_the_wheel_holds_both_packages() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    packages = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert {"pipeline", "transports"} <= set(packages)
