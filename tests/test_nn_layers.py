"""nn layers against NumPy references, dropout keys, state_dict via safetensors, and
gradients of attention and normalisation against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, nn
from burn_remote import functional as F

DEV = Device.cpu()


def test_linear_embedding_norms_match_numpy():
    nn.seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    lin = nn.Linear(6, 5)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    np.testing.assert_allclose(lin(DEV.tensor(x)).numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)

    emb = nn.Embedding(10, 4)
    ids = np.array([[1, 9, 1]])
    np.testing.assert_array_equal(emb(DEV.tensor(ids)).numpy(), emb.weight.numpy()[ids])

    ln = nn.LayerNorm(6)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(
        ln(DEV.tensor(x)).numpy(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5
    )
    rms = nn.RMSNorm(6)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(rms(DEV.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)


def test_conv2d_and_maxpool_match_numpy():
    nn.seed(1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    w, b = conv.weight.numpy(), conv.bias.numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 4, 6, 6), np.float32)
    for i in range(6):
        for j in range(6):
            want[:, :, i, j] = np.einsum("ncij,ocij->no", xp[:, :, i : i + 3, j : j + 3], w)
    want += b[None, :, None, None]
    np.testing.assert_allclose(conv(DEV.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)

    pooled = nn.MaxPool2d(2)(DEV.tensor(x)).numpy()
    np.testing.assert_array_equal(pooled, x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)))
    net = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 2))
    assert net(DEV.tensor(x)).shape == (2, 2)


def test_dropout_new_mask_each_step_same_graph():
    drop = nn.Dropout(0.5)
    x = DEV.tensor(np.ones((64,), np.float32))
    masks, graphs = [], []
    for _ in range(4):
        y = drop(x * 1.0).numpy()
        masks.append(y)
        graphs.append(DEV.stats()["graphs_registered"])
    assert set(np.unique(np.concatenate(masks))) <= {0.0, 2.0}
    assert not np.array_equal(masks[0], masks[1])
    assert graphs[1:] == [graphs[1]] * 3
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), np.ones(64, np.float32))


def test_state_dict_roundtrip_via_safetensors(tmp_path):
    nn.seed(2)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    model.register_buffer("steps", DEV.tensor(np.array([7], np.int64)))
    model.register_buffer("scratch", DEV.zeros((2,)), persistent=False)
    path = tmp_path / "model.safetensors"
    model.save(path, metadata={"note": "test"})
    sd = nn.load_safetensors(path)
    assert set(sd) == {"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias", "steps"}
    nn.seed(99)
    other = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    other.register_buffer("steps", DEV.tensor(np.array([0], np.int64)))
    w = other[0].weight
    other.load(path)
    assert other[0].weight is w  # same objects: optimizers keep their references
    x = DEV.tensor(np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())
    assert other.steps.numpy().tolist() == [7]
    with pytest.raises(KeyError, match="missing"):
        nn.Sequential(nn.Linear(4, 8)).load(path)


def _fd_check(f, inputs, n_probe=6, eps=1e-6, seed=0):
    """Compare backward() gradients of scalar f(*inputs) with central differences."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, np.float64) for a in inputs]
    ts = [DEV.tensor(a, requires_grad=True) for a in arrays]
    f(*ts).backward()
    for k, (a, t) in enumerate(zip(arrays, ts)):
        grad = t.grad.numpy()
        for _ in range(n_probe):
            idx = tuple(rng.integers(0, s) for s in a.shape)
            hi, lo = [x.copy() for x in arrays], [x.copy() for x in arrays]
            hi[k][idx] += eps
            lo[k][idx] -= eps
            up = f(*[DEV.tensor(x) for x in hi]).item()
            down = f(*[DEV.tensor(x) for x in lo]).item()
            assert grad[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-7)


def test_attention_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)) for _ in range(3))
    r = DEV.tensor(rng.standard_normal((2, 2, 5, 4)))
    mask = nn.causal_mask(5)

    def f(q, k, v):
        return (nn.scaled_dot_product_attention(q, k, v, mask) * r).sum()

    _fd_check(f, [q, k, v])


def test_layer_norm_and_block_gradients_match_finite_differences():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 8))
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    r = DEV.tensor(rng.standard_normal((2, 3, 8)))
    _fd_check(lambda x, w, b: (F.layer_norm(x, w, b) * r).sum(), [x, w, b])

    nn.seed(7)
    block = nn.TransformerBlock(8, 2, context=3)
    for _, t in block.named_tensors():
        t._assign(t.cast("float64"))
    _fd_check(lambda x: (block(x) * r).sum(), [x])
    (block(DEV.tensor(x)) * r).sum().backward()
    for name, t in block.named_parameters():
        assert t.grad is not None and t.grad.shape == t.shape, name


def test_multi_head_attention_is_causal():
    nn.seed(8)
    mha = nn.MultiHeadAttention(8, 2, context=6)
    x = np.random.default_rng(8).standard_normal((1, 6, 8)).astype(np.float32)
    y1 = mha(DEV.tensor(x)).numpy()
    x[:, 4:] += 1.0
    y2 = mha(DEV.tensor(x)).numpy()
    np.testing.assert_allclose(y1[:, :4], y2[:, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(y1[:, 4:], y2[:, 4:])
    assert mha(DEV.tensor(x[:, :3])).shape == (1, 3, 8)
    assert "mask" not in dict(mha.named_tensors())
