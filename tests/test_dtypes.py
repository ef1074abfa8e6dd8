"""Dtypes: creation and read-back, promotion, weak Python scalars, low-precision math, operators."""

from __future__ import annotations

import itertools
import operator

import ml_dtypes
import numpy as np
import pytest
from burn_remote import RecordError
from burn_remote import functional as F
from burn_remote.protocol import dtypes
from conftest import assert_close

ALL = ["bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
NUMPY = {name: dtypes.to_numpy(name) for name in ALL}


def _sample(name, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    if name == "bool":
        return rng.random(shape) > 0.5
    if name == "uint8":
        return rng.integers(0, 11, shape).astype(np.uint8)
    if name in ("int8", "int32", "int64"):
        return rng.integers(-10, 11, shape).astype(NUMPY[name])
    return rng.uniform(-3, 3, shape).astype(NUMPY[name])


# --- creation and read-back -------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_round_trip(device, name):
    for shape in [(3, 4), (), (0, 2)]:
        x = _sample(name, shape)
        t = device.tensor(x)
        assert t.dtype == name and t.shape == shape
        y = t.numpy()
        assert y.dtype == NUMPY[name] and y.shape == shape
        np.testing.assert_array_equal(y, x)
        # through an op too: the engine keeps the dtype
        r = t.reshape(-1).numpy()
        assert r.dtype == NUMPY[name]


def test_bfloat16_is_ml_dtypes(cpu):
    assert dtypes.to_numpy("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    t = cpu.tensor([1.5, -2.25], dtype="bfloat16")
    assert t.numpy().dtype == ml_dtypes.bfloat16
    assert t.numpy().astype(np.float32).tolist() == [1.5, -2.25]


def test_python_data_defaults(cpu):
    assert cpu.tensor([1.0, 2.0]).dtype == "float32"
    assert cpu.tensor(1.5).dtype == "float32" and cpu.tensor(1.5).shape == ()
    assert cpu.tensor([1, 2]).dtype == "int64"
    assert cpu.tensor(3).shape == ()
    assert cpu.tensor([True, False]).dtype == "bool"
    assert cpu.tensor(np.zeros(2)).dtype == "float64"  # NumPy data keeps its dtype
    assert cpu.tensor(np.zeros(2, np.int32)).dtype == "int32"


@pytest.mark.parametrize(
    "spec,name",
    [
        ("float16", "float16"),
        (np.float16, "float16"),
        (np.dtype("int8"), "int8"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (float, "float32"),
        (int, "int64"),
        (bool, "bool"),
    ],
)
def test_dtype_argument_spellings(cpu, spec, name):
    t = cpu.tensor([1, 0, 1], dtype=spec)
    assert t.dtype == name
    assert t.numpy().dtype == NUMPY[name]


def test_unsupported_dtypes_are_refused(cpu):
    with pytest.raises(TypeError, match="not supported"):
        cpu.tensor(np.zeros(2, np.int16))
    with pytest.raises(TypeError, match="not supported"):
        cpu.tensor(np.zeros(2, np.complex64))
    with pytest.raises(TypeError, match="unknown dtype"):
        dtypes.to_numpy("float8")
    with pytest.raises(TypeError):
        cpu.tensor([1.0]).cast("int16")


# --- promotion ------------------------------------------------------------------------------

EXPECTED = {
    # bool is below everything
    ("bool", "int8"): "int8",
    ("bool", "uint8"): "uint8",
    ("bool", "float16"): "float16",
    # integers follow NumPy, but int8 with uint8 widens to int32 (int16 is not listed)
    ("int8", "uint8"): "int32",
    ("int8", "int32"): "int32",
    ("uint8", "int32"): "int32",
    ("uint8", "int64"): "int64",
    ("int32", "int64"): "int64",
    # across kinds the float wins whatever its width (NumPy would widen int64+float16)
    ("int64", "float16"): "float16",
    ("int32", "bfloat16"): "bfloat16",
    ("uint8", "float32"): "float32",
    ("int64", "float32"): "float32",
    # floats
    ("float16", "float32"): "float32",
    ("float16", "bfloat16"): "float32",
    ("bfloat16", "float32"): "float32",
    ("bfloat16", "float64"): "float64",
    ("float32", "float64"): "float64",
}


@pytest.mark.parametrize("a,b", sorted(EXPECTED))
def test_promotion_table(a, b):
    assert dtypes.promote(a, b) == EXPECTED[a, b]
    assert dtypes.promote(b, a) == EXPECTED[a, b]


def test_promotion_is_symmetric_and_closed():
    for a, b in itertools.product(ALL, ALL):
        r = dtypes.promote(a, b)
        assert r in ALL and r == dtypes.promote(b, a)
        assert dtypes.promote(a, a) == a
        # the result can hold both kinds
        kind = {"bool": 0, "float16": 2, "bfloat16": 2, "float32": 2, "float64": 2}
        assert kind.get(r, 1) >= max(kind.get(a, 1), kind.get(b, 1))


@pytest.mark.parametrize("a,b", list(itertools.combinations(ALL, 2)))
def test_binary_ops_across_dtypes(device, a, b):
    """add/mul/maximum on mixed dtypes: declared dtype, and NumPy's values in that dtype."""
    x, y = _sample(a, (3, 4), 1), _sample(b, (4,), 2)
    out = dtypes.promote(a, b)
    tx, ty = device.tensor(x), device.tensor(y)
    for op, ref in (("add", np.add), ("mul", np.multiply), ("maximum", np.maximum)):
        if out == "bool" and op == "add":
            continue
        r = getattr(F, op)(tx, ty)
        assert r.dtype == out, f"{op}({a}, {b})"
        got = r.numpy()
        assert got.dtype == NUMPY[out]
        want = ref(x.astype(np.float64), y.astype(np.float64))
        if out in ("bool", "int8", "uint8", "int32", "int64"):
            np.testing.assert_array_equal(got, want.astype(NUMPY[out]))
        else:
            assert_close(got, want.astype(NUMPY[out]).astype(np.float64), out)
    c = F.lt(tx, ty)
    assert c.dtype == "bool"
    np.testing.assert_array_equal(c.numpy(), x.astype(np.float64) < y.astype(np.float64))


def test_integer_overflow_wraps_like_numpy(cpu):
    a = cpu.tensor(np.array([127, -128], np.int8))
    np.testing.assert_array_equal((a + cpu.tensor(np.array([1, -1], np.int8))).numpy(), [-128, 127])
    u = cpu.tensor(np.array([250], np.uint8))
    assert (u + 10).numpy().tolist() == [4]
    assert (u + 10).dtype == "uint8"


WEAK = [
    # tensor dtype, scalar, result dtype
    ("int8", 3, "int8"),
    ("uint8", 3, "uint8"),
    ("int8", 1.5, "float32"),
    ("int64", 2.0, "float32"),
    ("bool", 1, "int64"),
    ("bool", True, "bool"),
    ("float16", 2.0, "float16"),
    ("float16", 2, "float16"),
    ("bfloat16", 0.5, "bfloat16"),
    ("float64", 1, "float64"),
    ("float32", True, "float32"),
]


@pytest.mark.parametrize("name,scalar,result", WEAK)
def test_python_scalars_are_weak(device, name, scalar, result):
    x = _sample(name, (5,), 3)
    t = device.tensor(x)
    for y in (t * scalar, scalar * t):
        assert y.dtype == result, f"{name} * {scalar!r}"
        want = (x.astype(np.float64) * float(scalar)).astype(NUMPY[result])
        assert_close(y.numpy(), want, result)
    if name != "bool":
        assert (t - scalar).dtype == result and (scalar - t).dtype == result


def test_numpy_operands(cpu):
    t = cpu.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    assert (t * np.float64(2.0)).dtype == "float32"  # NumPy scalars are weak like Python's
    r = np.arange(3) + t  # ndarray on the left: NumPy defers to the tensor
    assert type(r).__name__ == "Tensor"
    np.testing.assert_array_equal(r.numpy(), [1.0, 3.0, 5.0])
    r = t - np.ones(3, np.float32)
    assert r.dtype == "float32"
    np.testing.assert_array_equal(r.numpy(), [0.0, 1.0, 2.0])


# --- reductions and ops in every dtype ---------------------------------------------------


@pytest.mark.parametrize("name", ["int8", "uint8", "int32", "int64"])
def test_integer_reductions(device, name):
    x = _sample(name, (3, 4))
    t = device.tensor(x)
    assert F.sum(t).dtype == "int64" and F.sum(t).item() == int(x.astype(np.int64).sum())
    assert F.max(t, axes=1).dtype == name
    np.testing.assert_array_equal(F.max(t, axes=1).numpy(), x.max(1))
    np.testing.assert_array_equal(F.min(t, axes=0).numpy(), x.min(0))
    np.testing.assert_array_equal(F.argmax(t, axis=1).numpy(), x.argmax(1))
    assert F.mean(t).dtype == "float32"
    assert abs(F.mean(t).item() - x.mean()) < 1e-5


LOW_PRECISION_UNARY = {
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "sin": np.sin,
    "abs": np.abs,
    "floor": np.floor,
}


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_low_precision_math(device, name):
    """float16/bfloat16 results stay in their dtype and within their precision."""
    x = _sample(name, (4, 6), 5)
    xf = x.astype(np.float64)
    t = device.tensor(x)
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}[name]
    for op, ref in LOW_PRECISION_UNARY.items():
        y = getattr(F, op)(t)
        assert y.dtype == name, op
        assert y.numpy().dtype == NUMPY[name]
        np.testing.assert_allclose(
            y.numpy().astype(np.float64), ref(xf), rtol=tol, atol=tol, err_msg=op
        )
    for op, ref in (("sum", np.sum), ("max", np.max), ("logsumexp", None)):
        y = getattr(F, op)(t, axes=1)
        assert y.dtype == name
        want = ref(xf, axis=1) if ref else np.log(np.exp(xf).sum(1))
        np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=4 * tol, atol=4 * tol)
    sm = F.softmax(t, axis=-1)
    assert sm.dtype == name
    np.testing.assert_allclose(sm.numpy().astype(np.float64).sum(-1), 1, atol=4 * tol)
    m = t @ t.transpose()
    assert m.dtype == name
    np.testing.assert_allclose(m.numpy().astype(np.float64), xf @ xf.T, rtol=4 * tol, atol=8 * tol)
    y = F.layer_norm(t)
    assert y.dtype == name
    with pytest.raises(RecordError, match="floating"):
        F.exp(device.tensor(np.array([1], np.uint8)))


def test_requires_grad_on_low_precision(cpu):
    x = cpu.tensor(np.array([1.0, 2.0]), dtype="bfloat16", requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.dtype == "bfloat16"
    np.testing.assert_array_equal(x.grad.numpy().astype(np.float32), [2.0, 4.0])


# --- Python operators -----------------------------------------------------------------------

BINARY_OPERATORS = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.pow,
    operator.lt,
    operator.le,
    operator.eq,
    operator.ne,
    operator.gt,
    operator.ge,
]


@pytest.mark.parametrize("op", BINARY_OPERATORS, ids=lambda o: o.__name__)
def test_operators_match_numpy(device, op):
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 2, (3, 4)).astype(np.float32)
    b = rng.uniform(0.5, 2, (4,)).astype(np.float32)
    b[1] = a[0, 1]  # one tie for the comparisons
    ta, tb = device.tensor(a), device.tensor(b)
    for got, want in (
        (op(ta, tb), op(a, b)),
        (op(ta, 1.5), op(a, np.float32(1.5))),
        (op(1.5, tb), op(np.float32(1.5), b)),
    ):
        assert got.shape == want.shape
        if want.dtype == bool:
            assert got.dtype == "bool"
            np.testing.assert_array_equal(got.numpy(), want)
        else:
            assert got.dtype == "float32"
            assert_close(got, want.astype(np.float64), "float32")


def test_unary_operators_and_matmul(device):
    a = np.array([[1.0, -2.0], [3.0, -4.0]], np.float32)
    t = device.tensor(a)
    np.testing.assert_array_equal((-t).numpy(), -a)
    np.testing.assert_array_equal(abs(t).numpy(), np.abs(a))
    np.testing.assert_array_equal((t @ t).numpy(), a @ a)
    b = device.tensor(np.array([True, False]))
    np.testing.assert_array_equal((~b).numpy(), [False, True])


def test_integer_division_operators(device):
    a = np.array([7, -7, 6, 0], np.int64)
    b = np.array([2, 2, -4, 5], np.int64)
    ta, tb = device.tensor(a), device.tensor(b)
    q = ta / tb  # true division of integers is a float
    assert q.dtype == "float32"
    np.testing.assert_allclose(q.numpy(), a / b, rtol=1e-6)
    f = ta // tb
    assert f.dtype == "int64"
    np.testing.assert_array_equal(f.numpy(), a // b)
    fl = device.tensor(a.astype(np.float32)) // device.tensor(b.astype(np.float32))
    np.testing.assert_array_equal(fl.numpy(), a.astype(np.float32) // b.astype(np.float32))
    r = 1 / tb  # reversed true division is a float too
    assert r.dtype == "float32"
    np.testing.assert_allclose(r.numpy(), 1 / b, rtol=1e-6)
    assert (ta / 2).dtype == "float32"
    np.testing.assert_allclose((ta / 2).numpy(), a / 2)
    p = ta**2
    assert p.dtype == "int64"
    np.testing.assert_array_equal(p.numpy(), a**2)


def test_scalar_conversions(cpu):
    t = cpu.tensor(np.float32(2.5))
    assert isinstance(t.item(), float) and t.item() == 2.5
    assert float(t) == 2.5 and int(cpu.tensor(7)) == 7
    assert isinstance(cpu.tensor(7).item(), int)
    assert bool(cpu.tensor(True)) is True
    assert len(cpu.tensor(np.zeros((4, 2)))) == 4
    with pytest.raises(ValueError, match="one element"):
        cpu.tensor([1.0, 2.0]).item()
    np.testing.assert_array_equal(np.asarray(cpu.tensor([1, 2])), [1, 2])
