"""A stand-in for CuPy on NumPy, so the CUDA backend's own code runs here without a GPU.

The real CuPy package is installed (``make test`` pins it) and imports without a driver; what
it cannot do here is run anything. `SimCupy` takes its place in ``sys.modules`` while a test
runs and:

- executes every array-module call on NumPy, after checking it against the signature of the
  real CuPy function of the same name (a keyword CuPy lacks, a function CuPy lacks, a ufunc
  method CuPy lacks and the dtypes `cupyx.scatter_add` refuses all raise `NotOnCupy`);
- allocates every array that would own device memory through the allocator installed with
  ``cupy.cuda.set_allocator`` (so the adaptive pool runs as on a GPU) and counts the
  cudaMalloc/cudaFree that the page allocator does (`Memory` objects);
- keeps CUDA's streams, events and current device per thread, and logs on which stream each
  allocation, upload, read and synchronise happened, so stream ordering can be checked;
- records every `ElementwiseKernel` made (the fused programs of real graphs), for NVRTC;
- counts device-to-host syncs (``int()``, ``float()``, ``bool()``, ``item()`` of an array).

Generated kernels are evaluated from their `FusedProgram` with the NumPy kernels (the
`SimCupyBackend` subclass); NVRTC checks their CUDA source separately (test_cuda_offline).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import sys
import threading
import types
import weakref
from typing import Any

import cupy as real_cupy  # noqa: E402  (the real package, for its signatures)
import cupyx as real_cupyx  # noqa: E402
import numpy as np
from burn_remote.engine.backends import cexpr
from burn_remote.engine.backends.cupy_backend import CupyBackend
from burn_remote.engine.backends.numpy_kernels import KERNELS as NUMPY_KERNELS
from burn_remote.protocol import dtypes

_SCATTER_ADD_OK = (np.int32, np.int64, np.float16, np.float32, np.float64, np.uint32, np.uint64)
"""The dtypes CuPy's scatter_add accepts (its own check, cupy/_core/_routines_indexing.pyx)."""

_UFUNC_CALL_KWARGS = {"out", "dtype", "casting", "subok"}
"""Keywords a CuPy ufunc call accepts (`subok` comes from NumPy's own array methods, which
stand for CuPy's methods here)."""


class NotOnCupy(TypeError):
    """A call that real CuPy would refuse."""


class SimState:
    """What one simulated GPU saw: allocations, streams, syncs, kernels."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.local = threading.local()
        self.allocator: Any = None
        self.mallocs = 0
        """cudaMalloc calls (page reservations through `cuda.memory.Memory`)."""
        self.frees = 0
        self.default_pool_allocs = 0
        self.pool_allocs = 0
        """Allocations that went through the installed allocator."""
        self.syncs = 0
        self.log: list[tuple[str, int, int]] = []
        """(event, stream ptr, device) for "alloc", "upload", "read", "sync", "record"."""
        self.kernels: list[tuple[str, str, str, str]] = []
        """(in_params, out_params, operation, name) of every ElementwiseKernel made."""
        self.programs: list[Any] = []
        self.calls: set[str] = set()
        self.capacity: int | None = None
        """Bytes of device memory; past it cudaMalloc fails (None: no limit)."""
        self.device_bytes = 0
        self.lag = False
        """True: events complete only when their stream is synchronised (a busy GPU)."""
        self._roots: dict[int, Any] = {}
        self._ptrs = itertools.count(1 << 20, 1 << 12)

    # --- per-thread device and stream ------------------------------------------------------
    @property
    def device(self) -> int:
        return getattr(self.local, "device", 0)

    def streams(self) -> list[Any]:
        if not hasattr(self.local, "streams"):
            self.local.streams = []
        return self.local.streams

    def current_stream(self) -> Any:
        stack = self.streams()
        return stack[-1] if stack else NULL_STREAM

    def note(self, event: str, stream: Any = None) -> None:
        stream = self.current_stream() if stream is None else stream
        self.log.append((event, stream.ptr, self.device))

    # --- device memory behind arrays ---------------------------------------------------------
    def track(self, array: np.ndarray) -> None:
        """Give an array that owns its data a device allocation (views share their root's)."""
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if id(root) in self._roots or root.nbytes == 0:
            return
        self.note("alloc")
        if self.allocator is not None:
            self.pool_allocs += 1
            ptr = self.allocator(root.nbytes)
        else:
            self.default_pool_allocs += 1
            ptr = None
        key = id(root)
        self._roots[key] = weakref.finalize(root, self._untrack, key, ptr)

    def _untrack(self, key: int, ptr: Any) -> None:
        self._roots.pop(key, None)
        del ptr  # the last reference: CuPy frees the memory here

    def new_address(self) -> int:
        return next(self._ptrs)


SIM: SimState | None = None


def _sim() -> SimState:
    assert SIM is not None, "the CUDA simulator is not active"
    return SIM


# --- arrays ---------------------------------------------------------------------------------


def _unwrap(x: Any) -> Any:
    if isinstance(x, SimArray):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, SimArray):
        return x
    if isinstance(x, np.ndarray):
        return x.view(SimArray)
    if isinstance(x, np.generic):  # CuPy returns 0-d arrays where NumPy returns scalars
        return np.asarray(x).view(SimArray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _check_call(what: str, real: Any, args: tuple, kwargs: dict) -> None:
    if real not in _SIGNATURES:
        try:
            _SIGNATURES[real] = inspect.signature(real)
        except (TypeError, ValueError):
            _SIGNATURES[real] = None
    sig = _SIGNATURES[real]
    if sig is not None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise NotOnCupy(f"{what}: CuPy's signature is {what}{sig}: {exc}") from None
    _sim().calls.add(what)


def _cupy_counterpart(func: Any) -> Any:
    obj: Any = real_cupy
    for part in (func.__module__ or "numpy").split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return getattr(obj, func.__name__, None)


_METHODS = (
    "astype", "max", "min", "sum", "mean", "prod", "argmax", "argmin", "reshape", "transpose",
    "copy", "take", "any", "all", "cumsum", "clip", "ravel", "squeeze", "repeat", "fill",
    "swapaxes", "nonzero",
)  # fmt: skip
"""ndarray methods whose calls are checked against cupy.ndarray's (from its docstrings:
Cython methods have no introspectable signature, but CuPy embeds one as the first line)."""


def _method_signature(name: str) -> inspect.Signature | None:
    doc = (getattr(real_cupy.ndarray, name).__doc__ or "").strip().splitlines()
    head = doc[0].split(" -> ")[0] if doc else ""
    if "(" not in head:
        return None
    params = []
    for part in head[head.index("(") + 1 : head.rindex(")")].split(","):
        name, eq, default = part.strip().partition("=")
        params.append(name.split()[-1] + eq + default)  # drop Cython types ("int axis")
    params = ", ".join(params)
    namespace: dict[str, Any] = {}
    exec(f"def _m({params}): pass", namespace)  # the text is CuPy's own docstring
    return inspect.signature(namespace["_m"])


def _checked_method(name: str) -> Any:
    numpy_method = getattr(np.ndarray, name)
    sig = _method_signature(name)

    def method(self: SimArray, *args: Any, **kwargs: Any) -> Any:
        if sig is not None:
            try:
                sig.bind(self, *args, **kwargs)
            except TypeError as exc:
                raise NotOnCupy(f"cupy.ndarray.{name}{sig}: {exc}") from None
        _sim().calls.add(f"cupy.ndarray.{name}")
        return _wrap(numpy_method(self, *args, **kwargs))

    method.__name__ = name
    return method


class SimArray(np.ndarray):
    """A "device" array: NumPy memory standing for CUDA memory."""

    __module__ = "cupy"  # what numpy_kernels._mod looks at to pick the array module

    def __array_finalize__(self, obj: Any) -> None:
        if SIM is not None:
            SIM.track(self)

    def __array_function__(self, func, types_, args, kwargs):
        real = _cupy_counterpart(func)
        if real is None or real is func:
            raise NotOnCupy(f"CuPy has no {func.__module__}.{func.__name__}")
        _check_call(f"cupy.{func.__name__}", real, args, kwargs)
        return _wrap(func._implementation(*_unwrap(args), **_unwrap(kwargs)))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        real = getattr(real_cupy, ufunc.__name__, None)
        if real is None:
            raise NotOnCupy(f"CuPy has no ufunc {ufunc.__name__}")
        if method == "__call__":
            extra = set(kwargs) - _UFUNC_CALL_KWARGS
            if extra:
                raise NotOnCupy(f"cupy.{ufunc.__name__}() takes no {sorted(extra)}")
        elif method in ("at", "outer") and not hasattr(real, method):
            raise NotOnCupy(f"cupy.{ufunc.__name__} has no .{method}")
        _sim().calls.add(f"cupy.{ufunc.__name__}.{method}")
        out = kwargs.get("out")
        result = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if out is not None:
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _wrap(result)

    for _name in _METHODS:
        locals()[_name] = _checked_method(_name)
    del _name

    # device -> host conversions are syncs on a GPU
    def _sync(self) -> None:
        _sim().syncs += 1

    def __bool__(self) -> bool:
        self._sync()
        return bool(self.view(np.ndarray))

    def __int__(self) -> int:
        self._sync()
        return int(self.view(np.ndarray))

    def __float__(self) -> float:
        self._sync()
        return float(self.view(np.ndarray))

    def __index__(self) -> int:
        self._sync()
        return self.view(np.ndarray).__index__()

    def item(self, *args: Any) -> Any:
        self._sync()
        return self.view(np.ndarray).item(*args)

    def tolist(self) -> Any:
        self._sync()
        return self.view(np.ndarray).tolist()


# --- the CUDA namespace ---------------------------------------------------------------------


class _Stream:
    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int | None = None):
        self.ptr = 0 if null else (ptr if ptr is not None else _sim().new_address())
        self.device = 0 if null else _sim().device
        self.non_blocking = non_blocking
        self.events: list[_Event] = []

    def __enter__(self) -> _Stream:
        _sim().streams().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _sim().streams().pop()

    def synchronize(self) -> None:
        _sim().note("sync", self)
        for event in self.events:
            event._done = True


NULL_STREAM = _Stream.__new__(_Stream)
NULL_STREAM.ptr, NULL_STREAM.device, NULL_STREAM.non_blocking, NULL_STREAM.events = 0, 0, False, []


class _Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess=False):
        self._done = True

    def record(self, stream: Any = None) -> None:
        stream = _sim().current_stream() if stream is None else stream
        _sim().note("record", stream)
        self._done = not _sim().lag
        stream.events.append(self)

    @property
    def done(self) -> bool:
        return self._done


class _Device:
    def __init__(self, device: int = 0) -> None:
        self.id = device
        self.compute_capability = "90"
        self._prev: list[int] = []

    def __enter__(self) -> _Device:
        sim = _sim()
        self._prev.append(sim.device)
        sim.local.device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _sim().local.device = self._prev.pop()


class _Memory:
    """cudaMalloc'd memory: counted in and out."""

    def __init__(self, nbytes: int) -> None:
        sim = _sim()
        if sim.capacity is not None and sim.device_bytes + nbytes > sim.capacity:
            raise MemoryError(f"out of memory allocating {nbytes} bytes")  # CuPy's is one
        sim.mallocs += 1
        sim.device_bytes += nbytes
        self.ptr = sim.new_address() + (1 << 40)
        self.size = nbytes
        weakref.finalize(self, _count_free, sim, nbytes)


def _count_free(sim: SimState, nbytes: int) -> None:
    sim.frees += 1
    sim.device_bytes -= nbytes


class _UnownedMemory:
    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = 0) -> None:
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class _MemoryPointer:
    def __init__(self, mem: Any, offset: int) -> None:
        self.mem, self.ptr = mem, mem.ptr + offset


class _DefaultPool:
    def malloc(self, nbytes: int) -> Any:
        return _MemoryPointer(_UnownedMemory(0, nbytes, None), 0)

    def total_bytes(self) -> int:
        return 0


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:
        return _sim().devices

    @staticmethod
    def getDevice() -> int:
        return _sim().device

    @staticmethod
    def memcpy(dst: int, src: int, nbytes: int, kind: int) -> None:
        _sim().note("memcpy")


def _set_allocator(fn: Any) -> None:
    _sim().allocator = fn


def _cuda_namespace() -> types.SimpleNamespace:
    stream_cls = _Stream
    stream_cls.null = NULL_STREAM  # type: ignore[attr-defined]
    return types.SimpleNamespace(
        runtime=_Runtime,
        Device=_Device,
        Stream=stream_cls,
        Event=_Event,
        get_current_stream=lambda: _sim().current_stream(),
        memory=types.SimpleNamespace(Memory=_Memory),
        Memory=_Memory,
        UnownedMemory=_UnownedMemory,
        MemoryPointer=_MemoryPointer,
        set_allocator=_set_allocator,
    )


# --- the module -----------------------------------------------------------------------------


class _ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", preamble="", **kw):
        _check_call(
            "cupy.ElementwiseKernel",
            real_cupy.ElementwiseKernel.__init__,
            (None, in_params, out_params, operation, name),
            {"preamble": preamble, **kw},
        )
        self.source = (in_params, out_params, operation, name)
        _sim().kernels.append(self.source)

    def __call__(self, *args: Any) -> Any:
        raise NotOnCupy("the simulator runs generated kernels through SimCupyBackend")


def _host_array(a: Any, dtype: Any = None) -> SimArray:
    """An upload: a device copy of host data."""
    _sim().note("upload")
    return np.array(a, dtype=dtype, copy=True).view(SimArray)


class SimCupy(types.ModuleType):
    """`import cupy` while the simulator is active."""

    ndarray = SimArray
    ElementwiseKernel = _ElementwiseKernel

    def __init__(self) -> None:
        super().__init__("cupy")
        self.cuda = _cuda_namespace()
        self.lib = types.SimpleNamespace(
            stride_tricks=types.SimpleNamespace(as_strided=self._as_strided)
        )

    @staticmethod
    def _as_strided(x: Any, shape: Any = None, strides: Any = None) -> Any:
        _check_call(
            "cupy.lib.stride_tricks.as_strided",
            real_cupy.lib.stride_tricks.as_strided,
            (x,),
            {"shape": shape, "strides": strides},
        )
        return _wrap(np.lib.stride_tricks.as_strided(_unwrap(x), shape=shape, strides=strides))

    @staticmethod
    def asarray(a: Any, dtype: Any = None, order: Any = None, **kw: Any) -> Any:
        _check_call("cupy.asarray", real_cupy.asarray, (a, dtype, order), kw)
        if isinstance(a, SimArray):
            return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
        if isinstance(a, np.ndarray) and a.dtype.kind == "O":
            raise NotOnCupy("CuPy has no object arrays")
        return _host_array(a, dtype)

    @staticmethod
    def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking=True):
        sim = _sim()
        sim.note("read", stream if stream is not None else sim.current_stream())
        if not blocking:
            raise NotOnCupy("burn-remote reads blocking")
        return np.array(_unwrap(a), copy=True)

    @staticmethod
    def get_default_memory_pool() -> _DefaultPool:
        return _DefaultPool()

    def __getattr__(self, name: str) -> Any:
        real = getattr(real_cupy, name, None)
        if real is None:
            raise AttributeError(f"CuPy has no attribute {name!r}")
        target = getattr(np, name, None)
        if target is None:
            raise NotOnCupy(f"the simulator has no NumPy counterpart of cupy.{name}")
        if isinstance(target, type) or not callable(target):
            return target  # dtypes and constants are NumPy's own in CuPy too
        if isinstance(target, np.ufunc):

            def ufunc(*args: Any, **kwargs: Any) -> Any:
                if not any(isinstance(a, SimArray) for a in args):
                    args = (_wrap(np.asarray(args[0])), *args[1:])
                return target(*args, **kwargs)

            return ufunc

        def function(*args: Any, **kwargs: Any) -> Any:
            _check_call(f"cupy.{name}", real, args, kwargs)
            return _wrap(target(*_unwrap(args), **_unwrap(kwargs)))

        return function


class SimCupyx(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupyx")

    @staticmethod
    def scatter_add(a: Any, slices: Any, value: Any) -> None:
        _check_call("cupyx.scatter_add", real_cupyx.scatter_add, (a, slices, value), {})
        if not issubclass(a.dtype.type, _SCATTER_ADD_OK):
            raise NotOnCupy(
                "cupy.add.at only supports int32, int64, float16, float32, float64, uint32, "
                f"uint64 as data type (got {a.dtype})"
            )
        np.add.at(_unwrap(a), _unwrap(slices), _unwrap(value))


# --- the backend ----------------------------------------------------------------------------


def evaluate_program(program: Any, xs: tuple[Any, ...]) -> Any:
    """What a fused kernel computes, step by step with the NumPy kernels, in the same
    compute and storage dtypes as its generated C (fusion.FusedProgram.body)."""
    vals: list[np.ndarray] = []
    host = [_unwrap(x) for x in xs]
    for op, refs, out in program.instructions:
        in_dt = tuple(
            program.inputs[k] if kind == "in" else program.instructions[k][2] for kind, k in refs
        )
        comp = cexpr.compute_dtype(op, in_dt, out)
        args = [
            np.asarray(host[k] if kind == "in" else vals[k]).astype(dtypes.to_numpy(c))
            for (kind, k), c in zip(refs, comp)
        ]
        with np.errstate(all="ignore"):
            r = args[0] if op == "cast" else NUMPY_KERNELS[op](*args)
        wide = "float32" if out in ("float16", "bfloat16") else out
        vals.append(np.asarray(r).astype(dtypes.to_numpy(wide)))
    shape = np.broadcast_shapes(*(np.shape(h) for h in host))
    result = np.broadcast_to(vals[-1], shape).astype(dtypes.to_numpy(program.out_dtype))
    return _wrap(result)


class SimCupyBackend(CupyBackend):
    """The real CUDA backend over the simulator: its generated kernels are recorded (for
    NVRTC) and evaluated with `evaluate_program`."""

    def compile_program(self, program: Any, name: str) -> Any:
        super().compile_program(program, name)  # the ElementwiseKernel CuPy would build
        _sim().programs.append(program)
        return lambda *xs: evaluate_program(program, xs)


@contextlib.contextmanager
def simulated_cuda(devices: int = 1):
    """Install the simulator as ``cupy``/``cupyx`` for the duration; yields its state."""
    global SIM
    from burn_remote.engine.memory import _cupy as memory_cupy

    saved = {k: sys.modules.get(k) for k in ("cupy", "cupyx")}
    state = SimState(devices)
    SIM = state
    sys.modules["cupy"], sys.modules["cupyx"] = SimCupy(), SimCupyx()
    memory_cupy._INSTALLED = None
    try:
        yield state
    finally:
        from burn_remote.engine import extensions

        extensions._LIVE[:] = [b for b in extensions._LIVE if not isinstance(b, SimCupyBackend)]
        memory_cupy._INSTALLED = None
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        # SIM stays set: finalizers of arrays the test left behind still run against it


def sim_device(backend: CupyBackend) -> Any:
    """A client Device whose runtime runs on `backend` (a session of it, as Device.cuda does)."""
    from burn_remote import Device
    from burn_remote._device import LocalRuntime
    from burn_remote.engine import backend as backend_mod
    from burn_remote.engine import extensions

    key = ("cuda", backend.index)
    saved = backend_mod._CACHE.get(key)
    backend_mod._CACHE[key] = backend
    extensions.install(backend)
    try:
        runtime = LocalRuntime(backend.name)
    finally:
        if saved is None:
            backend_mod._CACHE.pop(key, None)
        else:
            backend_mod._CACHE[key] = saved
    dev = Device(backend.name, runtime)
    dev._base_backend = backend
    return dev
