"""`make demo`'s environment: the core and the `demo` extra only, small, and enough for the
whole demo (remote training, a LoRA job, an ONNX export checked by onnxruntime)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.fresh_venv import ROOT, fresh_venv, venv_bytes

DEMO_VENV_LIMIT = 400 * 2**20


@pytest.mark.slow
def test_demo_extra_installs_small_and_runs_the_demo(tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path, "demo")
    for heavy in ("torch", "cupy", "transformers", "pytest"):
        probe = subprocess.run(
            [str(bin_dir / "python"), "-c", f"import {heavy}"], capture_output=True
        )
        assert probe.returncode != 0, f"{heavy} is installed by the demo extra"
    out = subprocess.run(
        [str(bin_dir / "python"), str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "onnxruntime vs engine max abs diff" in out.stdout
    size = venv_bytes(bin_dir)
    assert size <= DEMO_VENV_LIMIT, f"the demo's venv holds {size / 2**20:.0f} MiB"
