"""examples/hf_lora.py end to end: a real server, real PEFT on real transformers classes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.remote.conftest import client_home, spawn  # noqa: F401  (fixtures)

pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.slow
def test_hf_lora_example(spawn):  # noqa: F811
    import hf_lora

    report = hf_lora.main(spawn().target, steps=8, job_steps=6)
    assert set(report) == {"PeftModel", "AutoPeftModel", "merged", "job AutoPeftModel"}
    assert max(report.values()) <= 1e-4, report
