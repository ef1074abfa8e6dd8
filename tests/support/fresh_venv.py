"""A fresh virtual environment holding this checkout installed as a user installs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def venv_bytes(bin_dir: Path) -> int:
    """Bytes on disk under the environment (what `du` counts, without hard-link games)."""
    return sum(p.lstat().st_blocks * 512 for p in bin_dir.parent.rglob("*"))


def fresh_venv(tmp: Path, extras: str = "") -> Path:
    """A virtual environment with `pip install .[EXTRAS]` of this checkout's files (tracked
    and new, not ignored: a stale `build/` cannot leak in); returns its `bin`. Compiles no
    bytecode up front, as `make demo` does."""
    src = tmp / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            f"{src}[{extras}]" if extras else str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if pip.returncode != 0:
        pytest.fail(f"pip install .[{extras}] failed:\n{pip.stdout}{pip.stderr}")
    return venv / "bin"
