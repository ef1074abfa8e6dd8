"""GPU engines: the shared C expression table, fusion, OpenCL coverage and the CUDA backend.

The op suites (test_ops_forward, test_ops_grad) already run on every available backend;
this file checks what is particular to the generated-kernel backends. OpenCL runs on PoCL
where it is installed (`make test` installs it); CUDA tests skip without CuPy and a device.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from burn_remote import Device
from burn_remote import functional as F
from burn_remote.engine.backend import BackendUnavailable, get_backend
from burn_remote.engine.backends import cexpr
from burn_remote.engine.fusion import FusedProgram
from burn_remote.protocol import ops
from conftest import _UNAVAILABLE

OPENCL_WHY = _UNAVAILABLE["opencl"]
CUDA_WHY = _UNAVAILABLE["cuda:0"]
needs_opencl = pytest.mark.skipif(OPENCL_WHY is not None, reason=OPENCL_WHY or "")
needs_cuda = pytest.mark.skipif(CUDA_WHY is not None, reason=CUDA_WHY or "")


def test_expression_table_covers_every_elementwise_primitive():
    elementwise = (ops.UNARY | ops.BINARY | ops.COMPARE | {"where"}) & ops.PRIMITIVES
    missing = sorted(elementwise - cexpr.FUSABLE)
    assert not missing, f"elementwise ops without a C expression: {missing}"


def test_one_program_spells_the_same_expression_for_both_targets():
    from burn_remote.engine.backends.cupy_backend import fused_kernel_source
    from burn_remote.engine.backends.opencl_codegen import COMPUTE

    program = FusedProgram(
        ("float32", "float32"),
        (("mul", (("in", 0), ("in", 1)), "float32"), ("exp", (("t", 0),), "float32")),
    )
    ins, outs, cuda = fused_kernel_source(program)
    assert ins == "float32 x0, float32 x1" and outs == "float32 out"
    opencl = "\n".join(program.body(COMPUTE, lambda k: f"x{k}"))
    assert "exp(((float)(t0)))" in cuda and cuda.startswith(opencl)


def test_cuda_without_cupy_is_refused_clearly():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailable, match="CuPy"):
            get_backend("cuda:0")
    else:
        pytest.skip("CuPy is installed here")


# --- OpenCL ---------------------------------------------------------------------------------


@needs_opencl
def test_opencl_has_a_device_kernel_for_every_primitive():
    from burn_remote.engine.backends.opencl_backend import HOST_FALLBACK

    be = get_backend("opencl")
    missing = sorted(ops.PRIMITIVES - {"value"} - set(be.kernels))
    assert not missing, f"OpenCL lacks kernels for {missing}"
    assert HOST_FALLBACK == {}, "ops that run on the host must be listed and tested"


def _plan_ops(dev: Device) -> list[str]:
    plans = dev._rec.runtime.executor._plans
    return [st.op for st in next(reversed(plans.values())).steps]


@needs_opencl
def test_opencl_fuses_elementwise_chains_and_matches_unfused(rng):
    dev = Device.opencl()
    be = dev._rec.runtime.backend
    x = rng.standard_normal((33, 7)).astype(np.float32)
    y = rng.standard_normal((7,)).astype(np.float32)
    results = {}
    for fused in (True, False):
        be.fusion = fused
        dev._rec.runtime.executor._plans.clear()  # fusion happens when a graph is compiled
        tx, ty = dev.tensor(x), dev.tensor(y)
        shared = tx * 2.0 + ty  # read twice below: materialised, not fused through
        out = F.exp(F.relu(shared) - 0.5) + F.sum(F.tanh(shared), axes=1, keepdims=True)
        results[fused] = out.numpy()
        kinds = _plan_ops(dev)
        assert any(k.startswith("fused:") for k in kinds) == fused, kinds
    be.fusion = True
    np.testing.assert_array_equal(results[True], results[False])
    shared = x * 2 + y
    want = np.exp(np.maximum(shared, 0) - 0.5) + np.tanh(shared).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(results[True], want, rtol=1e-5, atol=1e-5)


@needs_opencl
def test_opencl_fusion_stops_at_narrow_floats(rng):
    dev = Device.opencl()
    x = rng.standard_normal(64).astype(np.float16)
    t = dev.tensor(x)
    got = (F.exp(t) * 3.0 + 1.0).numpy()  # float16 intermediates round like the CPU engine
    want = (Device.cpu().tensor(x).exp() * 3.0 + 1.0).numpy()
    np.testing.assert_array_equal(got, want)


@needs_opencl
@pytest.mark.timeout(300)
def test_digits_mlp_trains_on_opencl():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import digits

    _, losses, acc = digits.train(Device.opencl(), epochs=12)
    assert losses[-1] < losses[0] / 4
    assert acc >= 0.95, f"test accuracy {acc:.3f}"


# --- CUDA (CuPy) ------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.gpu
def test_cuda_fused_equals_unfused_and_pool_is_installed(rng):
    dev = Device.cuda(0)
    be = dev._rec.runtime.backend
    assert be.memory is not None or os.environ.get("BURN_REMOTE_POOL") == "0"
    x = rng.standard_normal((128, 64)).astype(np.float32)
    results = {}
    for fused in (True, False):
        be.fusion = fused
        dev._rec.runtime.executor._plans.clear()
        t = dev.tensor(x)
        results[fused] = (F.sigmoid(t * 1.5 - 0.25) * t).sum(axes=0).numpy()
        assert any(k.startswith("fused:") for k in _plan_ops(dev)) == fused
    be.fusion = True
    np.testing.assert_allclose(results[True], results[False], rtol=1e-6, atol=1e-6)
    assert dev.memory_stats() is not None


@needs_cuda
@pytest.mark.gpu
def test_cuda_sessions_get_their_own_streams():
    be = get_backend("cuda:0")
    one, two = be.session(), be.session()
    assert one.stream is not two.stream and one.kernels is two.kernels


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="outside CI the OpenCL suite may skip")
def test_opencl_backend_is_available_in_ci():
    """CI must run the op suite on PoCL: a missing OpenCL platform there is a failure."""
    assert get_backend("opencl").name.startswith("opencl")
