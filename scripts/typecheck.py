"""Type-check the installed package `rillet` as mypy sees it, from the repository's folders.

The repository keeps `pipeline/` and `transports/`; the package they install is `rillet`, with
`rillet.transports` mapped onto `transports/` (pyproject's `package-dir`). mypy names modules by
their folders, so this builds a view of links under `build/typecheck/` that has the installed
layout (`rillet/...`, `rillet/transports/...`), checks it with the repository's mypy settings
together with `tests/` and `bench/`, and prints every path as the repository's own file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEW = ROOT / "build" / "typecheck"
MAPPING = {"rillet": ROOT / "pipeline", "rillet/transports": ROOT / "transports"}


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        if "__pycache__" in path.parts or path.suffix not in {".py", ".pyi", ".typed"}:
            continue
        link = target / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)


def build_view() -> dict[str, str]:
    """Lay the view anew and answer how to turn its paths back into the repository's."""
    shutil.rmtree(VIEW, ignore_errors=True)
    back: dict[str, str] = {}
    for name, source in MAPPING.items():
        _link_tree(source, VIEW / name)
        back[str((VIEW / name).relative_to(ROOT)) + os.sep] = str(source.relative_to(ROOT)) + os.sep
    return back


def main() -> int:
    back = build_view()
    cmd = [sys.executable, "-m", "mypy", str(VIEW.relative_to(ROOT) / "rillet"), "tests", "bench"]
    env = dict(os.environ, MYPYPATH=str(VIEW))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    # the longest prefix first: rillet/transports/ before rillet/
    prefixes = sorted(back.items(), key=lambda kv: -len(kv[0]))
    for line in (done.stdout + done.stderr).splitlines():
        for view, real in prefixes:
            if line.startswith(view):
                line = real + line[len(view) :]
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
