"""Gradients of every differentiable op against central finite differences, in float64.

Shapes come from hypothesis. The check is on a random cotangent: the loss is
sum(w * f(x)), its gradient (recorded by `backward()` and run by the engine) is compared
element by element with (L(x + h e_i) - L(x - h e_i)) / 2h, where L is evaluated through the
engine as well, so the test holds the gradient rule to the forward kernel that runs.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from burn_remote import RecordError, no_grad
from burn_remote import functional as F
from burn_remote.protocol import ops as registry
from burn_remote.protocol.extensions import parse_wire_name
from burn_remote.protocol.registry import NOT_DIFFERENTIABLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes
from test_ops_forward import declared_ops

pytestmark = pytest.mark.usefixtures("op_trace")

FEW = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SHAPES = array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
SEEDS = st.integers(0, 2**32 - 1)
H = 1e-6


def check_grad(dev, fn, *args, seed=0, rtol=1e-5, atol=1e-6):
    """Compare backward() with central differences for every float64 array in `args`.

    Other args (integer arrays, Python values) are passed through: integer arrays as
    tensors without gradients, anything else as is.
    """
    rng = np.random.default_rng(seed)
    args = tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in args)
    wrt = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype == np.float64]

    def tensors(arrays, grad):
        return [
            dev.tensor(a, requires_grad=grad and i in wrt) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(arrays)
        ]

    ts = tensors(args, True)
    y = fn(*ts)
    w = rng.standard_normal(y.shape)
    (y * dev.tensor(w)).sum().backward()
    analytic = {i: ts[i].grad for i in wrt}

    def loss(arrays):
        with no_grad():
            return float((fn(*tensors(arrays, False)).numpy() * w).sum())

    for i in wrt:
        g = analytic[i]
        assert g is not None, f"input {i} got no gradient"
        assert g.shape == args[i].shape and g.dtype == "float64"
        g = g.numpy()
        fd = np.zeros_like(args[i])
        for idx in np.ndindex(args[i].shape):
            plus, minus = list(args), list(args)
            plus[i], minus[i] = args[i].copy(), args[i].copy()
            plus[i][idx] += H
            minus[i][idx] -= H
            fd[idx] = (loss(plus) - loss(minus)) / (2 * H)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")


def away_from(x, points=(0.0,), gap=0.1):
    """Push values at least `gap` away from kinks, so finite differences see one branch."""
    x = x.copy()
    for p in points:
        d = x - p
        near = np.abs(d) < gap
        x[near] = p + np.where(d[near] >= 0, gap, -gap) + d[near]
    return x


def _x(seed, shape, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


# --- coverage -------------------------------------------------------------------------------


def differentiable_ops() -> set[str]:
    """Primitives with a gradient rule, and composites except the random draws."""
    out = set()
    for name, op in registry.OPS.items():
        if parse_wire_name(name) is not None:
            continue  # extension ops (``ext.op@version``) are tested with their extensions
        if (
            op.primitive
            and callable(op.grad)
            and op.grad is not NOT_DIFFERENTIABLE
            or not op.primitive
            and op.category != "random"
        ):
            out.add(name)
    return out


def test_every_differentiable_op_has_a_gradient_test():
    untested = sorted(differentiable_ops() - declared_ops(sys.modules[__name__]))
    assert not untested, f"differentiable ops with no gradient test: {untested}"


# --- elementwise ----------------------------------------------------------------------------

UNARY = {
    # name: (domain low, high, kinks to stay away from)
    "neg": (-2, 2, ()),
    "abs": (-2, 2, (0.0,)),
    "sign": (-2, 2, (0.0,)),
    "exp": (-2, 2, ()),
    "log": (0.2, 3, ()),
    "sqrt": (0.2, 3, ()),
    "rsqrt": (0.2, 3, ()),
    "sin": (-3, 3, ()),
    "cos": (-3, 3, ()),
    "tanh": (-2, 2, ()),
    "sigmoid": (-4, 4, ()),
    "relu": (-2, 2, (0.0,)),
    "softplus": (-4, 4, ()),
    "erf": (-2, 2, ()),
    "floor": (-2.9, 2.9, (-2.0, -1.0, 0.0, 1.0, 2.0)),
    "silu": (-4, 4, ()),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(UNARY)]
)
@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_unary_grad(cpu, name, shape, seed):
    lo, hi, kinks = UNARY[name]
    x = away_from(_x(seed, shape, lo, hi), kinks)
    check_grad(cpu, getattr(F, name), x, seed=seed)


@pytest.mark.ops("gelu")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_gelu_grad(cpu, approximate, shape, seed):
    check_grad(cpu, lambda x: F.gelu(x, approximate=approximate), _x(seed, shape, -3, 3), seed=seed)


BINARY = {
    "add": (-2, 2, -2, 2),
    "sub": (-2, 2, -2, 2),
    "mul": (-2, 2, -2, 2),
    "div": (-2, 2, 0.5, 2),
    "pow": (0.3, 2, -2, 2),
    "maximum": (-2, 2, -2, 2),
    "minimum": (-2, 2, -2, 2),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in sorted(BINARY)]
)
@FEW
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=1, max_side=3),
    seed=SEEDS,
)
def test_binary_grad(cpu, name, shapes, seed):
    lo_a, hi_a, lo_b, hi_b = BINARY[name]
    sa, sb = shapes.input_shapes
    a, b = _x(seed, sa, lo_a, hi_a), _x(seed + 1, sb, lo_b, hi_b)
    if name in ("maximum", "minimum"):
        b = b + np.where(np.abs(b - np.broadcast_to(a, shapes.result_shape).mean()) < 0.05, 0.2, 0)
        if np.min(np.abs(np.broadcast_to(a, shapes.result_shape) - b)) < 1e-3:
            return  # a near-tie: the derivative is not defined there
    check_grad(cpu, getattr(F, name), a, b, seed=seed)


@pytest.mark.ops("add", "mul", "pow", "div", "sub")
def test_operator_grads_with_scalars(cpu):
    x = _x(3, (2, 3), 0.5, 2)
    check_grad(cpu, lambda t: (2.0 - t) * 3.0 + t**2 + 1.0 / t - t / 4.0 + 2.0**t, x)


@pytest.mark.ops("where")
@FEW
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=3, max_dims=3, min_side=1, max_side=3),
    seed=SEEDS,
)
def test_where_grad(cpu, shapes, seed):
    sc, sa, sb = shapes.input_shapes
    cond = np.random.default_rng(seed).random(sc) > 0.5
    check_grad(
        cpu, lambda c, a, b: F.where(c, a, b), cond, _x(seed, sa), _x(seed + 1, sb), seed=seed
    )


@pytest.mark.ops("where")
def test_where_grad_is_zero_where_not_picked_even_under_a_nan_gradient(cpu):
    # PyTorch: grad_a = where(c, g, 0), grad_b = where(c, 0, g) (derivatives.yaml). A
    # masked attention score's incoming gradient may be NaN or inf; the branch not picked
    # still gets exactly 0
    c = np.array([[True, False, True], [False, False, True]])
    g = np.array([[1.5, np.nan, -2.0], [np.inf, 3.0, 0.25]])
    a = cpu.tensor(_x(0, (2, 3)), requires_grad=True)
    b = cpu.tensor(_x(1, (2, 3)), requires_grad=True)
    (F.where(cpu.tensor(c), a, b) * cpu.tensor(g)).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.where(c, g, 0.0))
    np.testing.assert_array_equal(b.grad.numpy(), np.where(c, 0.0, g))


@pytest.mark.ops("clamp")
@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_clamp_grad(cpu, shape, seed):
    x = away_from(_x(seed, shape), (-0.5, 0.7))
    check_grad(cpu, lambda t: F.clamp(t, min=-0.5, max=0.7), x, seed=seed)


@pytest.mark.ops("cast")
def test_cast_grad_comes_back_in_the_input_dtype(cpu):
    x = cpu.tensor(_x(0, (3, 4)), requires_grad=True)
    w = _x(1, (3, 4)).astype(np.float32)
    (F.cast(x, dtype="float32") * cpu.tensor(w)).sum().backward()
    assert x.grad.dtype == "float64"
    np.testing.assert_array_equal(x.grad.numpy(), w.astype(np.float64))
    x.grad = None
    y = F.cast(x, dtype="float64") * 2.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 2.0))


# --- reductions -----------------------------------------------------------------------------


@st.composite
def shape_and_axes(draw, min_dims=1):
    shape = draw(array_shapes(min_dims=min_dims, max_dims=3, min_side=1, max_side=3))
    axes = draw(
        st.one_of(
            st.none(),
            st.integers(-len(shape), len(shape) - 1),
            st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True).map(tuple),
        )
    )
    return shape, axes, draw(st.booleans())


REDUCE = ["sum", "mean", "logsumexp", "max", "min"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.ops(n), id=n) for n in REDUCE])
@FEW
@given(spec=shape_and_axes(), seed=SEEDS)
def test_reduce_grad(cpu, name, spec, seed):
    shape, axes, keepdims = spec
    x = _x(seed, shape)
    if name in ("max", "min"):  # distinct values: a unique extreme in every window
        x = np.random.default_rng(seed).permutation(x.size).reshape(shape) * 0.1
    check_grad(cpu, lambda t: getattr(F, name)(t, axes=axes, keepdims=keepdims), x, seed=seed)


@pytest.mark.ops("max", "min")
def test_max_grad_splits_ties_evenly(cpu):
    x = cpu.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]), requires_grad=True)
    F.max(x, axes=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    z = cpu.tensor(np.array([0.0, -1.0, -1.0]), requires_grad=True)
    z.min().backward()
    np.testing.assert_allclose(z.grad.numpy(), [0, 0.5, 0.5])


@pytest.mark.ops("var")
@pytest.mark.parametrize("correction", [0, 1])
@FEW
@given(spec=shape_and_axes(), seed=SEEDS)
def test_var_grad(cpu, correction, spec, seed):
    shape, axes, keepdims = spec
    fn = lambda t: F.var(t, axes=axes, keepdims=keepdims, correction=correction)  # noqa: E731
    check_grad(cpu, fn, _x(seed, shape), seed=seed)


@pytest.mark.ops("softmax", "log_softmax")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=SEEDS, data=st.data()
)
def test_softmax_grad(cpu, shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = _x(seed, shape, -3, 3)
    check_grad(cpu, lambda t: F.softmax(t, axis=axis), x, seed=seed)
    check_grad(cpu, lambda t: F.log_softmax(t, axis=axis), x, seed=seed)


@pytest.mark.ops("matmul")
@FEW
@given(
    batch=mutually_broadcastable_shapes(num_shapes=2, max_dims=2, min_side=1, max_side=2),
    mkn=st.tuples(*[st.integers(1, 3)] * 3),
    seed=SEEDS,
)
def test_matmul_grad(cpu, batch, mkn, seed):
    m, k, n = mkn
    sa, sb = batch.input_shapes
    check_grad(cpu, F.matmul, _x(seed, (*sa, m, k)), _x(seed + 1, (*sb, k, n)), seed=seed)


@pytest.mark.ops("matmul")
def test_matmul_grad_vector_operands(cpu):
    check_grad(cpu, lambda a, b: a @ b, _x(0, (3,)), _x(1, (3, 2)))
    check_grad(cpu, lambda a, b: a @ b, _x(0, (2, 3)), _x(1, (3,)))
    check_grad(cpu, lambda a, b: a @ b, _x(0, (3,)), _x(1, (3,)))


# --- movement -------------------------------------------------------------------------------


@pytest.mark.ops("reshape", "permute", "transpose", "squeeze", "unsqueeze", "flip")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=SEEDS, data=st.data()
)
def test_movement_grads(cpu, shape, seed, data):
    x = _x(seed, shape)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    check_grad(cpu, lambda t: t.reshape(-1), x, seed=seed)
    check_grad(cpu, lambda t: t.permute(*perm) * t.permute(*perm), x, seed=seed)
    check_grad(cpu, lambda t: F.transpose(t, dim0=0, dim1=-1), x, seed=seed)
    check_grad(cpu, lambda t: t.unsqueeze(1).squeeze(1), x, seed=seed)
    axes = tuple(data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True)))
    check_grad(cpu, lambda t: F.flip(t, axes=axes) * t, x, seed=seed)


@pytest.mark.ops("expand")
@FEW
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=1, max_dims=3, min_side=1, max_side=3),
    seed=SEEDS,
)
def test_expand_grad(cpu, shapes, seed):
    (shape,) = shapes.input_shapes
    target = np.broadcast_shapes(shape, shapes.result_shape, (2,) + shapes.result_shape)
    check_grad(cpu, lambda t: t.expand(*target), _x(seed, shape), seed=seed)


@st.composite
def shape_and_slices(draw):
    shape = draw(array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    key = []
    for d in shape:
        start = draw(st.one_of(st.none(), st.integers(-d, d)))
        stop = draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
        step = draw(st.sampled_from([None, 1, 2, -1, -2]))
        key.append(slice(start, stop, step))
    return shape, tuple(key)


@pytest.mark.ops("slice", "slice_backward")
@FEW
@given(spec=shape_and_slices(), seed=SEEDS)
def test_slice_grad(cpu, spec, seed):
    shape, key = spec
    x = _x(seed, shape)
    starts, stops, steps = zip(*(k.indices(d) for k, d in zip(key, shape)))
    attrs = dict(starts=starts, stops=stops, steps=steps)
    check_grad(cpu, lambda t: F.slice(t, **attrs), x, seed=seed)
    # slice_backward is linear in g; its gradient is the slice again
    g = _x(seed + 1, x[key].shape)
    check_grad(cpu, lambda t: F.slice_backward(t, in_shape=shape, **attrs), g, seed=seed)


@pytest.mark.ops("cat", "stack", "split")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=SEEDS, data=st.data()
)
def test_cat_stack_split_grad(cpu, shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(st.integers(0, 2))
    a, b = _x(seed, shape), _x(seed + 1, tuple(other))
    check_grad(cpu, lambda s, t: F.cat([s, t, s], axis=axis), a, b, seed=seed)
    check_grad(cpu, lambda s, t: F.stack([s, t * s], axis=axis), a, _x(seed + 2, shape), seed=seed)
    n = shape[axis]
    sizes = [1, n - 1] if n > 1 else [1]

    def split(t):
        parts = F.split(t, sizes, axis=axis)
        return sum(((p * (k + 1.0)).sum() for k, p in enumerate(parts)), start=t.sum() * 0)

    check_grad(cpu, split, a, seed=seed)


@pytest.mark.ops("pad")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=SEEDS, data=st.data()
)
def test_pad_grad(cpu, shape, seed, data):
    pads = [tuple(data.draw(st.tuples(st.integers(0, 2), st.integers(0, 2)))) for _ in shape]
    check_grad(cpu, lambda t: F.pad(t, pads, value=1.5), _x(seed, shape), seed=seed)


@pytest.mark.ops("gather", "scatter_add")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=SEEDS, data=st.data()
)
def test_gather_scatter_grad(cpu, shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ishape = list(shape)
    ishape[axis] = data.draw(st.integers(1, 4))
    idx = rng.integers(0, shape[axis], ishape)
    x = _x(seed, shape)
    check_grad(cpu, lambda t, i: F.gather(t, i, axis=axis), x, idx, seed=seed)
    src = _x(seed + 1, tuple(ishape))
    check_grad(cpu, lambda t, i, s: F.scatter_add(t, i, s, axis=axis), x, idx, src, seed=seed)


@pytest.mark.ops("index_select", "index_add", "embedding")
@FEW
@given(
    shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seed=SEEDS, data=st.data()
)
def test_index_select_grad(cpu, shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    ishape = data.draw(array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    idx = rng.integers(0, shape[axis], ishape)  # duplicates: gradients must add up
    x = _x(seed, shape)
    neg = axis - len(shape)  # the negative spelling of the same axis
    check_grad(cpu, lambda t, i: F.index_select(t, i, axis=neg), x, idx, seed=seed)
    g = _x(seed + 1, (*shape[:axis], *ishape, *shape[axis + 1 :]))
    check_grad(cpu, lambda t, i: F.index_add(t, i, axis=axis, size=shape[axis]), g, idx, seed=seed)
    check_grad(cpu, lambda w, i: F.embedding(i, w), _x(seed, (4, 3)), rng.integers(0, 4, ishape))


# --- neural-network ops ---------------------------------------------------------------------


@st.composite
def conv_case(draw):
    groups = draw(st.integers(1, 2))
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0]), 5))
    w = draw(st.integers(max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1]), 5))
    n = draw(st.integers(1, 2))
    return (n, cg * groups, h, w), (og * groups, cg, kh, kw), stride, padding, dilation, groups


@pytest.mark.ops("conv2d")
@FEW
@given(spec=conv_case(), seed=SEEDS)
def test_conv2d_grad(cpu, spec, seed):
    xs, ws, stride, padding, dilation, groups = spec
    fn = lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups)  # noqa: E731
    check_grad(cpu, fn, _x(seed, xs), _x(seed + 1, ws), seed=seed)


@pytest.mark.ops("conv1d")
@FEW
@given(spec=conv_case(), seed=SEEDS)
def test_conv1d_grad(cpu, spec, seed):
    (n, c, _, length), (o, cg, _, k), stride, padding, dilation, groups = spec
    fn = lambda x, w: F.conv1d(  # noqa: E731
        x, w, None, stride[1], padding[1], dilation[1], groups
    )
    check_grad(cpu, fn, _x(seed, (n, c, length)), _x(seed + 1, (o, cg, k)), seed=seed)


@pytest.mark.ops("max_pool2d", "avg_pool2d")
@FEW
@given(
    n_c=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    s=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    p=st.tuples(st.integers(0, 1), st.integers(0, 1)),
    hw=st.tuples(st.integers(3, 5), st.integers(3, 5)),
    seed=SEEDS,
)
def test_pool_grad(cpu, n_c, k, s, p, hw, seed):
    p = tuple(min(pi, ki // 2) for pi, ki in zip(p, k))
    shape = (*n_c, *hw)
    x = np.random.default_rng(seed).permutation(int(np.prod(shape))).reshape(shape) * 0.1
    check_grad(cpu, lambda t: F.max_pool2d(t, k, s, p), x, seed=seed)
    check_grad(cpu, lambda t: F.avg_pool2d(t, k, s, p), _x(seed, shape), seed=seed)


@pytest.mark.ops(
    "conv2d_grad_input",
    "conv2d_grad_weight",
    "max_pool2d_backward",
    "avg_pool2d_backward",
    "quantize_int8",
)
def test_not_differentiable_ops_refuse_backward(cpu):
    x = cpu.tensor(_x(0, (1, 1, 4, 4)), requires_grad=True)
    w = cpu.tensor(_x(1, (1, 1, 2, 2)), requires_grad=True)
    g = cpu.tensor(_x(2, (1, 1, 3, 3)), requires_grad=True)
    cases = [
        lambda: F.conv2d_grad_input(g, w, input_shape=(1, 1, 4, 4)),
        lambda: F.conv2d_grad_weight(x, g, weight_shape=(1, 1, 2, 2)),
        lambda: F.max_pool2d_backward(x, cpu.tensor(_x(3, (1, 1, 2, 2))), kernel=2),
        lambda: F.avg_pool2d_backward(g[:, :, :2, :2], input_shape=(1, 1, 4, 4), kernel=2),
        lambda: F.quantize_int8(x.reshape(-1).cast("float32"), block=16)[1],
    ]
    for make in cases:
        y = make()
        with pytest.raises(RuntimeError, match="not differentiable"):
            y.sum().backward()


@pytest.mark.ops("layer_norm", "rms_norm")
@FEW
@given(shape=array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4), seed=SEEDS)
def test_norm_grads(cpu, shape, seed):
    x = _x(seed, shape)
    w, b = _x(seed + 1, shape[-1:]), _x(seed + 2, shape[-1:])
    check_grad(cpu, lambda t, wt, bt: F.layer_norm(t, wt, bt), x, w, b, seed=seed)
    check_grad(cpu, lambda t: F.layer_norm(t, eps=0.1), x, seed=seed)
    check_grad(cpu, lambda t, wt: F.rms_norm(t, wt), x, w, seed=seed)


@pytest.mark.ops("dropout")
@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_dropout_grad(cpu, shape, seed):
    check_grad(cpu, lambda t: F.dropout(t, 0.4, key=seed % 1000), _x(seed, shape), seed=seed)


@pytest.mark.ops("cross_entropy")
@FEW
@given(
    n=st.integers(1, 4),
    c=st.integers(2, 4),
    smoothing=st.sampled_from([0.0, 0.2]),
    seed=SEEDS,
)
def test_cross_entropy_grad(cpu, n, c, smoothing, seed):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, c, n)
    target[rng.random(n) < 0.3] = -100
    fn = lambda t, y: F.cross_entropy(t, y, label_smoothing=smoothing)  # noqa: E731
    check_grad(cpu, fn, _x(seed, (n, c), -3, 3), target, seed=seed)


@pytest.mark.ops("mse_loss")
@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_mse_grad(cpu, shape, seed):
    check_grad(cpu, F.mse_loss, _x(seed, shape), _x(seed + 1, shape), seed=seed)


# --- autodiff bookkeeping on edge shapes -----------------------------------------------------


@pytest.mark.ops("mul", "sum", "exp")
def test_grads_of_size_zero_and_0d(cpu):
    e = cpu.tensor(np.zeros((0, 3)), requires_grad=True)
    (e.exp() * 2.0).sum().backward()
    assert e.grad.shape == (0, 3) and e.grad.numpy().shape == (0, 3)
    s = cpu.tensor(np.float64(1.5), requires_grad=True)
    (s * s).backward()
    assert s.grad.shape == () and s.grad.item() == 3.0


@pytest.mark.ops("add", "mul")
def test_grad_accumulates_over_uses(cpu):
    x = cpu.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * x + x * 3.0 + x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1.0, 2.0]) + 4.0)


def test_integer_tensors_cannot_require_grad(cpu):
    with pytest.raises(TypeError, match="floating-point"):
        cpu.tensor([1, 2], requires_grad=True)
    with pytest.raises(RecordError):
        F.exp(cpu.tensor([1, 2]))


# --- collectives ------------------------------------------------------------------------------


@pytest.mark.ops("all_reduce")
def test_all_reduce_gradient_against_finite_differences():
    """loss = sum_k <c_k, mean_r x_r> over ranks k: each rank's backward all-reduces its
    incoming gradient, so every x_j gets (1/n) sum_k c_k, checked by central differences of
    the same loss in NumPy."""
    from burn_remote import collective as C

    rng = np.random.default_rng(5)
    devs = C.local_devices(3)
    xs = [rng.standard_normal(4) for _ in devs]
    cs = [rng.standard_normal(4) for _ in devs]

    def loss(values):
        mean = np.mean(values, axis=0)
        return sum(float(c @ mean) for c in cs)

    with C.Group(devs) as g:
        ts = [d.tensor(x, requires_grad=True) for d, x in zip(devs, xs)]
        for d, t, c in zip(devs, ts, cs):
            (C.all_reduce(t, g, "mean") * d.tensor(c)).sum().backward()
        C.sync(devs)
        eps = 1e-6
        for j, t in enumerate(ts):
            want = np.zeros(4)
            for i in range(4):
                up = [x.copy() for x in xs]
                down = [x.copy() for x in xs]
                up[j][i] += eps
                down[j][i] -= eps
                want[i] = (loss(up) - loss(down)) / (2 * eps)
            np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6, atol=1e-8)
