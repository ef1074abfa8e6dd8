"""Forward values of reductions, matmul and movement/indexing ops against NumPy (see
test_ops_forward.py for how op coverage is checked across these files)."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import RecordError
from burn_remote import functional as F
from conftest import assert_close
from scipy import special
from test_ops_forward import _f64, _rand

pytestmark = pytest.mark.usefixtures("op_trace")


# --- reductions -------------------------------------------------------------------------

REDUCE = {
    "sum": np.sum,
    "mean": np.mean,
    "var": np.var,
    "max": np.max,
    "min": np.min,
    "logsumexp": special.logsumexp,
}
AXES = [None, 0, -1, (0, 2), (1,), (-1, 0)]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(REDUCE)]
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(device, rng, name, keepdims):
    x = _rand(rng, (2, 3, 4), "float32")
    t = device.tensor(x)
    for axes in AXES:
        y = getattr(F, name)(t, axes=axes, keepdims=keepdims)
        want = REDUCE[name](_f64(x), axis=axes, keepdims=keepdims)
        assert_close(y, want, "float32", rtol=1e-5, atol=1e-6)
    # 0-d input reduces to itself
    s = device.tensor(np.float32(1.5))
    assert_close(getattr(F, name)(s), REDUCE[name](1.5), "float32")


@pytest.mark.ops("sum", "mean", "logsumexp")
def test_reductions_over_empty(device):
    e = device.tensor(np.zeros((0, 3), np.float32))
    assert_close(F.sum(e, axes=0), np.zeros(3))
    assert_close(F.sum(e, axes=1), np.zeros(0))
    assert_close(F.sum(e), np.float64(0))
    assert_close(F.logsumexp(e, axes=0), np.full(3, -np.inf))
    assert_close(F.logsumexp(e, axes=1), np.zeros(0))
    assert F.mean(e, axes=1).shape == (0,)


@pytest.mark.ops("max", "min")
def test_max_of_empty_axis_is_refused_at_record_time(cpu):
    e = cpu.tensor(np.zeros((0, 3), np.float32))
    with pytest.raises(RecordError, match="empty"):
        F.max(e, axes=0)
    with pytest.raises(RecordError, match="empty"):
        e.min()
    assert F.max(e, axes=1).shape == (0,)


@pytest.mark.ops("var")
@pytest.mark.parametrize("correction", [0, 1])
def test_var_correction(device, rng, correction):
    x = _rand(rng, (4, 5), "float64")
    for axes in (None, 0, 1):
        y = F.var(device.tensor(x), axes=axes, correction=correction)
        assert_close(y, np.var(x, axis=axes, ddof=correction))
    assert_close(device.tensor(x).var(1, correction=correction), np.var(x, 1, ddof=correction))


@pytest.mark.ops("sum", "mean", "max")
def test_reduction_dtypes(device):
    i8 = device.tensor(np.array([100, 100, 100], np.int8))
    assert F.sum(i8).dtype == "int64" and F.sum(i8).item() == 300
    b = device.tensor(np.array([True, True, False]))
    assert F.sum(b).dtype == "int64" and F.sum(b).item() == 2
    m = F.mean(device.tensor(np.array([1, 2], np.int64)))
    assert m.dtype == "float32" and m.item() == 1.5
    assert F.max(device.tensor(np.array([3, 9, 2], np.int32))).dtype == "int32"
    h = device.tensor(np.ones(4, np.float16))
    assert F.sum(h).dtype == "float16"


@pytest.mark.ops("logsumexp")
def test_logsumexp_is_stable(device):
    x = np.array([[1000.0, 1000.0], [-1000.0, -1001.0], [-np.inf, 0.0]], np.float32)
    assert_close(F.logsumexp(device.tensor(x), axes=1), special.logsumexp(_f64(x), axis=1))


@pytest.mark.ops("argmax", "argmin")
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin(device, rng, keepdims):
    # small integers: ties are common, and the first index must win as in NumPy
    x = rng.integers(0, 4, (3, 4, 5)).astype(np.float32)
    t = device.tensor(x)
    for axis in (None, 0, 1, -1):
        for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
            y = getattr(F, name)(t, axis=axis, keepdims=keepdims)
            assert y.dtype == "int64"
            want = ref(x, axis=axis, keepdims=keepdims)
            np.testing.assert_array_equal(y.numpy(), want, err_msg=f"{name} axis={axis}")
    assert t.argmax().item() == int(np.argmax(x))
    with pytest.raises(RecordError, match="empty"):
        F.argmax(device.tensor(np.zeros((0, 3))), axis=0)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.ops("softmax", "log_softmax")
def test_softmax(device, rng):
    x = _rand(rng, (3, 4, 5), "float32", -5, 5)
    x[0, 0, 0] = 80.0  # stays finite
    t = device.tensor(x)
    for axis in (0, 1, -1):
        sm = _softmax(_f64(x), axis)
        assert_close(F.softmax(t, axis=axis), sm, "float32")
        assert_close(F.log_softmax(t, axis=axis), np.log(sm), "float32", atol=1e-5)
    assert_close(t.softmax(), _softmax(_f64(x), -1), "float32")
    big = device.tensor(np.array([1e4, 0.0, -1e4], np.float32))
    assert_close(F.softmax(big), [1.0, 0.0, 0.0])
    assert_close(F.log_softmax(big), [0.0, -1e4, -2e4])
    with pytest.raises(RecordError, match="floating"):
        F.softmax(device.tensor([1, 2]))


@pytest.mark.ops("softmax", "log_softmax")
def test_softmax_of_empty(device):
    e = device.tensor(np.zeros((0, 3), np.float32))
    for axis in (0, 1):
        assert F.softmax(e, axis=axis).numpy().shape == (0, 3)
        assert F.log_softmax(e, axis=axis).numpy().shape == (0, 3)


# --- matmul -------------------------------------------------------------------------------


@pytest.mark.ops("matmul")
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((3, 0), (0, 2)),
        ((0, 3), (3, 2)),
        ((1, 3, 4), (2, 4, 1)),
    ],
)
def test_matmul(device, rng, sa, sb):
    a, b = _rand(rng, sa), _rand(rng, sb)
    y = device.tensor(a) @ device.tensor(b)
    want = _f64(a) @ _f64(b)
    assert y.shape == want.shape
    assert_close(y, want, "float32", rtol=1e-5, atol=1e-5)


@pytest.mark.ops("matmul")
def test_matmul_integers_and_errors(device, rng):
    a = rng.integers(-5, 5, (2, 3)).astype(np.int32)
    b = rng.integers(-5, 5, (3, 2)).astype(np.int64)
    y = F.matmul(device.tensor(a), device.tensor(b))
    assert y.dtype == "int64"
    np.testing.assert_array_equal(y.numpy(), a.astype(np.int64) @ b)
    with pytest.raises(RecordError, match=r"inner dimensions.*\(2, 3\).*\(2, 3\)"):
        device.tensor(a) @ device.tensor(a)


# --- movement -------------------------------------------------------------------------------


@pytest.mark.ops("reshape")
def test_reshape(device, rng):
    x = _rand(rng, (2, 3, 4))
    t = device.tensor(x)
    assert_close(t.reshape(6, -1), x.reshape(6, -1))
    assert_close(t.reshape(-1), x.reshape(-1))
    assert_close(F.reshape(t, shape=(4, 3, 2)), x.reshape(4, 3, 2))
    assert_close(device.tensor(np.ones((1, 1))).reshape(()), np.float32(1))
    assert_close(device.tensor(np.zeros((0, 3))).reshape(3, 0, 5), np.zeros((3, 0, 5)))
    with pytest.raises(RecordError, match="cannot reshape"):
        t.reshape(5, -1)
    with pytest.raises(RecordError, match="cannot reshape"):
        t.reshape(7, 3)


@pytest.mark.ops("permute", "transpose")
def test_permute_transpose(device, rng):
    x = _rand(rng, (2, 3, 4))
    t = device.tensor(x)
    assert_close(t.permute(2, 0, 1), x.transpose(2, 0, 1))
    assert_close(t.permute(-1, 0, 1), x.transpose(2, 0, 1))
    assert_close(t.transpose(), x.swapaxes(-2, -1))
    assert_close(t.transpose(0, 2), x.swapaxes(0, 2))
    assert_close(F.transpose(t, dim0=0, dim1=1), x.swapaxes(0, 1))
    assert_close(t.T, x.T)
    with pytest.raises(RecordError, match="permutation"):
        t.permute(0, 0, 1)


@pytest.mark.ops("expand")
def test_expand(device, rng):
    x = _rand(rng, (3, 1))
    t = device.tensor(x)
    assert_close(t.expand(2, 3, 4), np.broadcast_to(x, (2, 3, 4)))
    assert_close(device.tensor(np.float32(2)).expand(2, 2), np.full((2, 2), 2.0))
    assert_close(t.expand(3, 0), np.zeros((3, 0)))
    with pytest.raises(RecordError, match="cannot expand"):
        t.expand(2, 4)


@pytest.mark.ops("squeeze", "unsqueeze")
def test_squeeze_unsqueeze(device, rng):
    x = _rand(rng, (1, 3, 1, 2))
    t = device.tensor(x)
    assert t.squeeze().shape == (3, 2)
    assert_close(t.squeeze(), x.squeeze())
    assert_close(t.squeeze(2), x.squeeze(2))
    assert_close(F.squeeze(t, axes=(0, -2)), x.squeeze((0, 2)))
    assert_close(t.unsqueeze(0), x[None])
    assert_close(t.unsqueeze(-1), x[..., None])
    assert_close(t.unsqueeze(2), np.expand_dims(x, 2))
    assert_close(device.tensor(np.float32(3)).unsqueeze(0), np.array([3.0]))
    with pytest.raises(RecordError, match="size 3"):
        t.squeeze(1)


@pytest.mark.ops("slice")
def test_slice(device, rng):
    x = _rand(rng, (5, 6))
    t = device.tensor(x)
    y = F.slice(t, starts=(1, 0), stops=(4, 6), steps=(2, 3))
    assert_close(y, x[1:4:2, 0:6:3])
    # negative steps: a stop of -1 means "through index 0"
    y = F.slice(t, starts=(4, 5), stops=(-1, 0), steps=(-1, -2))
    assert_close(y, x[4::-1, 5:0:-2])
    assert_close(F.slice(t, starts=(2, 0), stops=(2, 6), steps=(1, 1)), x[2:2])
    with pytest.raises(RecordError, match="zero"):
        F.slice(t, starts=(0, 0), stops=(5, 6), steps=(0, 1))


@pytest.mark.ops("slice_backward")
def test_slice_backward_writes_the_region(device, rng):
    g = _rand(rng, (2, 3))
    y = F.slice_backward(
        device.tensor(g), in_shape=(5, 6), starts=(4, 0), stops=(0, 6), steps=(-2, 2)
    )
    want = np.zeros((5, 6), np.float32)
    want[4:0:-2, 0:6:2] = g
    assert_close(y, want)


@pytest.mark.ops("cat")
def test_cat(device, rng):
    a, b, c = _rand(rng, (2, 3)), _rand(rng, (4, 3)), _rand(rng, (0, 3))
    y = F.cat([device.tensor(a), device.tensor(b), device.tensor(c)], axis=0)
    assert_close(y, np.concatenate([a, b, c]))
    y = F.cat([device.tensor(a), device.tensor(a)], axis=-1)
    assert_close(y, np.concatenate([a, a], axis=-1))
    mixed = F.cat([device.tensor(a), device.tensor(np.ones((1, 3), np.int32))])
    assert mixed.dtype == "float32"
    assert_close(mixed, np.concatenate([a, np.ones((1, 3))]).astype(np.float32))
    with pytest.raises(RecordError, match="differ outside axis"):
        F.cat([device.tensor(a), device.tensor(np.ones((2, 4)))], axis=0)


@pytest.mark.ops("stack")
def test_stack(device, rng):
    xs = [_rand(rng, (2, 3)) for _ in range(3)]
    ts = [device.tensor(x) for x in xs]
    for axis in (0, 1, -1):
        assert_close(F.stack(ts, axis=axis), np.stack(xs, axis=axis))
    assert_close(F.stack([device.tensor(np.float32(1)), device.tensor(np.float32(2))]), [1, 2])


@pytest.mark.ops("split")
def test_split(device, rng):
    x = _rand(rng, (7, 4))
    parts = F.split(device.tensor(x), 3, axis=0)
    assert [p.shape for p in parts] == [(3, 4), (3, 4), (1, 4)]
    for p, w in zip(parts, np.split(x, [3, 6])):
        assert_close(p, w)
    parts = F.split(device.tensor(x), [1, 3], axis=1)
    for p, w in zip(parts, np.split(x, [1], axis=1)):
        assert_close(p, w)
    with pytest.raises(RecordError, match="add up"):
        F.split(device.tensor(x), [2, 2], axis=0)


@pytest.mark.ops("flip")
def test_flip(device, rng):
    x = _rand(rng, (2, 3, 4))
    t = device.tensor(x)
    assert_close(t.flip(0), x[::-1])
    assert_close(t.flip((0, 2)), x[::-1, :, ::-1])
    assert_close(F.flip(t, axes=(-1,)), x[..., ::-1])


@pytest.mark.ops("pad")
def test_pad(device, rng):
    x = _rand(rng, (2, 3))
    y = F.pad(device.tensor(x), [(1, 2), (0, 3)], value=-1.5)
    assert_close(y, np.pad(x, [(1, 2), (0, 3)], constant_values=-1.5))
    xi = rng.integers(0, 9, (3,)).astype(np.int32)
    yi = F.pad(device.tensor(xi), [(2, 0)])
    assert yi.dtype == "int32"
    np.testing.assert_array_equal(yi.numpy(), np.pad(xi, (2, 0)))
    with pytest.raises(RecordError, match="non-negative"):
        F.pad(device.tensor(x), [(1, -1), (0, 0)])
    assert F.pad(device.tensor(np.float32(2)), []).numpy() == 2  # 0-d: nothing to pad
    assert_close(F.pad(device.tensor(np.zeros((0, 2))), [(1, 0), (0, 1)]), np.zeros((1, 3)))


@pytest.mark.ops("gather")
@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_gather(device, rng, index_dtype):
    x = _rand(rng, (3, 5))
    idx = rng.integers(0, 5, (3, 2)).astype(index_dtype)
    assert_close(
        F.gather(device.tensor(x), device.tensor(idx), axis=1), np.take_along_axis(x, idx, 1)
    )
    idx0 = rng.integers(0, 3, (2, 5)).astype(index_dtype)
    assert_close(
        F.gather(device.tensor(x), device.tensor(idx0), axis=0), np.take_along_axis(x, idx0, 0)
    )
    with pytest.raises(RecordError, match="integer"):
        F.gather(device.tensor(x), device.tensor(idx.astype(np.float32)), axis=1)


@pytest.mark.ops("scatter_add")
def test_scatter_add_sums_duplicates(device, rng):
    x = _rand(rng, (3, 4))
    idx = np.array([[0, 0, 3], [1, 1, 1], [2, 3, 2]])
    src = _rand(rng, (3, 3))
    want = x.astype(np.float64).copy()
    for i in range(3):
        for j in range(3):
            want[i, idx[i, j]] += src[i, j]
    y = F.scatter_add(device.tensor(x), device.tensor(idx), device.tensor(src), axis=1)
    assert_close(y, want, "float32")
    idx0 = np.array([[2, 0, 0, 1]])
    src0 = _rand(rng, (1, 4))
    want0 = x.astype(np.float64).copy()
    for j in range(4):
        want0[idx0[0, j], j] += src0[0, j]
    y0 = F.scatter_add(device.tensor(x), device.tensor(idx0), device.tensor(src0), axis=0)
    assert_close(y0, want0, "float32")


@pytest.mark.ops("index_select", "embedding")
def test_index_select_and_embedding(device, rng):
    x = _rand(rng, (5, 3))
    ids = np.array([[0, 4], [4, 1], [2, 2]])
    assert_close(F.index_select(device.tensor(x), device.tensor(ids), axis=0), x[ids])
    assert_close(
        F.index_select(device.tensor(x), device.tensor(np.array([2, 0])), axis=1), x[:, [2, 0]]
    )
    assert_close(F.embedding(device.tensor(ids), device.tensor(x)), x[ids])
    assert_close(
        F.index_select(device.tensor(x), device.tensor(np.array(3)), axis=0), x[3]
    )  # 0-d index drops the axis


@pytest.mark.ops("index_add")
def test_index_add(device, rng):
    g = _rand(rng, (2, 1, 3, 4))  # index_select of (2, 5, 4) with a (1, 3) index at axis 1
    idx = np.array([[1, 1, 0]])
    y = F.index_add(device.tensor(g), device.tensor(idx), axis=1, size=5)
    want = np.zeros((2, 5, 4))
    np.add.at(want, (slice(None), idx.reshape(-1)), g.reshape(2, 3, 4))
    assert y.shape == (2, 5, 4)
    assert_close(y, want, "float32")
    with pytest.raises(RecordError, match="index_add"):
        F.index_add(device.tensor(g), device.tensor(np.array([1, 2])), axis=1, size=5)


@pytest.mark.ops("one_hot")
def test_one_hot(device):
    idx = np.array([[0, 3], [2, 2]])
    y = F.one_hot(device.tensor(idx), num_classes=4)
    assert y.dtype == "float32" and y.shape == (2, 2, 4)
    assert_close(y, np.eye(4)[idx])
    yi = F.one_hot(device.tensor(np.array(1)), num_classes=3, dtype="int32")
    assert yi.dtype == "int32"
    np.testing.assert_array_equal(yi.numpy(), [0, 1, 0])
    with pytest.raises(RecordError, match="positive"):
        F.one_hot(device.tensor(idx), num_classes=0)


@pytest.mark.ops("all_reduce")
def test_all_reduce_of_local_replicas():
    from burn_remote import collective as C

    rng = np.random.default_rng(3)
    devs = C.local_devices(2)
    xs = [rng.standard_normal((3, 5)).astype(np.float32) for _ in devs]
    with C.Group(devs) as g:
        outs = [C.all_reduce(d.tensor(x), g, "sum") for d, x in zip(devs, xs)]
        assert_close(outs[1], xs[0] + xs[1])
