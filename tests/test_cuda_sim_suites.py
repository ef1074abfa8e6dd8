"""The shared op suites (forward, gradients, indexing, dtypes) and the single-device GPU
tests on the simulated GPU.

Every test of those files that takes the `device` fixture runs here once more, with each of
its parameter sets, on the real CUDA backend over tests/support/cuda_sim.py: the NumPy-shaped
kernels then make their array-module calls as they would on CuPy, and each call is checked
against CuPy's own signature (a keyword CuPy lacks, a ufunc method it lacks or a dtype
`scatter_add` refuses fails the case). The results are checked by the suites' own oracles.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
import sys

import numpy as np
import pytest

if os.environ.get("CI") != "true":  # in CI (`make test` installs CuPy) these must run
    pytest.importorskip("cupy", reason="CuPy is not installed (make test installs it)")

SUITES = (
    "test_ops_forward",
    "test_ops_forward_nn",
    "test_ops_forward_shape",
    "test_ops_grad",
    "test_indexing",
    "test_dtypes",
)
FIXTURES = {"device", "rng", "close"}
"""Fixtures the simulated runs provide; tests that need others are left to their suites."""


def _param_sets(fn) -> list[dict]:
    sets: list[list[dict]] = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for v in values:
            v = v.values if hasattr(v, "values") and not isinstance(v, dict) else v
            v = v if len(names) > 1 else (v[0] if isinstance(v, tuple) and len(v) == 1 else v,)
            rows.append(dict(zip(names, v)))
        sets.append(rows)
    return [
        dict(itertools.chain.from_iterable(d.items() for d in combo))
        for combo in itertools.product(*sets)
    ] or [{}]


def _cases() -> list:
    cases = []
    for module_name in SUITES:
        module = importlib.import_module(module_name)
        for name, fn in sorted(vars(module).items()):
            if not name.startswith("test_") or not callable(fn):
                continue
            params = set(inspect.signature(fn).parameters)
            for n, kwargs in enumerate(_param_sets(fn)):
                if "device" not in params or not params - set(kwargs) <= FIXTURES:
                    continue
                marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "skip"]
                cases.append(
                    pytest.param(fn, kwargs, id=f"{module_name}::{name}[{n}]", marks=marks)
                )
    return cases


CASES = _cases()
RECORDED: list = []
"""Every kernel program the CUDA backend generated for the cases (compiled at the end)."""


def test_the_suites_are_collected():
    assert len(CASES) > 150, len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("fn,kwargs", CASES)
def test_suite_case_on_simulated_cuda(fn, kwargs, monkeypatch):
    from conftest import assert_close
    from support.cuda_sim import SimCupyBackend, sim_device, simulated_cuda

    monkeypatch.delenv("BURN_REMOTE_POOL", raising=False)
    with simulated_cuda() as sim:
        dev = sim_device(SimCupyBackend(0, cupy=sys.modules["cupy"]))
        fixtures = {"device": dev, "rng": np.random.default_rng(1234), "close": assert_close}
        wanted = set(inspect.signature(fn).parameters) - set(kwargs)
        try:
            fn(**kwargs, **{k: fixtures[k] for k in wanted})
        finally:
            RECORDED.extend(sim.programs)


GPU_TESTS = (
    "test_digits_mlp_trains_on_cuda",
    "test_replayed_steps_reserve_no_device_memory",
    "test_gradients_of_conv_pool_gather_scatter_match_the_cpu",
    "test_scatter_add_small_dtypes_on_cuda",
    "test_bfloat16_and_uniform_on_cuda",
    "test_linalg_and_signal_on_cuda_match_the_cpu",
    "test_a_host_fallback_reads_what_the_plan_wrote",
)
"""The tests of test_cuda_gpu.py that run in one process on one device: here they run on
the simulated GPU too, so their logic is checked before a GPU ever runs them (the others
start a server process, use threads or need two devices)."""


def _gpu_cases() -> list:
    import test_cuda_gpu

    cases = []
    for name in GPU_TESTS:
        fn = getattr(test_cuda_gpu, name)
        for n, kwargs in enumerate(_param_sets(fn)):
            cases.append(pytest.param(fn, kwargs, id=f"{name}[{n}]"))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("fn,kwargs", _gpu_cases())
def test_gpu_test_on_simulated_cuda(fn, kwargs, monkeypatch):
    """`Device.cuda(0)` is the simulated device for the duration."""
    from burn_remote import Device
    from burn_remote.engine import backend as backend_mod
    from support.cuda_sim import SimCupyBackend, sim_device, simulated_cuda

    monkeypatch.delenv("BURN_REMOTE_POOL", raising=False)
    with simulated_cuda() as sim:
        backend = SimCupyBackend(0, cupy=sys.modules["cupy"])
        dev = sim_device(backend)
        monkeypatch.setitem(Device._instances, "cuda:0", dev)
        monkeypatch.setitem(backend_mod._CACHE, ("cuda", 0), backend)
        fixtures = {"gpu": dev, "rng": np.random.default_rng(1234)}
        wanted = set(inspect.signature(fn).parameters) - set(kwargs)
        try:
            fn(**kwargs, **{k: fixtures[k] for k in wanted})
        finally:
            RECORDED.extend(sim.programs)


@pytest.mark.slow
def test_every_kernel_the_suites_generated_compiles_with_nvrtc():
    """The programs (fused chains included) that the cases above made the CUDA backend
    generate, compiled for sm_80 and sm_90 (runs after them: pytest keeps file order)."""
    from support import cuda_nvrtc

    if not RECORDED:
        pytest.skip("no simulated suite case ran in this session (deselected)")
    if cuda_nvrtc.cuda_headers_found() is not None and os.environ.get("CI") != "true":
        pytest.skip(f"NVRTC: {cuda_nvrtc.cuda_headers_found()}")
    sources = list(cuda_nvrtc.recorded_programs(RECORDED))
    assert any(len(p.instructions) > 1 for p in RECORDED), "no fused chain was recorded"
    count, failures = cuda_nvrtc.compile_all(sources, variants=False)
    assert not failures, "\n\n".join(f"{f.label} sm_{f.arch}:\n{f.log[:600]}" for f in failures)
