"""Extensions declared once: recorded lazily, hashed with their version, replayed, checked."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, Extension, RecordError
from burn_remote.engine import extensions as engine_ext
from burn_remote.fused import linear_bias_relu
from burn_remote.protocol import extensions as ext
from burn_remote.protocol.graph import Graph, GraphNode, decode, validate
from conftest import _UNAVAILABLE
from support.extdemo_ops import scale_shift, snap, testext
from support.gradcheck import check_grad


@pytest.fixture
def cpu():
    return Device.cpu()


def _capture(dev, build):
    """Record `build()` and return the captured graph without running it."""
    out = build()
    capture = dev._rec.capture()
    return out, capture


def test_extension_op_runs_locally_and_is_lazy(cpu):
    cpu.flush()  # the device is the process's: another test may have left work pending
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    y = scale_shift(cpu.tensor(x), scale=3.0, shift=1.0)
    assert y.shape == (2, 3) and y.dtype == "float64"
    assert [n.op for n in cpu._rec.pending] == ["testext.scale_shift@1"]
    np.testing.assert_allclose(y.numpy(), x * 3 + 1)


def test_wire_name_carries_the_version_into_the_graph_hash(cpu):
    assert scale_shift.wire == "testext.scale_shift@1" and scale_shift.name == "testext.scale_shift"
    x = cpu.tensor(np.ones((2, 2), np.float32))
    _, capture = _capture(cpu, lambda: scale_shift(x))
    graph = capture.graph
    assert graph.nodes[0].op == "testext.scale_shift@1"
    assert b"testext.scale_shift@1" in graph.encode()
    validate(decode(graph.encode()))  # the server's check accepts it like a built-in
    bumped = Graph(
        graph.inputs,
        tuple(
            GraphNode("testext.scale_shift@2", n.inputs, n.attrs, n.outputs) for n in graph.nodes
        ),
        graph.outputs,
    )
    assert bumped.digest() != graph.digest()
    assert ext.required_extensions(graph) == {"testext": "1"}


def test_extension_ops_replay_from_the_plan_cache(cpu):
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    b = np.zeros(3, np.float32)
    W, B = cpu.tensor(w), cpu.tensor(b)
    before = cpu.stats()
    for step in range(3):
        x = np.full((2, 4), float(step), np.float32)
        y = linear_bias_relu(scale_shift(cpu.tensor(x), scale=0.5), W, B)
        np.testing.assert_allclose(y.numpy(), np.maximum((x * 0.5) @ w + b, 0), rtol=1e-6)
    after = cpu.stats()
    assert after["graphs_registered"] - before["graphs_registered"] == 1
    assert after["replays"] - before["replays"] == 3


def test_linear_bias_relu_matches_numpy_and_refuses_bad_shapes(cpu):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 5, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3)
    y = linear_bias_relu(cpu.tensor(x), cpu.tensor(w), cpu.tensor(b))
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ w + b, 0))
    with pytest.raises(RecordError, match=r"linear_bias_relu.*test_extensions.py"):
        linear_bias_relu(cpu.tensor(x), cpu.tensor(w.T), cpu.tensor(b))


def test_linear_bias_relu_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    b = rng.uniform(0.2, 0.5, 5)  # keep pre-activations away from the kink at 0
    pre = x @ w + b
    x[np.abs(pre).min(axis=1) < 1e-3] += 0.01
    check_grad(linear_bias_relu, x, w, b)
    check_grad(lambda t: scale_shift(t, scale=-1.5, shift=2.0), rng.standard_normal((2, 3)))


def test_not_differentiable_names_the_op_in_backward(cpu):
    x = cpu.tensor(np.ones(3), requires_grad=True)
    loss = snap(x * 2.0).sum()
    with pytest.raises(RuntimeError, match=r"testext\.snap@1.*not differentiable"):
        loss.backward()


def test_declaration_errors():
    with pytest.raises(ext.ExtensionError, match="already registered"):
        Extension("testext", version="2")
    with pytest.raises(ext.ExtensionError, match="lower-case"):
        Extension("Bad-Name")
    with pytest.raises(ext.ExtensionError, match="plain version"):
        Extension("okname", version="1@2")
    with pytest.raises(ext.ExtensionError, match="declared twice"):
        testext.op("snap", arity=1, infer=lambda xs, a: [(xs[0].shape, xs[0].dtype)])
    with pytest.raises(ValueError, match="unknown backend kind"):
        scale_shift.kernel("tpu")(lambda x, scale, shift: x)


def test_check_graph_extensions_names_what_is_missing(cpu):
    x = cpu.tensor(np.ones(2))
    _, capture = _capture(cpu, lambda: scale_shift(x) + 1.0)
    graph = capture.graph
    ext.check_graph_extensions(graph, {"testext": "1"})
    with pytest.raises(
        ext.ExtensionMissing, match=r"extension 'testext' version 1.*not installed"
    ) as info:
        ext.check_graph_extensions(graph, {"linalg": "1"})
    assert info.value.extension == "testext" and info.value.node == 0
    with pytest.raises(ext.ExtensionMissing, match=r"version 3 is installed"):
        ext.check_graph_extensions(graph, {"testext": "3"})
    assert ext.format_extensions({"b": "2", "a": "1"}) == "a 1, b 2"
    assert ext.parse_wire_name("linalg.solve@1") == ("linalg", "solve", "1")
    assert ext.parse_wire_name("matmul") is None


class _FakeBackend:
    """Enough of a backend to show how a GPU backend receives extension kernels."""

    def __init__(self, name):
        self.name = name
        self.kernels = {}

    def to_numpy(self, a):
        return np.asarray(a.data)

    def from_numpy(self, a):
        return _Box(a)


class _Box:
    def __init__(self, data):
        self.data = data


def test_other_backends_get_a_host_fallback_then_native_kernels():
    backend = _FakeBackend("opencl")
    engine_ext.install(backend)
    fallback = backend.kernels[scale_shift.wire]
    assert getattr(fallback, "host_fallback", False)
    out = fallback(_Box(np.array([1.0, 2.0])), scale=2.0, shift=1.0)
    np.testing.assert_allclose(out.data, [3.0, 5.0])

    other = Extension("latejoin", version="1")
    op = other.op("double", arity=1, infer=lambda xs, a: [(xs[0].shape, xs[0].dtype)])

    @op.kernel("opencl")
    def _double_cl(x):
        return _Box(x.data * 2)

    assert backend.kernels[op.wire] is _double_cl  # joined a live backend at registration
    assert engine_ext.kernels_of(op.wire) == {"cpu": False, "cuda": False, "opencl": True}


@pytest.mark.skipif(_UNAVAILABLE["opencl"] is not None, reason=_UNAVAILABLE["opencl"] or "")
def test_linear_bias_relu_runs_natively_on_opencl():
    """The shipped example has an OpenCL kernel of its own: no host fallback on that device."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    dev = Device.opencl()
    out = linear_bias_relu(dev.tensor(x), dev.tensor(w), dev.tensor(b)).numpy()
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    assert engine_ext.kernels_of(linear_bias_relu.wire) == {
        "cpu": True,
        "cuda": True,
        "opencl": True,
    }
    kernel = dev._rec.runtime.backend.kernels[linear_bias_relu.wire]
    assert not getattr(kernel, "host_fallback", False)
