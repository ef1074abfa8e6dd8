"""Whole models exported to ONNX and run in onnxruntime against the engine (float32).

The digits MLP, a small CNN and a tiny GPT block, each at the example batch and at another
batch through the dynamic batch axis; plus external data, the LoRA merge hook and the errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from burn_remote import Device, OpFailed, nn, optim  # noqa: E402
from burn_remote import functional as F  # noqa: E402
from burn_remote.onnx import ExportError, export, to_onnx  # noqa: E402

DEV = Device.cpu()
TOL = 1e-4


def param(rng, *shape, scale=None):
    scale = scale if scale is not None else 1 / math.sqrt(shape[-1])
    return DEV.tensor((rng.standard_normal(shape) * scale).astype(np.float32), requires_grad=True)


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def check(model, path, batches, make_input):
    sess = session(path)
    name = sess.get_inputs()[0].name
    for b in batches:
        x = make_input(b)
        ref = model(DEV.tensor(x)).numpy()
        (got,) = sess.run(None, {name: x})
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= TOL, (b, np.abs(got - ref).max())


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def test_digits_mlp(digits, tmp_path):
    x, y = digits
    nn.seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(15):
        sl = slice(step * 64, step * 64 + 64)
        loss = F.cross_entropy(model(DEV.tensor(x[sl])), DEV.tensor(y[sl]))
        loss.backward()
        opt.step()
        opt.zero_grad()
    path = export(model, x[:16], tmp_path / "mlp.onnx", input_names=["pixels"])
    check(model, path, (16, 5, 1), lambda b: x[100 : 100 + b])
    graph = onnx.load(str(path)).graph
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert {t.name for t in graph.initializer} >= {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert model.training  # eval() during export only


class SmallCNN(nn.Module):
    def __init__(self, rng):
        self.c1, self.b1 = param(rng, 8, 1, 3, 3, scale=0.4), param(rng, 8, scale=0.1)
        self.c2, self.b2 = param(rng, 16, 8, 3, 3, scale=0.15), param(rng, 16, scale=0.1)
        self.w, self.b = param(rng, 10, 64), param(rng, 10, scale=0.1)

    def forward(self, x):
        x = F.max_pool2d(F.relu(F.conv2d(x, self.c1, self.b1, padding=1)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, self.c2, self.b2, padding=1)), 2)
        return F.linear(x.flatten(1), self.w, self.b)


def test_small_cnn(digits, tmp_path):
    x = digits[0].reshape(-1, 1, 8, 8)
    model = SmallCNN(np.random.default_rng(1))
    path = export(model, x[:4], tmp_path / "cnn.onnx")
    check(model, path, (4, 9), lambda b: x[200 : 200 + b])


class TinyGPT(nn.Module):
    """Embedding (index_select), pre-norm causal self-attention and a GELU MLP, tied head."""

    def __init__(self, rng, vocab=50, ctx=8, dim=32, heads=4):
        self.heads, self.dim = heads, dim
        self.wte, self.wpe = param(rng, vocab, dim, scale=0.5), param(rng, ctx, dim, scale=0.1)
        self.ln1_w, self.ln1_b = param(rng, dim, scale=0.1) + 1.0, param(rng, dim, scale=0.1)
        self.qkv_w, self.qkv_b = param(rng, 3 * dim, dim), param(rng, 3 * dim, scale=0.1)
        self.o_w, self.o_b = param(rng, dim, dim), param(rng, dim, scale=0.1)
        self.ln2_w, self.ln2_b = param(rng, dim, scale=0.1) + 1.0, param(rng, dim, scale=0.1)
        self.fc_w, self.fc_b = param(rng, 4 * dim, dim), param(rng, 4 * dim, scale=0.1)
        self.pr_w, self.pr_b = param(rng, dim, 4 * dim), param(rng, dim, scale=0.1)
        self.lnf_w, self.lnf_b = param(rng, dim, scale=0.1) + 1.0, param(rng, dim, scale=0.1)
        self.mask = DEV.tensor(np.tril(np.ones((ctx, ctx), dtype=bool)))

    def forward(self, ids):
        b, t = ids.shape
        h, d = self.heads, self.dim // self.heads
        x = F.embedding(ids, self.wte) + self.wpe[:t]
        qkv = F.linear(F.layer_norm(x, self.ln1_w, self.ln1_b), self.qkv_w, self.qkv_b)
        q, k, v = (z.reshape(b, t, h, d).permute(0, 2, 1, 3) for z in F.split(qkv, self.dim, -1))
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        att = F.softmax(F.where(self.mask[:t, :t], att, -1e9), -1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(b, t, self.dim)
        x = x + F.linear(y, self.o_w, self.o_b)
        hid = F.gelu(F.linear(F.layer_norm(x, self.ln2_w, self.ln2_b), self.fc_w, self.fc_b))
        x = x + F.linear(hid, self.pr_w, self.pr_b)
        return F.linear(F.layer_norm(x, self.lnf_w, self.lnf_b), self.wte)


def test_tiny_gpt(tmp_path):
    rng = np.random.default_rng(2)
    model = TinyGPT(rng)
    tokens = lambda b: rng.integers(0, 50, size=(b, 8)).astype(np.int64)  # noqa: E731
    path = export(model, tokens(3), tmp_path / "gpt.onnx", output_names=["logits"])
    check(model, path, (3, 6, 1), tokens)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Gather", "Softmax", "Where", "Erf", "MatMul", "Shape"} <= ops


def test_external_data_above_the_threshold(digits, tmp_path):
    nn.seed(3)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    x = digits[0]
    path = export(model, x[:4], tmp_path / "big.onnx", max_inline_bytes=1024)
    assert (tmp_path / "big.onnx.data").stat().st_size >= 64 * 32 * 4
    assert (tmp_path / "big.onnx").stat().st_size < 64 * 32 * 4
    check(model, path, (4, 7), lambda b: x[:b])
    small = export(model, x[:4], tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()
    check(model, small, (2,), lambda b: x[:b])


class LoraLinear(nn.Module):
    """A stand-in for the LoRA API: merge_lora folds B @ A into the weight in place."""

    def __init__(self, rng):
        self.weight, self.a, self.b = param(rng, 6, 5), param(rng, 2, 5), param(rng, 6, 2)
        self.merged = False

    def _delta(self):
        return (self.b @ self.a).numpy() * 0.5

    def merge_lora(self):
        self.weight._assign(DEV.tensor(self.weight.numpy() + self._delta()))
        self.merged = True

    def unmerge_lora(self):
        self.weight._assign(DEV.tensor(self.weight.numpy() - self._delta()))
        self.merged = False

    def forward(self, x):
        y = F.linear(x, self.weight)
        return y if self.merged else y + F.linear(F.linear(x, self.a), self.b) * 0.5


def test_lora_is_merged_for_export_and_unmerged_after(tmp_path):
    model = LoraLinear(np.random.default_rng(4))
    before = model.weight.numpy()
    x = np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)
    path = export(model, x, tmp_path / "lora.onnx")
    assert not model.merged
    np.testing.assert_allclose(model.weight.numpy(), before, atol=1e-6)
    assert {t.name for t in onnx.load(str(path)).graph.initializer} == {"weight"}
    check(model, path, (3, 4), lambda b: np.resize(x, (b, 5)))


def test_batch_dependent_constants_are_refused_unless_static(tmp_path):
    centre = lambda x: x - x.mean(axis=0)  # noqa: E731  (1/B is baked into the graph)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(ExportError, match="dynamic_batch=False"):
        to_onnx(centre, x)
    path = export(centre, x, tmp_path / "static.onnx", dynamic_batch=False)
    (got,) = session(path).run(None, {"input": x})
    np.testing.assert_allclose(got, centre(DEV.tensor(x)).numpy(), atol=TOL)


def test_data_dependent_models_and_old_opsets_are_refused():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ExportError, match="reads tensor data"):
        to_onnx(lambda t: t * float(t.sum()), x)
    assert DEV._rec.pending == []
    with pytest.raises(ExportError, match="opset"):
        to_onnx(lambda t: t + 1, x, opset=17)
    model = to_onnx(lambda t: t + 1, x, opset=20)
    onnx.checker.check_model(model, full_check=True)


def test_sizes_that_follow_the_batch_are_computed_at_run_time(tmp_path):
    def fn(x):
        b = x.shape[0]
        y = F.cat([x, x[1:]], 0).reshape(2 * b - 1, 3)  # 2B - 1 rows: scale 2, offset -1
        z = DEV.zeros((b, 3)) + x[:, :1].expand(b, 3)  # a full and an expand of shape (B, 3)
        return y.sum(axis=1), z

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    path = export(fn, x, tmp_path / "dyn.onnx", output_names=["y", "z"])
    sess = session(path)
    for b in (4, 2, 7):
        xb = np.resize(x, (b, 3)) * 0.5
        refs = [t.numpy() for t in fn(DEV.tensor(xb))]
        for got, ref in zip(sess.run(None, {"input": xb}), refs):
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, atol=TOL)
    outs = onnx.load(str(path)).graph.output
    assert outs[1].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_real_lora_is_merged_for_export_and_unmerged_after(tmp_path):
    from burn_remote.lora import LoraConfig

    nn.seed(9)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2)).to(DEV)
    model.apply_lora(LoraConfig(r=2, alpha=4, target_modules=["0", "2"]))
    rng = np.random.default_rng(10)
    for name, t in model.named_tensors():  # B starts at zero: give the adapter an effect
        if "lora_B" in name:
            t._assign(DEV.tensor(rng.standard_normal(t.shape).astype(np.float32)))
    x = rng.standard_normal((3, 5)).astype(np.float32)
    before = {n: t.numpy() for n, t in model.named_tensors()}
    path = export(model, x, tmp_path / "m.onnx")
    names = {t.name for t in onnx.load(str(path)).graph.initializer}
    assert not any("lora" in n for n in names)  # the adapters were folded into the weights
    check(model, path, (3, 2), lambda b: np.resize(x, (b, 5)))
    for n, t in model.named_tensors():  # unmerged again afterwards
        np.testing.assert_allclose(t.numpy(), before[n], atol=1e-6)


def test_held_records_without_running():
    rec = DEV._rec
    x = DEV.tensor(np.ones(3, np.float32))
    with rec.held():
        y = x + 1
        assert [n.op for n in rec.pending] == ["full", "add"]
        with pytest.raises(OpFailed, match="held"):
            y.numpy()
        capture = rec.capture()
    assert [n.op for n in capture.graph.nodes] == ["full", "add"]
    assert rec.pending == []
