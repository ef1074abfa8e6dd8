"""examples/llm_lora.py end to end: a real server, a LoRA job on a SmolLM2-shaped Llama with a
tokenizer trained here, real PEFT on transformers' class."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.remote.conftest import client_home, spawn  # noqa: F401  (fixtures)

pytest.importorskip("peft")
pytest.importorskip("jinja2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.slow
def test_llm_lora_example(spawn, tmp_path):  # noqa: F811
    import llm_lora

    server = spawn("--data-dir", str(tmp_path / "d"))
    report = llm_lora.main(server.target, layers=1, steps=4, vocab=600)
    assert max(report.values()) <= 1e-4, report
