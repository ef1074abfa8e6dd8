"""Devices: chosen at run time by string, each with its own recorder and runtime."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from burn_remote.protocol import dtypes

from . import _ops
from ._recorder import OpFailed, Recorder, op_failure
from ._tensor import Tensor, make_tensor

POOL_ENV = "BURN_REMOTE_POOL"
"""1: local CPU devices allocate every tensor from the adaptive pools (engine.memory); 0: from
NumPy. Unset: pools only where a memory limit is set, because on the CPU a pool costs a copy
per op (about 10 us) that NumPy's allocator does not; `memory_stats()` answers either way."""


class LocalRuntime:
    """Runs captured graphs in-process through the engine, exactly as a server does."""

    copies_uploads = False
    """The NumPy engine keeps an uploaded array as it is, so the device copies it first."""

    def __init__(
        self, spec: str, memory_limit: int | None = None, pooled: bool | None = None
    ) -> None:
        from burn_remote.engine.backend import get_backend
        from burn_remote.engine.executor import ExecutionError, Executor

        self.backend = get_backend(spec)
        self.copies_uploads = spec != "cpu"  # GPU backends copy into device memory
        self.backend = self.backend.session()  # GPU backends: a stream of this runtime's own
        self.executor = Executor(self.backend)
        self._execution_error = ExecutionError
        self.store: dict[int, Any] = {}
        if pooled is None:
            env = os.environ.get(POOL_ENV, "")
            pooled = env == "1" or (env != "0" and memory_limit is not None)
        # engine.memory.GraphMemory, or None to keep NumPy's own allocations
        self.memory = _memory_hook(spec, memory_limit) if pooled else None
        self.executor.memory = self.memory
        self.accounting = None
        if self.memory is None and not self.backend.reports_memory:
            from burn_remote.engine.memory import Accounting

            self.accounting = Accounting(spec)

    def upload(self, tensor_id: int, array: np.ndarray) -> None:
        """Convert ``array`` to the backend's form (a device copy on GPU) and hold it as
        ``tensor_id``, replacing any tensor held under that id; counted by the memory pool."""
        self.drop((tensor_id,))
        arr = self.backend.from_numpy(array)
        if self.memory is not None:
            arr = self.memory.adopt(arr)
        elif self.accounting is not None:
            self.accounting.add(arr.nbytes)
        self.store[tensor_id] = arr

    def execute(self, capture: Any) -> None:
        """Run a captured graph now, in this thread: the plan is compiled once per digest and
        replayed after. Donated and in-place inputs give their memory to the graph. Raises OpFailed
        naming the failing op and the user's line that recorded it."""
        ex = self.executor
        plan = ex.plan(capture.digest) or ex.register(capture.digest, capture.graph)
        store = self.store
        inputs = [store[i] for i in capture.input_ids]
        donated = capture.donated
        if capture.inplace:  # state written under its own id: its memory goes to the graph
            donated = donated + capture.inplace
        for k in donated:  # the graph frees these at their last use
            self.drop((capture.input_ids[k],), into_graph=True)
        try:
            outs = ex.run(plan, inputs, capture.values, donated)
        except self._execution_error as exc:
            raise op_failure(capture.where(exc.node), exc.op, str(exc)) from exc
        self.drop([i for i in capture.output_ids if i in store])
        store.update(zip(capture.output_ids, outs))
        if self.accounting is not None:
            for a in outs:
                self.accounting.add(a.nbytes)

    def read(self, tensor_id: int) -> np.ndarray:
        """A NumPy array of the tensor (a copy when pooled, since the pool reuses a dropped block).
        Raises KeyError for an id this runtime does not hold."""
        arr = self.backend.to_numpy(self.store[tensor_id])
        # A pool block is reused once its tensor is dropped: hand out a copy, not a view.
        return np.array(arr, copy=True) if self.memory is not None else arr

    def drop(self, ids: Sequence[int], into_graph: bool = False) -> None:
        """Forget tensors; `into_graph`: a graph about to run takes over their memory."""
        for i in ids:
            arr = self.store.pop(i, None)
            if arr is None:
                continue
            if self.memory is not None:
                if not into_graph:
                    self.memory.forget(arr)
            elif self.accounting is not None:
                self.accounting.remove(arr.nbytes)

    def memory_stats(self) -> Any:
        """engine.memory.MemoryStats of this device: its pools, the allocator installed on the
        backend (CuPy), or the live tensor bytes where neither is in use."""
        if self.memory is not None:
            return self.memory.memory.memory_stats()
        if self.accounting is not None:
            return self.accounting.stats()
        return self.backend.memory_stats()

    def stats(self) -> dict[str, int]:
        """``graphs_registered`` (compiled plans), ``replays`` (graphs run from a cached plan) and
        ``tensors`` (held now): what `Device.stats()` shows for a local device."""
        return {
            "graphs_registered": self.executor.compiled,
            "replays": self.executor.replays,
            "tensors": len(self.store),
        }


def _memory_hook(spec: str, memory_limit: int | None) -> Any:
    """The device's pools (engine.memory); the CPU pool hands out host pages."""
    if spec != "cpu":
        return None
    from burn_remote.engine.memory import DeviceMemory, GraphMemory, HostPageAllocator

    return GraphMemory(DeviceMemory(spec, HostPageAllocator(), limit=memory_limit))


_PYTHON_DATA = (list, tuple, bool, int, float)


def _from_torch(data: Any) -> np.ndarray:
    """A torch tensor's values with its dtype (bfloat16 through ml_dtypes: NumPy has none)."""
    t = data.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        import sys

        import ml_dtypes

        torch = sys.modules["torch"]
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.resolve_conj().resolve_neg().numpy()


def _shape(shape: tuple) -> tuple[int, ...]:
    """`randn(2, 3)` and `randn((2, 3))` alike."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape


def _as_array(data: Any, dtype: Any) -> np.ndarray:
    """Arrays keep their dtype (NumPy, torch, anything with `__array__`); Python numbers and
    lists get torch's defaults: float32 for floats, int64 for ints."""
    if type(data) is np.ndarray and dtype is None and data.dtype.kind != "O":
        dtypes.from_numpy(data.dtype)  # refuses unsupported dtypes with a clear message
        return data
    if type(data).__module__.partition(".")[0] == "torch" and hasattr(data, "detach"):
        data = _from_torch(data)
    if dtype is not None:
        return np.asarray(data, dtype=dtypes.to_numpy(dtypes.normalize(dtype)))
    if isinstance(data, np.ndarray | np.generic) or not isinstance(data, _PYTHON_DATA):
        arr = np.asarray(data)
        if arr.dtype != object:
            dtypes.from_numpy(arr.dtype)  # refuses unsupported dtypes with a clear message
            return arr
    arr = np.asarray(data)
    if arr.dtype.kind == "f":
        return arr.astype(np.float32)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "b":
        return arr
    raise TypeError(f"cannot make a tensor from {type(data).__name__} of dtype {arr.dtype}")


class Device:
    """A place where tensors live and graphs run. `Device.cpu()` is the default.

    Devices with the same string are the same object, so tensors made through
    `Device.cpu()` in different modules work together.
    """

    _instances: dict[str, Device] = {}

    def __init__(self, spec: str, runtime: Any) -> None:
        self.spec = spec
        self._rec = Recorder(runtime)

    # --- construction -------------------------------------------------------------------
    @staticmethod
    def resolve(spec: str | Device) -> Device:
        """The device a name means, by the table of kinds (`DEVICE_KINDS`): "cpu", "cuda[:N]",
        "opencl[:N]", or a server ("PEER@HOST:PORT", or a peer id or name the address book
        knows); a Device is returned as it is. Every entry point resolves through here:
        the constructors' ``device=``, ``Tensor.to``, `Device.parse`, ``br.device``.

        Raises:
            TypeError: ``spec`` is neither a string nor a Device.
            ValueError: no kind matches, naming the spellings that would.
        """
        if isinstance(spec, Device):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"device: expected a Device or a string, got {type(spec).__name__}")
        text = spec.strip()
        kind = DEVICE_KINDS.get(text.partition(":")[0].lower())
        if kind is None and PEER_KIND in DEVICE_KINDS and _is_peer(text):
            kind = DEVICE_KINDS[PEER_KIND]
        if kind is None:
            spellings = ", ".join(k.spelling for k in DEVICE_KINDS.values())
            raise ValueError(f"unknown device {spec!r}: expected {spellings}")
        return kind.open(text)

    @staticmethod
    def parse(spec: str | Device) -> Device:
        """`Device.resolve` under its older name: every device spelling, peers included."""
        return Device.resolve(spec)

    @staticmethod
    def _local(spec: str) -> Device:
        """The one local device of ``spec`` (the engine's backend kinds), opened once."""
        from burn_remote.engine.backend_base import parse_device

        kind, index = parse_device(spec)
        key = "cpu" if kind == "cpu" else f"{kind}:{index}"
        dev = Device._instances.get(key)
        if dev is None:
            dev = Device._instances[key] = Device(key, LocalRuntime(key))
        return dev

    @classmethod
    def cpu(cls) -> Device:
        """The host's NumPy engine, in this process (the default device)."""
        dev = Device._instances.get("cpu")
        return dev if dev is not None else Device._local("cpu")

    @classmethod
    def cuda(cls, index: int = 0) -> Device:
        """CUDA GPU ``index`` through CuPy, in this process."""
        return Device.resolve(f"cuda:{index}")

    @classmethod
    def opencl(cls, index: int = 0) -> Device:
        """OpenCL device ``index`` through PyOpenCL (GPUs first; PoCL on a CPU)."""
        return Device.resolve(f"opencl:{index}")

    def __repr__(self) -> str:
        return f"Device({self.spec!r})"

    # A device is a place, not a value: copies of models and tensors stay on it.
    def __copy__(self) -> Device:
        return self

    def __deepcopy__(self, memo: dict) -> Device:
        return self

    def __reduce__(self) -> tuple:
        """Pickled by name: unpickling finds (or opens) the same local device."""
        return (Device.resolve, (self.spec,))

    # --- tensors --------------------------------------------------------------------------
    def tensor(
        self, data: Any, dtype: Any = None, requires_grad: bool = False, *, copy: bool = True
    ) -> Tensor:
        """Upload array-like data. Python floats default to float32, ints to int64.

        `copy=False` hands a NumPy array over (torch.from_numpy's contract: the caller must
        not change it afterwards), sparing a copy of it: a streamed checkpoint then never
        holds a tensor twice."""
        if type(data) is np.ndarray and dtype is None and copy:  # the common case: a batch
            name = dtypes.from_numpy(data.dtype)  # refuses unsupported dtypes (object too)
            rec = self._rec
            if data.flags.c_contiguous and getattr(rec.runtime, "copies_uploads", False):
                # (the runtime serialises it at once: the caller may change it afterwards)
                tid = rec.new_id()
                shape = data.shape
                rec.upload(tid, data, (shape, name))
                t = make_tensor(self, tid, shape, name)
                if requires_grad:
                    t.requires_grad_(True)
                return t
            arr = data
        else:
            if isinstance(data, Tensor):
                data = data.numpy()
            arr = _as_array(data, dtype)
            name = dtypes.from_numpy(arr.dtype)
        rec = self._rec
        if not arr.flags.c_contiguous or (
            copy
            and not getattr(rec.runtime, "copies_uploads", False)
            and (arr is data or not arr.flags.owndata)
        ):
            # a copy, as torch.tensor makes: changing the caller's array later must not
            # change this tensor (np.array keeps 0-d data 0-d). Runtimes that copy on upload
            # anyway (the wire, device memory) are spared a second copy of a large array.
            arr = np.array(arr, order="C", copy=True)
        tid = rec.new_id()
        rec.upload(tid, arr, (arr.shape, name))
        t = make_tensor(self, tid, arr.shape, name)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def scalar(self, value: float | int, dtype: Any = "float32") -> Tensor:
        """A 0-d tensor whose value is a graph binding: changing it never re-registers a graph."""
        from ._recorder import Node, user_location

        dtype = dtypes.normalize(dtype)
        rec = self._rec
        tid = rec.new_id()
        rec.add(
            Node("value", (), (("dtype", dtype),), (tid,), (((), dtype),), user_location(), value)
        )
        return make_tensor(self, tid, (), dtype)

    def full(
        self, shape: Sequence[int], value: float | int | bool, dtype: Any = "float32"
    ) -> Tensor:
        """A tensor of ``shape`` with every value ``value`` (the value is part of the graph)."""
        return _ops.call(
            "full", _device=self, shape=tuple(shape), value=value, dtype=dtypes.normalize(dtype)
        )

    def zeros(self, shape: Sequence[int], dtype: Any = "float32") -> Tensor:
        """A tensor of ``shape`` filled with 0."""
        return self.full(shape, 0, dtype)

    def ones(self, shape: Sequence[int], dtype: Any = "float32") -> Tensor:
        """A tensor of ``shape`` filled with 1."""
        return self.full(shape, 1, dtype)

    def _key(self, key: int | Tensor | None) -> Tensor:
        """An explicit key, or (None) the next one of the default generator that
        `burn_remote.manual_seed` resets, so unkeyed draws are reproducible too."""
        if key is None:
            from .nn._init import next_key

            return next_key(self)
        return key if isinstance(key, Tensor) else self.scalar(int(key), "int64")

    # --- torch-style creation -------------------------------------------------------------
    def arange(
        self, start: float, end: float | None = None, step: float = 1, dtype: Any = None
    ) -> Tensor:
        """torch.arange: int64 for integer arguments, float32 otherwise (or `dtype`)."""
        if end is None:
            start, end = 0, start
        ints = all(isinstance(v, int) for v in (start, end, step))
        dtype = dtypes.normalize(dtype) if dtype is not None else ("int64" if ints else "float32")
        return self.tensor(np.arange(start, end, step), dtype=dtype)

    def eye(self, n: int, m: int | None = None, dtype: Any = "float32") -> Tensor:
        """The n x m identity matrix (m defaults to n)."""
        return self.tensor(np.eye(n, m), dtype=dtype)

    def randn(self, *shape: Any, dtype: Any = "float32", key: int | Tensor | None = None) -> Tensor:
        """Standard normal draws; without `key`, from the seeded default generator."""
        return self.normal(_shape(shape), key, dtype=dtype)

    def rand(self, *shape: Any, dtype: Any = "float32", key: int | Tensor | None = None) -> Tensor:
        """Uniform draws in [0, 1) of ``shape``; without ``key``, from the seeded default generator."""
        return self.uniform(_shape(shape), key, dtype=dtype)

    def from_dlpack(self, x: Any) -> Tensor:
        """A tensor with the values of any DLPack producer (a copy: later changes to `x` do
        not show here)."""
        if type(x).__module__.partition(".")[0] == "torch":
            return self.tensor(x)
        return self.tensor(np.from_dlpack(x))

    def uniform(
        self,
        shape: Sequence[int],
        key: int | Tensor | None = None,
        low: float = 0.0,
        high: float = 1.0,
        dtype: Any = "float32",
    ) -> Tensor:
        """Reproducible uniform draws from an explicit key (same key, same numbers, any backend)."""
        return _ops.call(
            "uniform",
            self._key(key),
            shape=tuple(shape),
            low=low,
            high=high,
            dtype=dtypes.normalize(dtype),
        )

    def normal(
        self,
        shape: Sequence[int],
        key: int | Tensor | None = None,
        mean: float = 0.0,
        std: float = 1.0,
        dtype: Any = "float32",
    ) -> Tensor:
        """Normal draws (``mean``, ``std``) of ``shape``; without ``key``, from the seeded default
        generator."""
        return _ops.call(
            "normal",
            self._key(key),
            shape=tuple(shape),
            mean=mean,
            std=std,
            dtype=dtypes.normalize(dtype),
        )

    def randint(
        self,
        shape: Sequence[int],
        key: int | Tensor,
        low: int = 0,
        high: int = 2,
        dtype: Any = "int64",
    ) -> Tensor:
        """Integer draws in [low, high) of ``shape`` from an explicit ``key``."""
        return _ops.call(
            "randint",
            self._key(key),
            shape=tuple(shape),
            low=low,
            high=high,
            dtype=dtypes.normalize(dtype),
        )

    def _receive(self, t: Tensor) -> Tensor:
        """Copy a tensor from another device (through the host for local devices)."""
        out = self.tensor(t.numpy())
        if t.requires_grad:
            out.requires_grad_(True)
        return out

    # --- sync and statistics --------------------------------------------------------------
    def flush(self) -> None:
        """Submit what is recorded as one graph without waiting for it (a step boundary).

        On a local device this runs it; on a remote one it sends one message.
        """
        self._rec.flush()

    def sync(self) -> None:
        """Run everything recorded so far and wait; raises OpFailed for a failed op."""
        self._rec.flush()
        if self._rec.partners:  # the other ranks of our groups must reach their collectives
            self._rec.flush_partners()

    def stats(self) -> dict[str, int | str]:
        """Counters of this device's runtime (graphs registered, replays, tensors held, ...)."""
        return self._rec.runtime.stats()

    def memory_stats(self) -> Any:
        """Reserved and in-use bytes, their peaks and a row per pool (a MemoryStats)."""
        self.sync()
        return self._rec.runtime.memory_stats()

    def memory_quota(self) -> tuple[int, int] | None:
        """(bytes held, bytes allowed) under this device's memory quota, or None when it has
        none: what a caller asks before making something large (a KV cache), so that a thing
        that cannot fit is refused by name before any work rather than failing part way."""
        stats = self.memory_stats()
        return None if stats.limit is None else (int(stats.in_use), int(stats.limit))

    def memory_room(self) -> tuple[int, str] | None:
        """(bytes this device may still allocate, the limit that leaves that much), or None
        when it has no limit (`memory_quota`)."""
        quota = self.memory_quota()
        if quota is None:
            return None
        held, limit = quota
        return max(limit - held, 0), "the device's memory limit"


class DeviceKind(NamedTuple):
    """One row of the device table: how a kind is spelt and how it opens."""

    spelling: str
    """How a user writes it (listed in the error for a name no kind matches)."""
    open: Callable[[str], Device]
    """The device for a name of this kind (a local device is opened once per process)."""


PEER_KIND = "peer"
"""The key of servers in `DEVICE_KINDS`; its row is added by the package (`burn_remote`),
which sits above the remote device: this module never imports it."""

PEER_ID_MIN = 40
"""A bare peer id (base32 of an Ed25519 key) is longer than any local device name."""

DEVICE_KINDS: dict[str, DeviceKind] = {
    "cpu": DeviceKind("cpu", Device._local),
    "cuda": DeviceKind("cuda[:N]", Device._local),
    "opencl": DeviceKind("opencl[:N]", Device._local),
}
"""Device kind -> its row: the one table `Device.resolve` reads. Local kinds are keyed by
the name before ``:``; a name with ``@`` or as long as a peer id is a server (`PEER_KIND`)."""


def _is_peer(text: str) -> bool:
    return "@" in text or len(text) >= PEER_ID_MIN


__all__ = ["DEVICE_KINDS", "Device", "DeviceKind", "OpFailed"]
