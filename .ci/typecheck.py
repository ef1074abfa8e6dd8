"""Type-check the package with mypy (`make test` runs this): `python .ci/typecheck.py`.

The four code folders are one import package only through pyproject's `package-dir`
(client/ -> burn_remote, protocol/ -> burn_remote.protocol, ...), and an editable install
finds them with an import hook that mypy does not run. So this builds the package's shape
as a tree of symlinks under build/typecheck/ (one per source file), checks
``-p burn_remote`` there with the settings of pyproject's ``[tool.mypy]``, and prints each
finding under the file's real path (client/_tensor.py, not the link). Exit status: mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
FOLDERS = {
    "burn_remote": "client",
    "burn_remote/protocol": "protocol",
    "burn_remote/engine": "engine",
    "burn_remote/server": "server",
}


def build_tree() -> dict[str, str]:
    """Link every source file into TREE in its package's place; link path -> real path."""
    real_of: dict[str, str] = {}
    wanted: set[Path] = set()
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py*"):
            if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT / folder)
            link = TREE / package / rel
            wanted.add(link)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink() or os.readlink(link) != str(path):
                link.unlink(missing_ok=True)
                link.symlink_to(path)
            real_of[str(link.relative_to(ROOT))] = str(path.relative_to(ROOT))
    for stale in TREE.rglob("*.py*"):  # files deleted or moved since the last run
        if stale.is_symlink() and stale not in wanted:
            stale.unlink()
    return real_of


def main() -> int:
    real_of = build_tree()
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "-p",
        "burn_remote",
    ]
    env = {**os.environ, "MYPYPATH": str(TREE)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    for line in (out.stdout + out.stderr).splitlines():
        path, sep, rest = line.partition(":")
        print(f"{real_of.get(path, path)}{sep}{rest}")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
