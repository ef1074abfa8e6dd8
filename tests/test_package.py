"""The package's shape: exports, the pyproject package list, and a light import."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import burn_remote

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = {
    "burn_remote": "client",
    "burn_remote.protocol": "protocol",
    "burn_remote.engine": "engine",
    "burn_remote.server": "server",
}


def test_every_public_name_is_exported_once_and_exists():
    names = burn_remote.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(burn_remote, name), name


def test_pyproject_lists_every_package_folder():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    found = set()
    for pkg, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found == listed


def test_import_stays_light():
    """`import burn_remote` must not pull in the network, crypto or GPU stacks."""
    code = (
        "import sys, burn_remote; "
        "heavy = [m for m in ('trio', 'aioquic', 'cryptography', 'cupy', 'pyopencl', 'onnx', 'sklearn') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
