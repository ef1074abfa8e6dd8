"""Per-op ONNX lowering: every lowered primitive, run in onnxruntime against the engine.

The op list comes from the registry: a primitive without a lowering must be listed as not
exportable with a reason, and every lowering must have at least one case here.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from burn_remote import Device  # noqa: E402
from burn_remote._ops import call  # noqa: E402
from burn_remote.onnx import LOWERINGS, NOT_EXPORTABLE, ExportError, to_onnx  # noqa: E402
from burn_remote.protocol.ops import PRIMITIVES  # noqa: E402

R = np.random.default_rng(7)
DEV = Device.cpu()


def f32(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, size=shape).astype(np.float32)


def i64(*shape, lo=-5, hi=6):
    return R.integers(lo, hi, size=shape).astype(np.int64)


def boolean(*shape):
    return R.random(shape) > 0.5


def op(name, **attrs):
    return lambda *xs: call(name, *xs, **attrs)


def _unary(name, x):
    return (op(name), [x])


_POS = f32(3, 4, lo=0.1, hi=4.0)
_WIDE = np.array([[-100.0, -20.0, -1.0, 0.0, 0.5, 1.0, 20.0, 100.0]], np.float32)
_BLOCK = 64

CASES: dict[str, list[tuple]] = {
    **{n: [_unary(n, f32(3, 4))] for n in ("neg", "sign", "sin", "cos", "tanh", "erf", "floor")},
    "abs": [_unary("abs", f32(3, 4)), _unary("abs", i64(3, 4))],
    "exp": [_unary("exp", f32(3, 4))],
    "log": [_unary("log", _POS)],
    "sqrt": [_unary("sqrt", _POS)],
    "rsqrt": [_unary("rsqrt", _POS)],
    "sigmoid": [_unary("sigmoid", _WIDE)],
    "relu": [_unary("relu", f32(3, 4)), _unary("relu", i64(3, 4))],
    "softplus": [_unary("softplus", _WIDE)],
    "add": [(op("add"), [f32(3, 4), f32(4)]), (op("add"), [f32(3, 4), i64(3, 1)])],
    "sub": [(op("sub"), [f32(3, 4), f32(3, 1)]), (op("sub"), [i64(3, 4), i64(4)])],
    "mul": [(op("mul"), [f32(2, 3, 4), f32(3, 4)]), (op("mul"), [boolean(3), boolean(3)])],
    "div": [
        (op("div"), [f32(3, 4), _POS]),
        (op("div"), [i64(3, 4, lo=-9, hi=10), np.array([3, -2, 4, -5], np.int64)]),
    ],
    "pow": [(op("pow"), [_POS, f32(3, 4)])],
    "maximum": [(op("maximum"), [f32(3, 4), f32(4)])],
    "minimum": [(op("minimum"), [f32(3, 4), i64(3, 4)])],
    **{n: [(op(n), [i64(3, 4, lo=0, hi=3), i64(4, lo=0, hi=3)])] for n in ("eq", "ne")},
    **{n: [(op(n), [f32(3, 4), f32(3, 4)])] for n in ("lt", "le", "gt", "ge")},
    "logical_and": [(op("logical_and"), [boolean(3, 4), boolean(4)])],
    "logical_or": [(op("logical_or"), [boolean(3, 4), boolean(3, 4)])],
    "logical_not": [(op("logical_not"), [boolean(3, 4)])],
    "where": [(op("where"), [boolean(3, 4), f32(3, 4), f32(4)])],
    "cast": [
        (op("cast", dtype="int64"), [f32(3, 4, lo=-5, hi=5)]),
        (op("cast", dtype="float32"), [i64(3, 4)]),
        (op("cast", dtype="bool"), [np.array([0.0, 1.5, -2.0, 0.0], np.float32)]),
    ],
    "full": [(lambda x: x + call("full", _device=DEV, shape=(3, 4), value=2.5, dtype="float32"),
              [f32(3, 4)])],
    "value": [(lambda x: x * DEV.scalar(2.5), [f32(3, 4)])],
    "sum": [
        (op("sum", axes=(1,), keepdims=True), [f32(3, 4, 5)]),
        (op("sum", axes=None, keepdims=False), [f32(3, 4)]),
        (op("sum", axes=(0, 2), keepdims=False), [boolean(3, 4, 5)]),
    ],
    "max": [(op("max", axes=(1,), keepdims=False), [f32(3, 4, 5)])],
    "min": [(op("min", axes=None, keepdims=True), [f32(3, 4)])],
    "argmax": [(op("argmax", axis=1, keepdims=False), [f32(3, 4)]),
               (op("argmax", axis=None, keepdims=True), [f32(3, 4)])],
    "argmin": [(op("argmin", axis=-1, keepdims=True), [f32(3, 4, 5)])],
    "logsumexp": [(op("logsumexp", axes=(1,), keepdims=False), [f32(3, 4) * 50])],
    "softmax": [(op("softmax", axis=-1), [f32(3, 4) * 10]), (op("softmax", axis=0), [f32(3, 4)])],
    "log_softmax": [(op("log_softmax", axis=-1), [f32(3, 4) * 10])],
    "matmul": [(op("matmul"), [f32(2, 3, 4), f32(4, 5)]), (op("matmul"), [f32(2, 3, 4), f32(2, 4, 5)])],
    "reshape": [(op("reshape", shape=(4, -1)), [f32(2, 3, 4)])],
    "permute": [(op("permute", dims=(2, 0, 1)), [f32(2, 3, 4)])],
    "expand": [(op("expand", shape=(2, 3, 4)), [f32(3, 1)])],
    "slice": [(lambda x: x[::-1, 1:5:2], [f32(4, 6)]), (lambda x: x[1:3, -2:], [f32(4, 6)])],
    "flip": [(op("flip", axes=(0, 1)), [f32(3, 4)])],
    "cat": [(lambda a, b, c: call("cat", a, b, c, axis=1), [f32(2, 3), f32(2, 1), i64(2, 2)])],
    "pad": [(op("pad", pads=((1, 2), (0, 1)), value=0.5), [f32(3, 4)])],
    "gather": [(op("gather", axis=1), [f32(3, 5), i64(3, 2, lo=0, hi=5)])],
    "scatter_add": [(op("scatter_add", axis=1), [f32(3, 5), i64(3, 4, lo=0, hi=5), f32(3, 4)])],
    "index_select": [(op("index_select", axis=0), [f32(6, 4), i64(2, 3, lo=0, hi=6)])],
    "one_hot": [(op("one_hot", num_classes=5), [np.array([[0, 4, 2], [7, 1, 3]], np.int64)])],
    "conv2d": [
        (op("conv2d", stride=(2, 2), padding=(1, 1)), [f32(2, 3, 8, 8), f32(4, 3, 3, 3)]),
        (op("conv2d", dilation=(2, 1), groups=3), [f32(1, 3, 7, 7), f32(6, 1, 2, 3)]),
    ],
    "max_pool2d": [
        (op("max_pool2d", kernel=2), [f32(2, 3, 8, 8)]),
        (op("max_pool2d", kernel=3, stride=2, padding=1), [f32(2, 3, 7, 7)]),
    ],
    "avg_pool2d": [(op("avg_pool2d", kernel=3, stride=2, padding=1), [f32(2, 3, 7, 7)])],
    "dequantize_int8": [
        (op("dequantize_int8", block=_BLOCK, shape=(8, 16)),
         [R.integers(-127, 128, size=128).astype(np.int8), f32(2, lo=0.1, hi=2.0)])
    ],
    "dequantize_nf4": [
        (op("dequantize_nf4", block=_BLOCK, shape=(8, 16)),
         [R.integers(0, 256, size=64).astype(np.uint8), f32(2, lo=0.1, hi=2.0)])
    ],
}  # fmt: skip


def test_every_primitive_is_lowered_or_refused_with_a_reason():
    lowered, refused = set(LOWERINGS), set(NOT_EXPORTABLE)
    assert not lowered & refused
    assert lowered | refused == set(PRIMITIVES), sorted(set(PRIMITIVES) ^ (lowered | refused))
    assert all(isinstance(r, str) and len(r) > 10 for r in NOT_EXPORTABLE.values())


def test_every_lowering_has_a_case():
    assert set(CASES) == set(LOWERINGS) & set(PRIMITIVES)


def run_both(fn, arrays):
    ref = fn(*[DEV.tensor(a) for a in arrays]).numpy()
    model = to_onnx(fn, arrays, dynamic_batch=False)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
    return ref, sess.run(None, feeds)[0]


@pytest.mark.parametrize("name", sorted(set(LOWERINGS) & set(PRIMITIVES)))
def test_lowering_matches_engine(name):
    for fn, arrays in CASES[name]:
        ref, got = run_both(fn, arrays)
        assert got.dtype == ref.dtype, (name, got.dtype, ref.dtype)
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(got, ref, err_msg=name)


@pytest.mark.parametrize("name", sorted(NOT_EXPORTABLE))
def test_not_exportable_ops_are_refused_with_their_reason(name):
    from burn_remote.onnx._export import _lower
    from burn_remote.onnx._trace import Trace, TraceNode

    tr = Trace({0: ((4,), "float32")}, [TraceNode(name, (0,), {}, (1,), (((4,), "float32"),))],
               [0], {}, {}, [1], None)  # fmt: skip
    with pytest.raises(ExportError, match=name):
        _lower(tr, ["input"], ["output"], {})
