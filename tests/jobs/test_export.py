"""onnx_export jobs over a real server: the digits MLP (trained by a `train` job), a small CNN
and the tiny GPT with a LoRA adapter from a `lora_finetune` job, each run in onnxruntime
against the engine (max abs diff <= 1e-4, float32)."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from burn_remote import Device, RemoteDevice, nn  # noqa: E402

from tests.jobs.models import lora_spec  # noqa: E402

DEV = Device.cpu()
TOL = 1e-4


def run_onnx(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def export_job(jobs, model_ref, example_shape, tmp, dynamic_axes=None, **model):
    spec = {
        "kind": "onnx_export",
        "model": {"weights": model_ref, **model},
        "example_shape": example_shape,
    }
    if dynamic_axes is not None:
        spec["dynamic_axes"] = dynamic_axes
    job = jobs.submit(spec)
    assert job.wait(timeout=60)["state"] == "succeeded"
    return job.fetch(tmp)["model.onnx"]


MLP = [
    {"type": "linear", "in_features": 64, "out_features": 32},
    {"type": "relu"},
    {"type": "linear", "in_features": 32, "out_features": 10},
]
CNN = [
    {"type": "conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": 3, "padding": 1},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2},
    {"type": "conv2d", "in_channels": 8, "out_channels": 16, "kernel_size": 3, "padding": 1},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2},
    {"type": "flatten"},
    {"type": "linear", "in_features": 64, "out_features": 10},
]


def local_sequential(layers, weights):
    from burn_remote.server.jobs._models import build_model

    spec = {"model": {"arch": "sequential", "layers": layers, "weights": "w"}}
    return build_model(spec, DEV, lambda ref, key: weights).eval()


def test_train_then_export_digits_mlp_and_cnn(spawn, tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    np.savez(tmp_path / "digits.npz", x=x[:512], y=y[:512])
    jobs = RemoteDevice(spawn().target).jobs
    train = jobs.submit(
        {
            "kind": "train",
            "steps": 30,
            "batch_size": 32,
            "model": {"arch": "sequential", "layers": MLP},
            "data": {"path": str(tmp_path / "digits.npz")},
            "optimizer": {"lr": 1e-2},
        }
    )
    info = train.wait(timeout=60)
    assert info["state"] == "succeeded"
    events = [e for e in train.events(0) if e.get("loss") is not None]
    assert events[-1]["loss"] < events[0]["loss"]
    mlp_onnx = export_job(
        jobs, f"job:{train.id}", [4, 64], tmp_path / "mlp", arch="sequential", layers=MLP
    )
    weights = train.fetch(tmp_path / "mlp-w")["model.safetensors"]
    mlp = local_sequential(MLP, weights)
    for b in (4, 9):
        ref = mlp(DEV.tensor(x[:b])).numpy()
        assert np.abs(run_onnx(mlp_onnx, x[:b]) - ref).max() <= TOL

    nn.seed(3)
    cnn = nn.Sequential(*[_layer(spec) for spec in CNN])
    cnn.save(tmp_path / "cnn.safetensors")
    cnn_onnx = export_job(
        jobs,
        str(tmp_path / "cnn.safetensors"),
        [2, 1, 8, 8],
        tmp_path / "cnn",
        arch="sequential",
        layers=CNN,
    )
    xi = x[:5].reshape(-1, 1, 8, 8)
    ref = cnn.eval()(DEV.tensor(xi)).numpy()
    assert np.abs(run_onnx(cnn_onnx, xi) - ref).max() <= TOL


def _layer(spec):
    from burn_remote.server.jobs._models import _LAYERS

    args = {k: v for k, v in spec.items() if k != "type"}
    return _LAYERS[spec["type"]](**args)


def test_lora_job_then_export_tiny_gpt_with_the_adapter(base, spawn, tmp_path):
    jobs = RemoteDevice(spawn().target).jobs
    tune = jobs.submit(lora_spec(*base, steps=15))
    assert tune.wait(timeout=60)["state"] == "succeeded"
    weights_ref = tune.info["spec"]["model"]["weights"]
    onnx_path = export_job(
        jobs, weights_ref, [2, 16], tmp_path / "gpt", n_head=2, adapter=f"job:{tune.id}"
    )
    adapter = tune.fetch(tmp_path / "adapter")
    model = nn.GPT.from_gpt2(base[0], n_head=2, device=DEV)
    model.load_adapter(adapter["adapter_model.safetensors"].parent)
    model.eval()
    ids = np.random.default_rng(0).integers(0, model.config.vocab, (3, 16)).astype(np.int64)
    ref = model(DEV.tensor(ids)).numpy()
    assert np.abs(ref).max() > 0
    assert np.abs(run_onnx(onnx_path, ids) - ref).max() <= TOL
    # named dynamic axes: exported at length 8, run at 12
    axes = {"0": "batch", "1": "sequence"}
    onnx_path = export_job(jobs, weights_ref, [2, 8], tmp_path / "gpt-dyn", axes, n_head=2,
                           adapter=f"job:{tune.id}")  # fmt: skip
    short = ids[:, :12]
    assert np.abs(run_onnx(onnx_path, short) - model(DEV.tensor(short)).numpy()).max() <= TOL
