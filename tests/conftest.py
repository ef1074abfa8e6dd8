"""Shared fixtures: a `device` fixture over every backend this machine can run, and helpers.

`BACKENDS` lists the device strings that work here: "cpu" always; "opencl" only when
`get_backend("opencl")` succeeds (PyOpenCL plus a platform, PoCL on CI); "cuda:0" only when
CuPy sees a device and the CuPy backend loads. Backends that are missing still appear as
parameters, skipped with the reason, so a test report says what did not run and why.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from burn_remote import Device
from burn_remote.protocol import dtypes


def _probe_opencl() -> str | None:
    """None when the OpenCL backend works here, otherwise why it does not."""
    try:
        from burn_remote.engine.backend import get_backend

        get_backend("opencl")
    except Exception as exc:  # any failure means "not here"
        return f"opencl backend unavailable: {type(exc).__name__}: {exc}"
    return None


def _probe_cuda() -> str | None:
    try:
        import cupy  # type: ignore[import-not-found]
    except Exception as exc:
        return f"cuda:0 unavailable: CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "cuda:0 unavailable: CuPy sees no CUDA device"
    except Exception as exc:
        return f"cuda:0 unavailable: CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    try:
        from burn_remote.engine.backend import get_backend

        get_backend("cuda:0")
    except Exception as exc:
        return f"cuda:0 unavailable: the CuPy backend does not load ({type(exc).__name__}: {exc})"
    return None


_UNAVAILABLE: dict[str, str | None] = {
    "cpu": None,
    "opencl": _probe_opencl(),
    "cuda:0": _probe_cuda(),
}

if os.environ.get("BURN_REMOTE_REQUIRE_CUDA") == "1" and _UNAVAILABLE["cuda:0"] is not None:
    # `make gpu-check` sets this: on the GPU machine a CUDA test that skips is a failure
    raise pytest.UsageError(f"BURN_REMOTE_REQUIRE_CUDA=1 but {_UNAVAILABLE['cuda:0']}")

BACKENDS: list[str] = [spec for spec, why in _UNAVAILABLE.items() if why is None]
"""Device strings that run on this machine."""

BACKEND_PARAMS = [
    pytest.param(
        spec,
        id=spec,
        marks=[pytest.mark.skip(reason=why)] if why else [],
    )
    for spec, why in _UNAVAILABLE.items()
]
"""Every backend as a pytest parameter; the unavailable ones are skipped with their reason."""


@pytest.fixture(scope="session", params=BACKEND_PARAMS)
def device(request) -> Device:
    """A device on each available backend (session-scoped: devices are process singletons)."""
    return Device.parse(request.param)


@pytest.fixture(scope="session")
def cpu() -> Device:
    """The embedded NumPy device, for tests that are about the client rather than a backend."""
    return Device.cpu()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


TOLERANCES = {
    "float64": (1e-10, 1e-10),
    "float32": (2e-5, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}


def tolerance(dtype: str) -> dict[str, float]:
    """rtol/atol for comparing a result of `dtype` with a float64 reference."""
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return {"rtol": rtol, "atol": atol}


def assert_close(got, want, dtype: str | None = None, **tol) -> None:
    """Compare a tensor (or array) with a NumPy reference, shape and values."""
    got_arr = got.numpy() if hasattr(got, "numpy") and not isinstance(got, np.ndarray) else got
    got_arr = np.asarray(got_arr)
    want = np.asarray(want)
    assert got_arr.shape == want.shape, f"shape {got_arr.shape} != expected {want.shape}"
    if dtype is None:
        dtype = dtypes.from_numpy(got_arr.dtype)
    opts = tolerance(dtype)
    opts.update(tol)
    if got_arr.dtype.kind in "biu" and want.dtype.kind in "biu":
        np.testing.assert_array_equal(got_arr, want)
    else:
        np.testing.assert_allclose(
            got_arr.astype(np.float64), want.astype(np.float64), equal_nan=True, **opts
        )


@pytest.fixture
def op_trace(request, monkeypatch):
    """Every op name recorded while a test runs (composites and primitives alike).

    When the test carries `@pytest.mark.ops(...)`, each named op must have been recorded:
    a declaration of coverage that the test does not honour fails the test.
    """
    from burn_remote import _ops as client_ops
    from burn_remote import _tensor as client_tensor
    from burn_remote import functional
    from burn_remote._recorder import _PKG_ROOTS as PKG_ROOTS
    from burn_remote._recorder import Recorder

    seen: set[str] = set()
    real_call, real_add = client_ops.call, Recorder.add

    def traced_call(name, *args, **kwargs):
        seen.add(name)
        if kwargs.get("_where") is None:  # name the test's line, not this wrapper's
            f = sys._getframe(1)
            while f is not None and f.f_code.co_filename.startswith(PKG_ROOTS):
                f = f.f_back
            if f is not None:
                kwargs["_where"] = (f.f_code.co_filename, f.f_lineno)
        return real_call(name, *args, **kwargs)

    def traced_add(self, node):
        seen.add(node.op)
        return real_add(self, node)

    monkeypatch.setattr(client_ops, "call", traced_call)
    monkeypatch.setattr(functional, "call", traced_call)
    monkeypatch.setattr(client_tensor, "call", traced_call)  # operands made by Tensor._bin
    monkeypatch.setattr(client_tensor.Tensor, "_call", staticmethod(traced_call))  # its methods
    monkeypatch.setattr(Recorder, "add", traced_add)
    yield seen
    declared = {name for mark in request.node.iter_markers("ops") for name in mark.args}
    missing = declared - seen
    assert not missing, f"test declares ops {sorted(missing)} but never recorded them"


@pytest.fixture(scope="session")
def close():
    """`close(got, want, dtype=None, rtol=.., atol=..)`: assert a result matches NumPy."""
    return assert_close


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ops(*names): registry ops a test covers (checked by test_ops_forward)"
    )
