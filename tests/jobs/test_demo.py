"""examples/jobs_demo.py end to end against a real server (short run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


def test_jobs_demo(spawn):
    import jobs_demo

    report = jobs_demo.main(spawn().target, base_steps=10, lora_steps=12)
    assert report["onnx_max_abs_diff"] <= 1e-4
    assert report["loss"][1] < report["loss"][0] + 0.5
