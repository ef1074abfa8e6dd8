"""The engine's backend table: one factory per device kind, and a base class whose optional
capabilities have declared defaults (callers never probe a backend with getattr)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from burn_remote.engine import backend_base
from burn_remote.engine.backend import FACTORIES, get_backend
from burn_remote.engine.backend_base import BACKEND_KINDS, Backend, parse_device


def test_every_kind_has_one_factory():
    assert set(FACTORIES) == set(BACKEND_KINDS)


def test_the_cpu_backend_is_a_backend_with_the_host_defaults():
    cpu = get_backend("cpu")
    assert isinstance(cpu, Backend) and get_backend(" CPU ") is cpu
    assert not cpu.activates and not cpu.reports_memory
    assert cpu.memory_stats() is None and cpu.session() is cpu
    plan = object()
    assert Backend.optimize_plan(cpu, plan) is plan  # the default; the CPU's own merges GEMMs
    assert not Backend.writes_into and cpu.writes_into["adam_update"] == (0, 2, 3)
    with cpu.activate():
        pass
    a = np.arange(3, dtype=np.float32)
    assert cpu.from_numpy(a) is a and cpu.scalar(2, "int32").dtype == np.int32


def test_every_backend_module_subclasses_the_base():
    from burn_remote.engine.backends import cupy_backend, numpy_backend

    assert issubclass(numpy_backend.NumpyBackend, Backend)
    assert issubclass(cupy_backend.CupyBackend, Backend)
    assert cupy_backend.CupyBackend.activates and cupy_backend.CupyBackend.reports_memory
    for name in ("from_numpy", "to_numpy", "scalar", "conform"):
        own = getattr(numpy_backend.NumpyBackend, name)
        assert own is not getattr(Backend, name), f"NumpyBackend leaves {name} abstract"


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("cpu", ("cpu", 0)),
        ("cuda:1", ("cuda", 1)),
        ("OpenCL", ("opencl", 0)),
        ("opencl:2", ("opencl", 2)),
    ],
)
def test_device_strings_of_local_backends(spec, expected):
    assert parse_device(spec) == expected


@pytest.mark.parametrize("spec", ["tpu", "cuda:-1", "cuda:x", ""])
def test_a_device_string_no_backend_serves_is_refused_naming_it(spec):
    with pytest.raises(ValueError, match=repr(spec).replace("[", r"\[")):
        get_backend(spec)


def test_the_base_declares_every_capability_it_documents():
    documented = {
        "activates",
        "reports_memory",
        "activate",
        "session",
        "optimize_plan",
        "memory_stats",
        "synchronize",
    }
    members = {name for name, _ in inspect.getmembers(Backend)}
    assert documented <= members
    assert backend_base.__all__
