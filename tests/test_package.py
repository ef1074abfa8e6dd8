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


LAZY = (
    "ml_dtypes",
    "msgpack",
    "importlib.metadata",
    "safetensors",
    "burn_remote.nn",
    "burn_remote.lora",
    "burn_remote.optim",
    "burn_remote.onnx",
    "burn_remote.data",
    "burn_remote._jobs",
    "burn_remote._remote",
    "burn_remote._compile",
    "burn_remote._extension",
    "burn_remote.engine",
    "burn_remote.protocol.messages",
)


def test_import_loads_only_what_a_cpu_tensor_needs():
    """Everything else loads on first use (bench/import_time.py times the difference)."""
    code = (
        "import sys, burn_remote; "
        f"print(','.join(m for m in {LAZY!r} if m in sys.modules)); "
        "import burn_remote as br; "
        "t = br.Device.cpu().tensor([1.0, 2.0]); assert (t * 2).tolist() == [2.0, 4.0]; "
        "assert br.nn.Linear and br.optim.SGD and br.lora.LoraConfig and br.data.DataLoader; "
        "assert br.RemoteDevice and br.Jobs and br.compile and br.randn(2).shape == (2,); "
        "assert br.Device.cpu().tensor([1.0], dtype='bfloat16').dtype == 'bfloat16'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_lazy_names_are_listed_for_dir_and_unknown_names_raise():
    assert {"nn", "RemoteDevice", "randn"} <= set(dir(burn_remote))
    try:
        burn_remote.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown attribute did not raise")


def test_shared_test_helpers_live_in_tests_support():
    """A module at the root of tests/ is a test file or conftest.py; helpers shared by
    several tests (models, simulators, proxies, oracles) are tests/support/ modules."""
    loose = sorted(
        p.name
        for p in (ROOT / "tests").glob("*.py")
        if not p.name.startswith("test_") and p.name != "conftest.py"
    )
    assert not loose, f"move these to tests/support/: {loose}"
