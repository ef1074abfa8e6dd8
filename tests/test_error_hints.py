"""Errors that go the last step: each names the user's line and what to do (upload host data
with dev.tensor, install the missing extra), and an ONNX export from an example at the
model's full context works, checked in onnxruntime at other lengths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, RecordError, collective, nn

HERE = Path(__file__).resolve()


def test_a_numpy_batch_given_to_a_layer_says_to_upload_it() -> None:
    layer = nn.Linear(4, 2).to(Device.cpu())
    with pytest.raises(TypeError) as info:
        layer(np.ones((3, 4), np.float32))
    text = str(info.value)
    assert "NumPy array" in text and "dev.tensor(x)" in text
    assert f"{HERE}:" in text  # this file and line


def test_a_device_mismatch_outside_compile_names_the_line() -> None:
    a = Device.cpu().tensor(np.ones(3, np.float32))
    b = collective.local_devices(1)[0].tensor(np.ones(3, np.float32))
    with pytest.raises(RecordError, match="different devices") as info:
        a + b
    assert f"{HERE}:" in str(info.value)


def test_a_missing_onnx_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['onnx'] = None\n"  # as if the extra were not installed
        "from burn_remote import onnx\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "pip install 'burn-remote[onnx]'" in out.stderr, out.stderr


def test_onnx_export_at_the_full_context_follows_the_sequence_axis(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from burn_remote.onnx import export

    dev = Device.cpu()
    nn.seed(0)
    model = nn.GPT(nn.GPTConfig(n_layer=1, n_head=2, d_model=16, vocab=32, context=12), device=dev)
    model.eval()
    ids = np.random.default_rng(0).integers(0, 32, (2, 12)).astype(np.int64)  # full context
    path = export(model, ids, tmp_path / "gpt.onnx", dynamic_axes={0: {0: "batch", 1: "sequence"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((2, 12), (3, 7), (1, 1)):
        x = np.random.default_rng(1).integers(0, 32, shape).astype(np.int64)
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        np.testing.assert_allclose(got, model(dev.tensor(x)).numpy(), rtol=1e-4, atol=1e-5)
