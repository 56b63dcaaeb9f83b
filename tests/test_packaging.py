"""rillet as a user gets it: the wheel and the sdist, built once from a copy of the repository
with the build backend the project names (no build isolation, so no index is needed), then the
wheel installed on its own into a scratch folder and used from outside the repository."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
VERSION: str = CONFIG["project"]["version"]
# what is never copied into the scratch source tree: environments, VCS, what builds leave behind
SKIP = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*_cache",
    ".hypothesis",
    "artifacts",
)


def _setuptools_ok() -> bool:
    try:
        major = int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return False
    return major >= 77  # the `requires` of pyproject.toml's [build-system]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist), built from a copy of the repository so the checkout stays untouched."""
    if not _setuptools_ok():
        pytest.skip("building needs setuptools>=77 (the test extra installs it)")
    base = tmp_path_factory.mktemp("dist")
    src, out = base / "src", base / "out"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP), symlinks=True)
    (src / "tests" / "artifacts").mkdir(exist_ok=True)
    (src / "tests" / "artifacts" / "left-behind.txt").write_text("a test's leftovers\n")
    out.mkdir()
    names = []
    for hook in ("build_sdist", "build_wheel"):  # one process each, as a frontend runs them
        names.append(_hook(hook, src, out))
    return out / names[1], out / names[0]


BUILD_OUTPUT: dict[str, str] = {}  # each hook's stderr: what a user's build would print


def _hook(hook: str, src: Path, out: Path) -> str:
    """Run one PEP 517 hook of the build backend in `src`; the built file's name."""
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    BUILD_OUTPUT[hook] = done.stderr
    return done.stdout.split()[-1]


def test_the_build_warns_of_nothing(dists: tuple[Path, Path]) -> None:
    # `make demo` and `pip install` print what the backend warns: every folder of files the
    # package carries (the page and its vendored scripts) is a package the build names
    assert set(BUILD_OUTPUT) == {"build_sdist", "build_wheel"}
    for hook, stderr in BUILD_OUTPUT.items():
        assert "Warning" not in stderr, (hook, stderr[-3000:])


@pytest.fixture(scope="module")
def installed(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel alone (its dependencies come from this environment) in a scratch folder."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run(
        [*pip, "--target", str(target), str(dists[0])],
        check=True,
        capture_output=True,
    )
    return target


def _run(installed: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = str(installed)
    return subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _metadata(dists: tuple[Path, Path]) -> email.message.Message:
    with zipfile.ZipFile(dists[0]) as wheel:
        text = wheel.read(f"rillet-{VERSION}.dist-info/METADATA").decode()
    return email.parser.Parser().parsestr(text)


def test_the_wheel_holds_rillet_alone_with_its_page_and_the_vendored_licences(
    dists: tuple[Path, Path],
) -> None:
    with zipfile.ZipFile(dists[0]) as wheel:
        names = set(wheel.namelist())
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert tops == {"rillet", f"rillet-{VERSION}.dist-info"}
    static = "rillet/transports/static/"
    vendored = ("marked.umd.js", "purify.min.js", "highlight.min.js")
    for name in ("index.html", *(f"vendor/{v}" for v in vendored)):
        assert static + name in names
    shipped = ("LICENSE.marked", "LICENSE.dompurify", "LICENSE.highlightjs")
    for name in shipped:
        assert static + "vendor/" + name in names
    licences = {PurePosixPath(n).name for n in names if "/licenses/" in n}
    assert licences == {"LICENSE", *shipped}
    assert {"rillet/py.typed", "rillet/transports/py.typed"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_metadata_says_what_rillet_is(dists: tuple[Path, Path]) -> None:
    meta = _metadata(dists)
    assert meta["Name"] == "rillet"
    assert meta["Version"] == VERSION
    assert meta["Summary"] == CONFIG["project"]["description"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert str(meta.get_payload()).startswith("# rillet")  # the README is the long description
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Framework :: Trio" in classifiers
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert set(meta.get_all("Provides-Extra") or []) >= {"redis", "mcp", "metrics"}


def test_the_sdist_holds_what_building_needs_and_no_leftovers(dists: tuple[Path, Path]) -> None:
    with tarfile.open(dists[1]) as sdist:
        names = {PurePosixPath(*PurePosixPath(n).parts[1:]).as_posix() for n in sdist.getnames()}
    for name in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO"):
        assert name in names
    assert "pipeline/__init__.py" in names
    assert "transports/static/index.html" in names
    assert "transports/static/vendor/LICENSE.marked" in names
    assert "docs/decisions.md" in names
    leftovers = [
        n
        for n in names
        if n.startswith(("tests/", "bench/", "scripts/", "build/"))
        or "__pycache__" in n
        or n.endswith(".pyc")
    ]
    assert leftovers == []


def test_the_sdist_builds_the_same_wheel(dists: tuple[Path, Path], tmp_path: Path) -> None:
    with tarfile.open(dists[1]) as sdist:
        sdist.extractall(tmp_path, filter="data")
    (src,) = tmp_path.iterdir()
    out = tmp_path / "out"
    name = _hook("build_wheel", src, out)
    with zipfile.ZipFile(out / name) as rebuilt, zipfile.ZipFile(dists[0]) as w:
        assert sorted(rebuilt.namelist()) == sorted(w.namelist())


def test_the_installed_wheel_is_rillet_and_only_rillet(installed: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util, rillet, rillet.transports.server; "
        "print(rillet.__file__); print(rillet.__version__); "
        "print([n for n in ('pipeline', 'transports', 'tests', 'bench') "
        "if importlib.util.find_spec(n)])"
    )
    done = _run(installed, sys.executable, "-W", "error", "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, found, others = done.stdout.splitlines()
    assert Path(where).is_relative_to(installed)
    assert found == VERSION
    assert others == "[]"


def test_the_wheels_console_script_and_module_print_the_version(
    installed: Path, tmp_path: Path
) -> None:
    script = _run(installed, str(installed / "bin" / "rillet"), "--version", cwd=tmp_path)
    module = _run(installed, sys.executable, "-m", "rillet", "--version", cwd=tmp_path)
    assert script.stdout.strip() == module.stdout.strip() == f"rillet {VERSION}"


def test_the_demo_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    done = _run(installed, str(installed / "bin" / "rillet"), "demo", "--fast", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "all turns completed" in done.stderr


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [("rillet.redis", "coredis", "redis"), ("rillet.mcp", "mcp", "mcp")],
)
def test_a_module_whose_extra_is_missing_names_the_extra(
    module: str, dependency: str, extra: str, tmp_path: Path
) -> None:
    hide = f"import sys; sys.modules[{dependency!r}] = None; import {module}"
    done = subprocess.run(
        [sys.executable, "-c", hide], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: {module} needs the {extra} extra: pip install 'rillet[{extra}]'"
