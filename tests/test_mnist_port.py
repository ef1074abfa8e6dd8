"""examples/mnist: PyTorch's basic MNIST example on the digits, and its burn-remote port.

The port must differ from the torch original only in its imports (and docstring), and both
must reach the same accuracy band when run as a user would run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "examples" / "mnist"


def _body(path: Path) -> list[str]:
    """The file without its docstring and import lines."""
    text = path.read_text()
    text = text[text.index('"""', 3) + 3 :]
    return [line for line in text.splitlines() if not re.match(r"^(import|from) ", line)]


def test_port_differs_only_in_imports():
    ours, theirs = _body(HERE / "main.py"), _body(HERE / "main_torch.py")
    assert ours == theirs


def _accuracy(script: str, epochs: int, *extra: str) -> float:
    out = subprocess.run(
        [sys.executable, script, "--epochs", str(epochs), "--log-interval", "100", *extra],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    correct, total = re.findall(r"Accuracy: (\d+)/(\d+)", out.stdout)[-1]
    return int(correct) / int(total)


@pytest.mark.slow
def test_port_reaches_the_torch_accuracy_band():
    pytest.importorskip("torch")
    theirs = _accuracy("main_torch.py", 5)
    ours = _accuracy("main.py", 5)
    assert theirs >= 0.95 and ours >= 0.95, (ours, theirs)
    assert abs(ours - theirs) <= 0.03, (ours, theirs)


@pytest.mark.slow
def test_port_on_a_remote_device_computes_what_the_cpu_does(spawn):  # noqa: F811
    """Same seed, same keys, same graphs: the server's accuracy is the local one."""
    local = _accuracy("main.py", 1)
    assert local >= 0.6
    assert _accuracy("main.py", 1, "--device", spawn().target) == local


from tests.remote.conftest import client_home, spawn  # noqa: E402, F401  (fixtures)
