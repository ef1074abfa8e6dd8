"""The LoRA demo in examples/ runs end to end (few steps: `make demo` runs the full one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "lora_demo.py"


def test_lora_demo_runs(capsys):
    spec = importlib.util.spec_from_file_location("lora_demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    report = demo.main(base_steps=4, lora_steps=3)
    out = capsys.readouterr().out
    assert "QLoRA" in out and "reloaded" in out
    assert report["LoRA"]["bytes_per_base_param"] == 4.0
    assert report["QLoRA"]["bytes_per_base_param"] == pytest.approx(0.516, abs=0.005)
    assert 0 < report["LoRA"]["trainable_share"] < 0.2
