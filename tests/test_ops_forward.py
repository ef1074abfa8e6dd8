"""Forward values of every registry op against NumPy/SciPy formulas, on every backend.

Each test names the ops it covers with `@pytest.mark.ops(...)`; a fixture checks that the
named ops really were recorded while the test ran, and `test_every_op_has_a_forward_test`
checks that the marks cover the whole registry, so a new op cannot land without a test.
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np
import pytest
from burn_remote import RecordError
from burn_remote import functional as F
from burn_remote.engine.backends.numpy_kernels import KERNELS
from burn_remote.protocol import ops as registry
from burn_remote.protocol.extensions import parse_wire_name
from conftest import assert_close
from scipy import special

OPS = registry.OPS

EXECUTOR_HANDLED = {"value": "a 0-d binding: the executor fills its slot, no kernel runs"}
"""Primitive ops that no backend supplies a kernel for, and why."""


# --- coverage bookkeeping ---------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("op_trace")


FORWARD_MODULES = ("test_ops_forward", "test_ops_forward_shape", "test_ops_forward_nn")
"""The modules whose `ops` marks together must cover the registry."""


def _declared_ops() -> set[str]:
    import importlib

    out: set[str] = set()
    for name in FORWARD_MODULES:
        out |= declared_ops(sys.modules.get(name) or importlib.import_module(name))
    return out


def declared_ops(module) -> set[str]:
    """The op names that a module's tests declare with `@pytest.mark.ops(...)`."""
    out: set[str] = set()
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if not name.startswith("test_"):
            continue
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "ops":
                out.update(mark.args)
            if mark.name == "parametrize":
                for value in mark.args[1]:
                    for m in getattr(value, "marks", ()):
                        if m.name == "ops":
                            out.update(m.args)
    return out


def test_every_primitive_has_a_numpy_kernel():
    missing = sorted(registry.PRIMITIVES - set(KERNELS) - set(EXECUTOR_HANDLED))
    assert not missing, f"primitive ops without a NumPy kernel: {missing}"
    stray = sorted(set(KERNELS) - set(OPS))
    assert not stray, f"NumPy kernels for ops the registry does not declare: {stray}"


def test_every_op_has_a_forward_test():
    # extension ops (``ext.op@version``) are tested with their extensions
    builtin = {name for name in OPS if parse_wire_name(name) is None}
    untested = sorted(builtin - _declared_ops())
    assert not untested, f"ops with no forward test in {FORWARD_MODULES}: {untested}"


def test_trace_fixture_sees_composites_and_primitives(cpu, op_trace):
    F.silu(cpu.tensor([1.0]))
    assert {"silu", "sigmoid", "mul"} <= op_trace


# --- helpers ----------------------------------------------------------------------------


def _rand(rng, shape, dtype="float32", low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(dtype)


def _f64(a):
    return np.asarray(a, dtype=np.float64)


SHAPES = [(3, 4), (), (0, 3), (2, 1, 5)]
BINARY_SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 1), (1, 4)),
    ((2, 3, 4), (4,)),
    ((), (3,)),
    ((2, 1), ()),
    ((0, 3), (1, 3)),
    ((2, 0), (1,)),
    ((), ()),
]


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    # name: (reference on float64, input domain low, high)
    "neg": (np.negative, -3, 3),
    "abs": (np.abs, -3, 3),
    "sign": (np.sign, -3, 3),
    "exp": (np.exp, -3, 3),
    "log": (np.log, 0.05, 4),
    "sqrt": (np.sqrt, 0.0, 4),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.05, 4),
    "sin": (np.sin, -4, 4),
    "cos": (np.cos, -4, 4),
    "tanh": (np.tanh, -4, 4),
    "sigmoid": (_sigmoid, -8, 8),
    "relu": (lambda x: np.maximum(x, 0), -3, 3),
    "softplus": (lambda x: np.log1p(np.exp(x)), -8, 8),
    "erf": (special.erf, -3, 3),
    "floor": (np.floor, -3, 3),
    "silu": (lambda x: x * _sigmoid(x), -6, 6),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(UNARY)]
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary(device, rng, name, dtype):
    ref, lo, hi = UNARY[name]
    for shape in SHAPES:
        x = _rand(rng, shape, dtype, lo, hi)
        y = getattr(F, name)(device.tensor(x))
        assert y.shape == shape and y.dtype == dtype
        assert_close(y, ref(_f64(x)), dtype)


@pytest.mark.ops("sigmoid", "softplus", "tanh")
def test_unary_extremes_are_stable(device):
    x = np.array([-1000.0, -80.0, -1e-8, 0.0, 1e-8, 80.0, 1000.0], dtype=np.float32)
    t = device.tensor(x)
    with np.errstate(over="ignore"):
        assert_close(F.sigmoid(t), _sigmoid(_f64(x)))
        assert_close(F.softplus(t), np.logaddexp(0, _f64(x)), rtol=1e-6, atol=1e-6)
        assert_close(F.tanh(t), np.tanh(_f64(x)))
    assert not np.isnan(F.sigmoid(t).numpy()).any()


@pytest.mark.ops("gelu")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(device, rng, approximate):
    x = _rand(rng, (4, 5), "float64", -4, 4)
    if approximate == "tanh":
        want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        want = 0.5 * x * (1 + special.erf(x / math.sqrt(2)))
    assert_close(F.gelu(device.tensor(x), approximate=approximate), want)
    # the two forms agree to about 1e-3, but are not the same function
    assert_close(F.gelu(device.tensor(x), approximate="none").numpy(), want, atol=2e-3)


@pytest.mark.ops("gelu")
def test_gelu_rejects_unknown_form(cpu):
    with pytest.raises(RecordError, match="approximate"):
        F.gelu(cpu.tensor([1.0]), approximate="fast")


@pytest.mark.ops("log", "exp")
def test_float_unary_refuses_integers(cpu):
    with pytest.raises(RecordError, match="floating-point"):
        F.log(cpu.tensor([1, 2, 3]))
    with pytest.raises(RecordError, match="floating-point"):
        cpu.tensor([1, 2]).exp()


BINARY = {
    "add": (np.add, -3, 3),
    "sub": (np.subtract, -3, 3),
    "mul": (np.multiply, -3, 3),
    "div": (np.divide, 0.5, 3),
    "pow": (np.power, 0.2, 2),
    "maximum": (np.maximum, -3, 3),
    "minimum": (np.minimum, -3, 3),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(BINARY)]
)
@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
def test_binary_broadcasting(device, rng, name, sa, sb):
    ref, lo, hi = BINARY[name]
    a, b = _rand(rng, sa, "float32", lo, hi), _rand(rng, sb, "float32", lo, hi)
    if name == "div":
        b *= rng.choice([-1, 1], size=sb).astype(np.float32) if sb else 1
    y = getattr(F, name)(device.tensor(a), device.tensor(b))
    want = ref(_f64(a), _f64(b))
    assert y.shape == np.broadcast_shapes(sa, sb)
    assert_close(y, want, "float32", rtol=1e-5)


@pytest.mark.ops("add", "maximum")
def test_binary_refuses_bad_broadcast_naming_both_shapes(cpu):
    with pytest.raises(RecordError, match=r"\(3, 4\).*\(2, 4\)"):
        cpu.tensor(np.zeros((3, 4))) + cpu.tensor(np.zeros((2, 4)))
    with pytest.raises(RecordError, match="test_ops_forward.py"):
        F.maximum(cpu.tensor(np.zeros(3)), cpu.tensor(np.zeros(2)))


@pytest.mark.ops("div")
def test_integer_div_floors_like_numpy(device):
    a = np.array([7, -7, 7, -7, 0, 9], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, 3], dtype=np.int64)
    y = F.div(device.tensor(a), device.tensor(b))
    assert y.dtype == "int64"
    assert_close(y, np.floor_divide(a, b))


@pytest.mark.ops("maximum", "minimum")
def test_maximum_minimum_integers(device, rng):
    a = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    b = rng.integers(-5, 5, (4,)).astype(np.int32)
    assert_close(F.maximum(device.tensor(a), device.tensor(b)), np.maximum(a, b))
    assert_close(F.minimum(device.tensor(a), device.tensor(b)), np.minimum(a, b))


COMPARE = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(COMPARE)]
)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_compare(device, rng, name, dtype):
    for sa, sb in BINARY_SHAPES:
        # small integers, so equal elements are common
        a = rng.integers(-2, 3, sa).astype(dtype)
        b = rng.integers(-2, 3, sb).astype(dtype)
        y = getattr(F, name)(device.tensor(a), device.tensor(b))
        assert y.dtype == "bool"
        np.testing.assert_array_equal(y.numpy(), COMPARE[name](a, b))


@pytest.mark.ops("logical_and", "logical_or", "logical_not")
def test_logical(device, rng):
    a = rng.random((3, 4)) > 0.5
    b = rng.random((4,)) > 0.5
    ta, tb = device.tensor(a), device.tensor(b)
    np.testing.assert_array_equal(F.logical_and(ta, tb).numpy(), a & b)
    np.testing.assert_array_equal(F.logical_or(ta, tb).numpy(), a | b)
    np.testing.assert_array_equal(F.logical_not(ta).numpy(), ~a)
    np.testing.assert_array_equal((ta & tb).numpy(), a & b)
    np.testing.assert_array_equal((ta | tb).numpy(), a | b)
    np.testing.assert_array_equal((~ta).numpy(), ~a)
    empty = device.tensor(np.zeros((0, 2), bool))
    assert F.logical_not(empty).numpy().shape == (0, 2)


@pytest.mark.ops("where")
def test_where_broadcasts_and_promotes(device, rng):
    c = rng.random((3, 1)) > 0.5
    x = rng.standard_normal((1, 4)).astype(np.float32)
    y = rng.integers(-3, 3, (4,)).astype(np.int32)
    out = F.where(device.tensor(c), device.tensor(x), device.tensor(y))
    assert out.dtype == "float32" and out.shape == (3, 4)
    assert_close(out, np.where(c, x, y))
    # scalar branches
    out = F.where(device.tensor(c), device.tensor(x), 0.0)
    assert_close(out, np.where(c, x, 0.0).astype(np.float32))
    # 0-d condition
    out = F.where(device.tensor(np.array(False)), device.tensor(x), device.tensor(x * 2))
    assert_close(out, x * 2)


@pytest.mark.ops("where")
def test_where_needs_bool_condition(cpu):
    with pytest.raises(RecordError, match="bool"):
        F.where(cpu.tensor([1, 0]), cpu.tensor([1.0, 2.0]), cpu.tensor([3.0, 4.0]))


@pytest.mark.ops("clamp")
def test_clamp(device, rng):
    x = _rand(rng, (5, 6), "float32", -3, 3)
    t = device.tensor(x)
    assert_close(F.clamp(t, min=-1.0, max=0.5), np.clip(x, -1.0, 0.5))
    assert_close(t.clamp(min=0.0), np.maximum(x, 0))
    assert_close(t.clamp(max=0.0), np.minimum(x, 0))
    assert_close(t.clamp(), x)
    xi = rng.integers(-10, 10, (7,))
    assert_close(device.tensor(xi).clamp(-2, 3), np.clip(xi, -2, 3))
    assert device.tensor(xi).clamp(-2, 3).dtype == "int64"


CAST_DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32"]


@pytest.mark.ops("cast")
@pytest.mark.parametrize("src", CAST_DTYPES)
def test_cast_matches_numpy_astype(device, rng, src):
    from burn_remote.protocol.dtypes import to_numpy

    base = rng.uniform(-3.7, 100.3, (4, 5))
    if src == "bool":
        base = base > 50
    x = base.astype(to_numpy(src))
    for dst in CAST_DTYPES:
        if src in ("int8", "int32", "int64") and dst == "uint8":
            continue  # negative -> unsigned wraps differently by platform; not a contract
        y = F.cast(device.tensor(x), dtype=dst)
        assert y.dtype == dst
        want = x.astype(to_numpy(dst))
        np.testing.assert_array_equal(y.numpy(), want, err_msg=f"{src} -> {dst}")


@pytest.mark.ops("full", "value", "add")
def test_full_and_value(device):
    t = device.full((2, 3), 7, "int32")
    assert t.dtype == "int32"
    np.testing.assert_array_equal(t.numpy(), np.full((2, 3), 7, np.int32))
    np.testing.assert_array_equal(device.zeros((0, 4)).numpy(), np.zeros((0, 4), np.float32))
    np.testing.assert_array_equal(device.ones(()).numpy(), np.float32(1))
    np.testing.assert_array_equal(device.full((2,), True, "bool").numpy(), [True, True])
    assert device.full((2,), True, "bool").dtype == "bool"
    s = device.scalar(2.5)
    assert s.shape == () and s.dtype == "float32"
    assert (s + device.ones((3,))).numpy().tolist() == [3.5, 3.5, 3.5]
    assert device.scalar(4, "int64").item() == 4
