"""Forward values of convolution, pooling, normalisation, losses, randomness, quantisation
and fused optimizer ops against NumPy references (coverage: see test_ops_forward.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from burn_remote import RecordError
from burn_remote import _ops as client_ops
from burn_remote import functional as F
from burn_remote.protocol.ops_nn import NF4_CODEBOOK
from conftest import assert_close
from test_ops_forward import _f64, _rand

pytestmark = pytest.mark.usefixtures("op_trace")


# --- convolution and pooling -------------------------------------------------------------


def conv2d_ref(x, w, stride, padding, dilation, groups):
    """A direct loop over output positions: the definition, not another vectorisation."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for ki in range(kh):
                            for kj in range(kw):
                                acc += (
                                    xp[b, g * cg + ci, i * sh + ki * dh, j * sw + kj * dw]
                                    * w[oc, ci, ki, kj]
                                )
                    out[b, oc, i, j] = acc
    return out


CONV2D_CASES = [
    # x shape, w shape, stride, padding, dilation, groups
    ((1, 2, 5, 5), (3, 2, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ((2, 4, 6, 5), (6, 2, 3, 2), (2, 1), (1, 2), (1, 1), 2),
    ((1, 3, 7, 7), (3, 1, 3, 3), (1, 2), (2, 1), (2, 2), 3),
    ((2, 2, 4, 6), (4, 2, 1, 3), (3, 2), (0, 1), (1, 2), 1),
]


@pytest.mark.ops("conv2d")
@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups", CONV2D_CASES)
def test_conv2d(device, rng, xs, ws, stride, padding, dilation, groups):
    x, w = _rand(rng, xs, "float64"), _rand(rng, ws, "float64")
    y = F.conv2d(
        device.tensor(x),
        device.tensor(w),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
    )
    assert_close(y, conv2d_ref(x, w, stride, padding, dilation, groups))
    bias = _rand(rng, (ws[0],), "float64")
    yb = F.conv2d(
        device.tensor(x), device.tensor(w), device.tensor(bias), stride, padding, dilation, groups
    )
    assert_close(yb, conv2d_ref(x, w, stride, padding, dilation, groups) + bias[:, None, None])


@pytest.mark.ops("conv2d")
def test_conv2d_errors(cpu):
    x = cpu.tensor(np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(RecordError, match="groups=3"):
        F.conv2d(x, cpu.tensor(np.zeros((3, 2, 3, 3), np.float32)), groups=3)
    with pytest.raises(RecordError, match="does not fit"):
        F.conv2d(x, cpu.tensor(np.zeros((3, 4, 7, 7), np.float32)))


@pytest.mark.ops("conv1d")
@pytest.mark.parametrize(
    "xs,ws,stride,padding,dilation,groups",
    [
        ((2, 3, 9), (4, 3, 3), 1, 0, 1, 1),
        ((1, 4, 10), (6, 2, 3), 2, 1, 2, 2),
        ((2, 2, 5), (2, 1, 2), 3, 2, 1, 2),
    ],
)
def test_conv1d(device, rng, xs, ws, stride, padding, dilation, groups):
    x, w = _rand(rng, xs, "float64"), _rand(rng, ws, "float64")
    y = F.conv1d(
        device.tensor(x),
        device.tensor(w),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
    )
    want = conv2d_ref(
        x[:, :, None], w[:, :, None], (1, stride), (0, padding), (1, dilation), groups
    )[:, :, 0]
    assert y.shape == want.shape
    assert_close(y, want)


@pytest.mark.ops("conv2d_grad_input", "conv2d_grad_weight")
@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups", CONV2D_CASES)
def test_conv2d_backward_kernels_are_adjoints(
    device, rng, xs, ws, stride, padding, dilation, groups
):
    """<conv(x, w), g> = <x, grad_input(g, w)> = <w, grad_weight(x, g)>, with loop conv."""
    x, w = _rand(rng, xs, "float64"), _rand(rng, ws, "float64")
    y = conv2d_ref(x, w, stride, padding, dilation, groups)
    g = _rand(rng, y.shape, "float64")
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gx = F.conv2d_grad_input(device.tensor(g), device.tensor(w), input_shape=xs, **attrs).numpy()
    gw = F.conv2d_grad_weight(device.tensor(x), device.tensor(g), weight_shape=ws, **attrs).numpy()
    assert gx.shape == xs and gw.shape == ws
    inner = float((y * g).sum())
    assert math.isclose(float((x * gx).sum()), inner, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(float((w * gw).sum()), inner, rel_tol=1e-9, abs_tol=1e-9)
    # and element by element: d<y, g>/dw[k] is the conv of x with a unit kernel at k
    for k in [(0, 0, 0, 0), tuple(d - 1 for d in ws)]:
        e = np.zeros(ws)
        e[k] = 1.0
        assert math.isclose(
            gw[k],
            float((conv2d_ref(x, e, stride, padding, dilation, groups) * g).sum()),
            rel_tol=1e-9,
            abs_tol=1e-9,
        )


def pool_ref(x, kernel, stride, padding, mode):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            out[:, :, i, j] = (
                win.max(axis=(2, 3)) if mode == "max" else win.sum(axis=(2, 3)) / (kh * kw)
            )
    return out


POOL_CASES = [
    ((1, 2, 6, 6), (2, 2), None, (0, 0)),
    ((2, 3, 7, 5), (3, 2), (2, 1), (1, 1)),
    ((1, 1, 5, 5), (3, 3), (1, 1), (1, 0)),
    ((1, 2, 4, 4), 2, 1, 0),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@pytest.mark.ops("max_pool2d", "avg_pool2d")
@pytest.mark.parametrize("xs,kernel,stride,padding", POOL_CASES)
def test_pools(device, rng, xs, kernel, stride, padding):
    x = _rand(rng, xs, "float64")
    t = device.tensor(x)
    k = _pair(kernel)
    s = _pair(stride) if stride is not None else k
    p = _pair(padding)
    assert_close(F.max_pool2d(t, kernel, stride, padding), pool_ref(x, k, s, p, "max"))
    assert_close(F.avg_pool2d(t, kernel, stride, padding), pool_ref(x, k, s, p, "avg"))


@pytest.mark.ops("max_pool2d_backward", "avg_pool2d_backward")
@pytest.mark.parametrize("xs,kernel,stride,padding", POOL_CASES)
def test_pool_backward_kernels(device, rng, xs, kernel, stride, padding):
    # distinct values so every window has one maximum
    x = rng.permutation(np.prod(xs)).reshape(xs).astype(np.float64)
    k = _pair(kernel)
    s = _pair(stride) if stride is not None else k
    p = _pair(padding)
    y = pool_ref(x, k, s, p, "max")
    g = _rand(rng, y.shape, "float64")
    attrs = dict(kernel=kernel, stride=stride, padding=padding)
    gx = F.max_pool2d_backward(device.tensor(x), device.tensor(g), **attrs).numpy()
    want = np.zeros(xs)
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=-np.inf)
    for b in range(xs[0]):
        for c in range(xs[1]):
            for i in range(y.shape[2]):
                for j in range(y.shape[3]):
                    win = xp[b, c, i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]]
                    a, bb = np.unravel_index(np.argmax(win), win.shape)
                    want[b, c, i * s[0] + a - p[0], j * s[1] + bb - p[1]] += g[b, c, i, j]
    assert_close(gx, want)
    # avg: adjoint of the average pool
    ga = F.avg_pool2d_backward(device.tensor(g), input_shape=xs, **attrs).numpy()
    assert ga.shape == xs
    ya = pool_ref(x, k, s, p, "avg")
    assert math.isclose(float((x * ga).sum()), float((ya * g).sum()), rel_tol=1e-9)


@pytest.mark.ops("max_pool2d", "max_pool2d_backward")
@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "float16"])
def test_max_pool_pads_below_every_value(device, rng, dtype):
    from burn_remote.protocol.dtypes import to_numpy

    low = 0 if dtype == "uint8" else -100
    x = rng.integers(low, low + 50, (1, 2, 4, 5)).astype(to_numpy(dtype))
    with np.errstate(invalid="raise"):  # no -inf cast into an integer
        y = F.max_pool2d(device.tensor(x), 3, 1, 1)
        assert y.dtype == dtype
        want = pool_ref(x.astype(np.float64), (3, 3), (1, 1), (1, 1), "max")
        np.testing.assert_array_equal(y.numpy().astype(np.float64), want)
        g = F.max_pool2d_backward(
            device.tensor(x),
            device.tensor(np.ones(y.shape, np.float32)),
            kernel=3,
            stride=1,
            padding=1,
        )
        assert g.numpy().sum() == y.size  # every window routes its gradient to a real input


@pytest.mark.ops("max_pool2d")
def test_pool_errors(cpu):
    with pytest.raises(RecordError, match="4-d"):
        F.max_pool2d(cpu.tensor(np.zeros((2, 3, 4), np.float32)), 2)
    with pytest.raises(RecordError, match="half the kernel"):
        F.max_pool2d(cpu.tensor(np.zeros((1, 1, 4, 4), np.float32)), 2, 1, 2)


# --- normalisation, dropout, losses -------------------------------------------------------


def layer_norm_ref(x, w, b, n_axes, eps):
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.ops("layer_norm")
def test_layer_norm(device, rng):
    x = _rand(rng, (3, 4, 5), "float64", -3, 5)
    w, b = _rand(rng, (5,), "float64"), _rand(rng, (5,), "float64")
    t = device.tensor(x)
    assert_close(
        F.layer_norm(t, device.tensor(w), device.tensor(b)), layer_norm_ref(x, w, b, 1, 1e-5)
    )
    assert_close(F.layer_norm(t), layer_norm_ref(x, None, None, 1, 1e-5))
    assert_close(F.layer_norm(t, device.tensor(w)), layer_norm_ref(x, w, None, 1, 1e-5))
    w2 = _rand(rng, (4, 5), "float64")
    assert_close(F.layer_norm(t, device.tensor(w2), eps=0.1), layer_norm_ref(x, w2, None, 2, 0.1))
    x32 = x.astype(np.float32)
    assert_close(
        F.layer_norm(device.tensor(x32)),
        layer_norm_ref(_f64(x32), None, None, 1, 1e-5),
        "float32",
        atol=1e-5,
    )


@pytest.mark.ops("rms_norm")
def test_rms_norm(device, rng):
    x = _rand(rng, (3, 4, 5), "float64")
    w = _rand(rng, (5,), "float64")
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    assert_close(F.rms_norm(device.tensor(x), device.tensor(w)), want)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 0.5)
    assert_close(F.rms_norm(device.tensor(x), eps=0.5), want)


@pytest.mark.ops("dropout")
def test_dropout(device, rng):
    x = _rand(rng, (200, 50), "float32", 1, 2)
    t = device.tensor(x)
    a = F.dropout(t, 0.3, key=7).numpy()
    b = F.dropout(t, 0.3, key=7).numpy()
    c = F.dropout(t, 0.3, key=8).numpy()
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    kept = a != 0
    assert 0.65 < kept.mean() < 0.75
    np.testing.assert_allclose(a[kept], x[kept] / 0.7, rtol=1e-6)
    assert F.dropout(t, 0.3, key=7, training=False) is t
    np.testing.assert_array_equal(F.call("dropout", t, device.scalar(1, "int64"), p=0.0).numpy(), x)
    with pytest.raises(RecordError, match=r"\[0, 1\)"):
        F.dropout(t, 1.0, key=1)


def cross_entropy_ref(logits, target, ignore_index=-100, label_smoothing=0.0):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    valid = target != ignore_index
    safe = np.where(valid, target, 0)
    nll = -np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    loss = (1 - label_smoothing) * nll - label_smoothing * logp.mean(-1)
    return (loss * valid).sum() / max(valid.sum(), 1)


@pytest.mark.ops("cross_entropy")
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy(device, rng, label_smoothing):
    logits = _rand(rng, (6, 5), "float64", -4, 4)
    target = rng.integers(0, 5, 6)
    t_l, t_t = device.tensor(logits), device.tensor(target)
    y = F.cross_entropy(t_l, t_t, label_smoothing=label_smoothing)
    assert y.shape == ()
    assert_close(y, cross_entropy_ref(logits, target, label_smoothing=label_smoothing))
    # ignore_index drops samples from both numerator and the count
    target[[1, 4]] = -100
    y = F.cross_entropy(t_l, device.tensor(target), label_smoothing=label_smoothing)
    assert_close(y, cross_entropy_ref(logits, target, label_smoothing=label_smoothing))
    target2 = target.copy()
    target2[target2 == -100] = 3
    target2[0] = 7
    y = F.cross_entropy(
        t_l, device.tensor(target2), ignore_index=7, label_smoothing=label_smoothing
    )
    assert_close(y, cross_entropy_ref(logits, target2, 7, label_smoothing))
    # a (N, T, C) batch
    l3 = _rand(rng, (2, 3, 4), "float64")
    t3 = rng.integers(0, 4, (2, 3))
    assert_close(F.cross_entropy(device.tensor(l3), device.tensor(t3)), cross_entropy_ref(l3, t3))
    # every target ignored: 0, not nan
    allign = np.full(6, -100)
    assert F.cross_entropy(t_l, device.tensor(allign)).item() == 0.0
    # narrow integer targets (uint8 labels are common) work, and -100 still means "ignore"
    for dt in (np.uint8, np.int32):
        small = rng.integers(0, 5, 6).astype(dt)
        y = F.cross_entropy(t_l, device.tensor(small), label_smoothing=label_smoothing)
        assert_close(y, cross_entropy_ref(logits, small.astype(np.int64), -100, label_smoothing))
    with pytest.raises(RecordError, match="integer classes"):
        F.cross_entropy(t_l, device.tensor(target.astype(np.float32)))
    with pytest.raises(RecordError, match="class axis"):
        F.cross_entropy(t_l, device.tensor(target[:3]))


@pytest.mark.ops("cross_entropy_backward")
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_backward(device, rng, label_smoothing):
    """The fused gradient against its formula: (softmax - (1-s) onehot - s/C) g / count."""
    logits = _rand(rng, (6, 5), "float64", -4, 4)
    for ignored in ([], [2]):  # every row counted (the kernels' fast path), and one ignored
        target = rng.integers(0, 5, 6)
        target[ignored] = -100
        g = 1.5
        out = F.call(
            "cross_entropy_backward",
            device.tensor(np.asarray(g)),
            device.tensor(logits),
            device.tensor(target),
            label_smoothing=label_smoothing,
        )
        z = np.exp(logits - logits.max(-1, keepdims=True))
        p = z / z.sum(-1, keepdims=True)
        valid = target != -100
        hot = np.eye(5)[np.where(valid, target, 0)]
        ref = (p - (1 - label_smoothing) * hot - label_smoothing / 5) * valid[:, None]
        assert out.shape == logits.shape
        assert_close(out, ref * g / valid.sum())


@pytest.mark.ops("mse_loss")
def test_mse_loss(device, rng):
    x, y = _rand(rng, (4, 3), "float64"), _rand(rng, (4, 3), "float64")
    assert_close(F.mse_loss(device.tensor(x), device.tensor(y)), ((x - y) ** 2).mean())
    yb = _rand(rng, (3,), "float64")
    assert_close(F.mse_loss(device.tensor(x), device.tensor(yb)), ((x - yb) ** 2).mean())


# --- randomness -------------------------------------------------------------------------


def _mix32(x):
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def documented_uniform(key, i, stream):
    """protocol.ops_nn.RANDOM_DOC, in plain Python integers: the cross-backend contract."""
    k = key & 0xFFFFFFFFFFFFFFFF
    lo, hi = k & 0xFFFFFFFF, k >> 32
    seed = _mix32(lo ^ _mix32((hi + 0x9E3779B9 * (stream + 1)) & 0xFFFFFFFF))
    return (_mix32(i ^ seed) >> 8) * 2.0**-24


@pytest.mark.ops("uniform")
def test_uniform_follows_the_documented_counter_hash(device):
    for key in (0, 1, 12345, 2**40 + 3):
        u = device.uniform((6,), key, dtype="float64").numpy()
        want = [documented_uniform(key, i, 0) for i in range(6)]
        np.testing.assert_array_equal(u, want)


@pytest.mark.ops("uniform")
def test_uniform(device):
    a = device.uniform((20000,), 3).numpy()
    b = device.uniform((20000,), 3).numpy()
    c = device.uniform((20000,), 4).numpy()
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.99
    assert a.dtype == np.float32 and a.min() >= 0 and a.max() < 1
    assert abs(a.mean() - 0.5) < 0.02 and abs(a.var() - 1 / 12) < 0.01
    r = device.uniform((4000,), 5, low=-3.0, high=1.0, dtype="float64").numpy()
    assert r.dtype == np.float64 and r.min() >= -3 and r.max() < 1
    assert abs(r.mean() + 1) < 0.1
    assert device.uniform((3, 0), 1).numpy().shape == (3, 0)
    assert device.uniform((), 1).numpy().shape == ()
    assert device.uniform((5,), 1, dtype="float16").dtype == "float16"
    with pytest.raises(RecordError, match="floating"):
        device.uniform((3,), 1, dtype="int32")
    with pytest.raises(RecordError, match="key"):
        F.uniform(device.tensor([1, 2]), shape=(2,))


@pytest.mark.ops("normal")
def test_normal(device):
    a = device.normal((20000,), 11).numpy()
    np.testing.assert_array_equal(a, device.normal((20000,), 11).numpy())
    assert (a != device.normal((20000,), 12).numpy()).mean() > 0.99
    assert np.isfinite(a).all()
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05
    assert 0.01 < (np.abs(a) > 2.5).mean() < 0.02  # tails of N(0, 1): P(|z| > 2.5) ~ 0.0124
    b = device.normal((20000,), 11, mean=3.0, std=0.5, dtype="float64").numpy()
    assert b.dtype == np.float64
    assert abs(b.mean() - 3) < 0.03 and abs(b.std() - 0.5) < 0.03


@pytest.mark.ops("randint")
def test_randint(device):
    a = device.randint((10000,), 21, low=-3, high=4).numpy()
    np.testing.assert_array_equal(a, device.randint((10000,), 21, low=-3, high=4).numpy())
    assert (a != device.randint((10000,), 22, low=-3, high=4).numpy()).any()
    assert a.dtype == np.int64
    assert set(np.unique(a)) == set(range(-3, 4))
    counts = np.bincount(a + 3)
    assert counts.min() > 10000 / 7 * 0.85
    assert device.randint((5,), 1, high=10, dtype="int32").dtype == "int32"
    with pytest.raises(RecordError, match="exceed"):
        device.randint((3,), 1, low=5, high=5)


# --- quantisation ---------------------------------------------------------------------------


@pytest.mark.ops("quantize_int8", "dequantize_int8")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_int8_round_trip(device, rng, dtype):
    from burn_remote.protocol.dtypes import to_numpy

    x = (rng.standard_normal((4, 64)) * rng.uniform(0.01, 10, (4, 1))).astype(to_numpy(dtype))
    x[2] = 0  # an all-zero block survives
    q, s = F.quantize_int8(device.tensor(x))
    assert q.dtype == "int8" and q.shape == (256,) and s.dtype == "float32" and s.shape == (4,)
    xf = _f64(x)
    absmax = np.abs(xf).max(axis=1)
    assert_close(s, absmax, "float32", rtol=1e-6)
    qn = q.numpy()
    assert qn.min() >= -127
    y = F.dequantize_int8(q, s, shape=(4, 64), dtype="float32").numpy()
    assert y.shape == (4, 64)
    err = np.abs(y - xf)
    bound = absmax[:, None] / 127 / 2 * (1 + 1e-5) + 1e-12
    assert (err <= bound).all(), f"int8 error {err.max()} over its bound"
    assert (y[2] == 0).all()
    # block 32, and a non-float32 output dtype
    q2, s2 = F.quantize_int8(device.tensor(x), block=32)
    assert s2.shape == (8,)
    y2 = F.dequantize_int8(q2, s2, block=32, shape=(4, 64), dtype="float16")
    assert y2.dtype == "float16"
    absmax32 = np.abs(xf.reshape(8, 32)).max(axis=1, keepdims=True)
    bound32 = (absmax32 / 127 / 2 + absmax32 * 2**-10).repeat(32, 1).reshape(4, 64)
    assert (np.abs(_f64(y2.numpy()) - xf) <= bound32).all()


@pytest.mark.ops("quantize_int8", "quantize_nf4")
def test_quantize_refuses_ragged_blocks(cpu):
    with pytest.raises(RecordError, match="blocks of 64"):
        F.quantize_int8(cpu.tensor(np.zeros(100, np.float32)))
    with pytest.raises(RecordError, match="blocks of 64"):
        F.quantize_nf4(cpu.tensor(np.zeros(96, np.float32)))
    with pytest.raises(RecordError, match="floating"):
        F.quantize_nf4(cpu.tensor(np.zeros(64, np.int32)))


@pytest.mark.ops("quantize_nf4", "dequantize_nf4")
def test_nf4_round_trip(device, rng):
    x = (rng.standard_normal((3, 128)) * 2).astype(np.float32)
    x[1, :64] = 0
    q, s = F.quantize_nf4(device.tensor(x))
    assert q.dtype == "uint8" and q.shape == (192,) and s.shape == (6,)
    y = F.dequantize_nf4(q, s, shape=(3, 128)).numpy()
    codebook = np.asarray(NF4_CODEBOOK)
    xb = _f64(x).reshape(-1, 64)
    absmax = np.abs(xb).max(axis=1)
    normed = xb / np.where(absmax > 0, absmax, 1)[:, None]
    nearest = codebook[np.abs(normed[..., None] - codebook).argmin(-1)]
    # each value goes to its nearest level (ties may go either way)
    assert_close(y.reshape(-1, 64), nearest * absmax[:, None], "float32", atol=1e-6)
    gaps = np.diff(codebook).max() / 2
    assert (np.abs(y.reshape(-1, 64) - xb) <= gaps * absmax[:, None] + 1e-6).all()
    assert (y[1, :64] == 0).all()
    # packing: element 2i in the low nibble, 2i + 1 in the high nibble
    codes = np.abs(normed.reshape(-1)[:, None] - codebook).argmin(-1)
    packed = q.numpy()
    np.testing.assert_array_equal(packed & 0x0F, codes[0::2])
    np.testing.assert_array_equal(packed >> 4, codes[1::2])
    # extremes map to the ends of the codebook
    ends = np.zeros(64, np.float32)
    ends[0], ends[1] = -3.0, 3.0
    qe, se = F.quantize_nf4(device.tensor(ends))
    ye = F.dequantize_nf4(qe, se, shape=(64,)).numpy()
    assert ye[0] == -3.0 and ye[1] == 3.0


@pytest.mark.ops("dequantize_int8")
def test_dequantize_checks_shapes(cpu):
    q = cpu.tensor(np.zeros(128, np.int8))
    s = cpu.tensor(np.ones(2, np.float32))
    with pytest.raises(RecordError, match="do not describe"):
        F.dequantize_int8(q, s, shape=(3, 64))


# --- fused optimizer updates ----------------------------------------------------------------


def adam_ref(p, g, m, v, lr, t, beta1, beta2, eps, wd, decoupled):
    if wd and not decoupled:
        g = g + wd * p
    if wd and decoupled:
        p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat = m / (1 - beta1**t)
    vhat = v / (1 - beta2**t)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


@pytest.mark.ops("adam_update")
@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_update(device, rng, decoupled, wd):
    p, g = _rand(rng, (4, 3), "float64"), _rand(rng, (4, 3), "float64")
    m, v = _rand(rng, (4, 3), "float64") * 0.1, np.abs(_rand(rng, (4, 3), "float64")) * 0.01
    lr, t, beta1, beta2, eps = 0.01, 3, 0.8, 0.95, 1e-6
    outs = F.adam_update(
        device.tensor(p),
        device.tensor(g),
        device.tensor(m),
        device.tensor(v),
        device.scalar(lr, "float64"),
        device.scalar(1 - beta1**t, "float64"),
        device.scalar(1 - beta2**t, "float64"),
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=wd,
        decoupled=decoupled,
    )
    assert len(outs) == 3
    for got, want in zip(outs, adam_ref(p, g, m, v, lr, t, beta1, beta2, eps, wd, decoupled)):
        assert_close(got, want, rtol=1e-12, atol=1e-14)
    if wd:
        other = F.adam_update(
            *(device.tensor(a) for a in (p, g, m, v)),
            *(device.scalar(a, "float64") for a in (lr, 1 - beta1**t, 1 - beta2**t)),
            beta1=beta1,
            beta2=beta2,
            eps=eps,
            weight_decay=wd,
            decoupled=not decoupled,
        )[0].numpy()
        assert not np.allclose(other, outs[0].numpy(), rtol=1e-9, atol=0)


@pytest.mark.ops("adam_update")
def test_adam_update_float32_and_shape_errors(device, rng):
    p = _rand(rng, (5,))
    outs = F.adam_update(
        *(device.tensor(a) for a in (p, p * 0.5, np.zeros(5, np.float32), np.zeros(5, np.float32))),
        device.scalar(0.1),
        device.scalar(0.1),
        device.scalar(0.001),
    )
    assert all(o.dtype == "float32" for o in outs)
    want = adam_ref(_f64(p), _f64(p) * 0.5, 0, 0, 0.1, 1, 0.9, 0.999, 1e-8, 0, True)[0]
    assert_close(outs[0], want, "float32")
    with pytest.raises(RecordError, match="must match"):
        F.adam_update(
            device.tensor(p),
            device.tensor(p[:3]),
            device.tensor(p),
            device.tensor(p),
            device.scalar(0.1),
            device.scalar(0.1),
            device.scalar(0.1),
        )


def sgd_ref(p, g, buf, lr, momentum, dampening, nesterov, wd):
    g = g + wd * p
    if momentum:
        buf = momentum * buf + (1 - dampening) * g
        step = g + momentum * buf if nesterov else buf
    else:
        step = g
    return p - lr * step, buf


@pytest.mark.ops("sgd_update")
@pytest.mark.parametrize(
    "momentum,dampening,nesterov,wd",
    [
        (0.0, 0.0, False, 0.0),
        (0.9, 0.0, False, 0.0),
        (0.9, 0.1, True, 0.01),
        (0.5, 0.5, False, 0.1),
    ],
)
def test_sgd_update(device, rng, momentum, dampening, nesterov, wd):
    p, g, buf = (_rand(rng, (3, 4), "float64") for _ in range(3))
    outs = F.sgd_update(
        device.tensor(p),
        device.tensor(g),
        device.tensor(buf),
        device.scalar(0.05, "float64"),
        momentum=momentum,
        dampening=dampening,
        nesterov=nesterov,
        weight_decay=wd,
    )
    for got, want in zip(outs, sgd_ref(p, g, buf, 0.05, momentum, dampening, nesterov, wd)):
        assert_close(got, want, rtol=1e-12, atol=1e-14)


# --- bad input is refused at record time with the op's name -------------------------------


@pytest.mark.ops("reshape")
def test_unknown_attribute_names_the_op(cpu):
    with pytest.raises(RecordError, match="reshape: unknown attribute"):
        F.reshape(cpu.tensor([1.0]), shape=(1,), order="F")


def test_unknown_op(cpu):
    with pytest.raises(AttributeError):
        F.no_such_op  # noqa: B018
    with pytest.raises(RecordError, match="unknown op"):
        client_ops.call("no_such_op", cpu.tensor([1.0]))
