"""Tensor: a handle on one recorded value, and the recording path every op goes through.

`call` binds an op's attributes against the registry declaration, runs the shape rule (so
errors raise at the user's line), records a node on the device, and links autodiff when an
input needs gradients; composites expand into primitives here, so every engine sees
primitives only. The operator surface is inherited from `_math.TensorMath`, written once over
`call`; `_ops` re-exports the recording names for the modules that record ops directly.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from burn_remote.protocol import dtypes
from burn_remote.protocol import ops as _declared  # noqa: F401  (the declarations register)
from burn_remote.protocol.graph import canonical_attrs
from burn_remote.protocol.registry import OPS, ShapeError

from . import _autograd, _indexing, _recorder
from ._math import TensorMath, matmul
from ._recorder import Node, fmt_location, not_a_tensor, user_location


class RecordError(ValueError):
    """A shape or dtype rule refused an op at record time; names the user's line."""


def _device_of(name: str, inputs: tuple[Tensor, ...]) -> Any:
    dev = inputs[0]._dev
    for t in inputs[1:]:
        if t._dev is not dev:
            where = fmt_location(user_location())
            raise RecordError(
                f"{name}: operands are on different devices ({dev} and {t._dev}); move one "
                f"with .to() (at {where})"
            )
    return dev


def call(name: str, *inputs: Tensor, _device: Any = None, _where: Any = None, **attrs: Any) -> Any:
    """Record op `name` on its operands' device and return its output tensor(s).

    This is the hot path of recording: it avoids generator expressions and does the common
    one-output case without loops.
    """
    op = OPS.get(name)
    if op is None:
        raise RecordError(f"unknown op {name!r}")
    for t in inputs:
        if type(t) is not Tensor:
            raise not_a_tensor(name, t)
    try:
        bound = op.bind_attrs(attrs) if (attrs or op.attrs) else attrs
        if op.decompose is not None:
            builder = Builder(_device or _device_of(name, inputs), _where)
            return op.decompose(builder, *inputs, **bound)
        if op.arity is not None and len(inputs) != op.arity:
            raise ShapeError(f"{name}: expected {op.arity} operands, got {len(inputs)}")
        specs = op.infer(inputs, bound)  # type: ignore[misc]  # (a primitive always has one)
    except (ShapeError, TypeError) as exc:
        where = _where or user_location()
        raise RecordError(f"{exc} (at {fmt_location(where)})") from None
    if not inputs and _device is None:
        raise RecordError(
            f"{name}: an op with no tensor operands needs a device; use the device's methods "
            "(dev.full, dev.zeros, dev.uniform, ...)"
        )
    dev = _device if not inputs else _device_of(name, inputs)
    rec = dev._rec
    where = _where or user_location()
    key_attrs = canonical_attrs(bound) if bound else ()
    in_ids = tuple([t._id for t in inputs])
    if len(specs) == 1:
        shape, dtype = specs[0]
        if type(shape) is not tuple:
            shape = tuple(shape)
        tid = rec.new_id()
        rec.add(Node(name, in_ids, key_attrs, (tid,), ((shape, dtype),), where))
        outs = [make_tensor(dev, tid, shape, dtype)]
    else:
        specs = tuple([(tuple(s), d) for s, d in specs])
        ids = tuple([rec.new_id() for _ in specs])
        rec.add(Node(name, in_ids, key_attrs, ids, specs, where))
        outs = [make_tensor(dev, i, s, d) for i, (s, d) in zip(ids, specs)]
    if op.grad is not None and _autograd.enabled():
        for t in inputs:
            if t.requires_grad:
                _autograd.link(op, inputs, bound, outs, where)
                break
    return outs[0] if len(outs) == 1 else tuple(outs)


def const(dev: Any, value: float | int | bool, dtype: str, where: Any = None) -> Tensor:
    """A 0-d constant: its value is part of the graph's structure."""
    return call("full", _device=dev, _where=where, shape=(), value=value, dtype=dtype)


class Builder:
    """The recorder face that gradient rules and decompositions write against."""

    __slots__ = ("dev", "where")

    def __init__(self, dev: Any, where: Any = None) -> None:
        self.dev = dev
        self.where = where

    def op(self, name: str, *inputs: Tensor, **attrs: Any) -> Any:
        """Record op ``name`` on the builder's device, attributed to the user's line being
        differentiated or decomposed (``where``), so an error in a gradient names that line. Returns
        the output Tensor (a tuple for ops with several)."""
        return call(name, *inputs, _device=self.dev, _where=self.where, **attrs)

    def const(self, value: float | int | bool, dtype: str) -> Tensor:
        """A scalar constant of ``dtype`` on the builder's device (recorded, not uploaded: it
        becomes part of the graph's key)."""
        return const(self.dev, value, dtype, self.where)


def operand(x: Any, like: Tensor) -> Tensor:
    """Turn a Python scalar into a constant of the weakly-typed dtype (NumPy 2 rules)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, bool | int | float):
        return const(like._dev, x, dtypes.scalar_dtype(x, like.dtype))
    if type(x).__module__ == "numpy":  # NumPy scalars are weak like Python's; arrays upload
        return operand(x.item(), like) if x.ndim == 0 else like._dev.tensor(x)
    raise TypeError(f"unsupported operand type {type(x).__name__}")


def make_tensor(dev: Any, tensor_id: int, shape: tuple[int, ...], dtype: str) -> Tensor:
    t = Tensor.__new__(Tensor)
    t._dev = dev
    t._id = tensor_id
    t.shape = shape
    t.dtype = dtype
    t.requires_grad = False
    t._node = None
    t._out = 0
    t._version = 0
    t.grad = None
    dev._rec.retain(tensor_id)
    return t


def _unpickle(dev: Any, array: np.ndarray, requires_grad: bool) -> Tensor:
    return dev.tensor(array, requires_grad=requires_grad)


class Tensor(TensorMath):
    """A lazy tensor on a device. Reading it (`item`, `numpy`) is the only thing that waits.

    Tensors are created by a device (`dev.tensor(...)`) or by ops on other tensors; they never
    hold data themselves, only an id that the device's runtime maps to an array.
    """

    __slots__ = (
        "_dev",
        "_id",
        "shape",
        "dtype",
        "requires_grad",
        "_node",
        "_out",
        "_version",
        "grad",
        "__weakref__",
    )
    __array_priority__ = 1000  # NumPy defers to our operators: ndarray * Tensor -> Tensor
    _call = staticmethod(call)  # the one primitive TensorMath's op methods record through

    _id: int
    """The id the device's runtime maps to this tensor's array."""
    _node: Any
    """The autograd tape entry that made this tensor (None for a leaf)."""
    _out: int
    """Which output of `_node` this tensor is."""
    _version: int
    """Bumped by every in-place update (a saved input that changed refuses backward)."""
    grad: Tensor | None
    """The accumulated gradient of a leaf after `backward()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("create tensors with a device: Device.cpu().tensor(data)")

    def __del__(self) -> None:
        try:
            self._dev._rec.release(self._id)
        except (AttributeError, TypeError):  # interpreter shutdown
            pass

    # --- identity -----------------------------------------------------------------------
    @property
    def device(self) -> Any:
        """The device the tensor lives on (a `Device` or `RemoteDevice`)."""
        return self._dev

    @property
    def size(self) -> _Size:
        """The element count (NumPy's `.size`); called, torch's `size()` / `size(dim)`."""
        n = 1
        for d in self.shape:
            n *= d
        return _Size(n, self.shape)

    def numel(self) -> int:
        """The number of elements (torch's ``numel()``)."""
        return int(self.size)

    def dim(self) -> int:
        """The number of dimensions (torch's ``dim()``)."""
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        """The values, as torch prints them (reading waits for pending work, as it must)."""
        grad = ", requires_grad=True" if self.requires_grad else ""
        try:
            body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        except Exception as exc:  # a failed graph still prints, naming why
            if self._dev._rec.log is not None:  # but inside a compiled step a read fails loudly
                raise
            body = f"<unreadable: {type(exc).__name__}>"
        shape = f", shape={self.shape}" if self.size > _REPR_ALL_BELOW else ""
        return f"tensor({body}{shape}, dtype={self.dtype}, device={self._dev}{grad})"

    def __format__(self, spec: str) -> str:
        """`f"{loss:.4f}"` formats the value of a 0-d tensor, as torch does."""
        if self.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError(f"format spec {spec!r} needs a 0-d tensor, not shape {self.shape}")
        return repr(self)

    __hash__ = object.__hash__

    # --- copying and pickling -----------------------------------------------------------
    def __deepcopy__(self, memo: dict) -> Tensor:
        """A copy on the same device (a device is never copied). Values behind an id never
        change, so the copy shares the id; an update to either rebinds only that one."""
        import copy

        out = make_tensor(self._dev, self._id, self.shape, self.dtype)
        memo[id(self)] = out
        out.requires_grad = self.requires_grad
        if self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        return out

    def __reduce__(self) -> tuple:
        """Pickles the values and the device's name only (a remote device refuses)."""
        self._dev.__reduce__()  # raises for devices that cannot be named in a pickle
        return (_unpickle, (self._dev, self.numpy(), self.requires_grad))

    # --- reading (sync points) ----------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Run what is pending and return a NumPy copy of the value."""
        value = self._dev._rec.read(self._id)
        if getattr(self._dev._rec.runtime, "fresh_reads", False):
            return value  # already an array of its own (a remote read's buffer)
        return np.array(value, copy=True)

    def _numpy_later(self) -> Callable[[], np.ndarray] | None:
        """`numpy()` asked for now and taken with the returned call, on a device that
        queues reads in order with its work (`Recorder.read_later`; None elsewhere): for a
        loop that queues more work before it waits for this value. The reply is an array
        of the caller's own, and dropping this tensor meanwhile is safe: its Drop goes
        after the Read."""
        return self._dev._rec.read_later(self._id)

    def item(self) -> float | int | bool:
        """The value of a one-element tensor as a Python number (waits for pending work)."""
        if self.shape and math.prod(self.shape) != 1:  # (not .size: an object per call)
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self._dev._rec.read_item(self._id)

    def tolist(self) -> Any:
        """The values as nested Python lists (waits for pending work)."""
        return self.numpy().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a.astype(dtype) if dtype is not None else a

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    # --- autodiff -----------------------------------------------------------------------
    def requires_grad_(self, flag: bool = True) -> Tensor:
        """Start (or stop) tracking gradients for this tensor, in place; floats only."""
        if flag and not dtypes.is_float(self.dtype):
            raise TypeError(f"only floating-point tensors can require gradients, not {self.dtype}")
        if flag != self.requires_grad:
            _recorder.structure_changed()  # compiled steps capture again
        self.requires_grad = flag
        return self

    def backward(self, grad: Tensor | None = None) -> None:
        """Record the backward ops into the pending graph; leaf tensors get `.grad`."""
        _autograd.backward(self, grad, Builder)

    def detach(self) -> Tensor:
        """The same values, cut from autograd (no copy: it shares the id)."""
        return make_tensor(self._dev, self._id, self.shape, self.dtype)

    def _assign(self, other: Tensor) -> None:
        """Become `other` (its id, even its device); how optimizers and `Module.to` update a
        parameter in place, so every holder of this object sees the new value. Bumps the
        version, so a recorded backward that saved this tensor refuses to run (as torch)."""
        if other.shape != self.shape:
            raise ValueError(f"cannot assign shape {other.shape} to a tensor of shape {self.shape}")
        other._dev._rec.retain(other._id)
        self._dev._rec.release(self._id)
        self._dev, self._id, self.dtype, self._node, self._out = (
            other._dev,
            other._id,
            other.dtype,
            None,
            0,
        )
        self._version += 1

    def _inplace(self, name: str, other: Any) -> Tensor:
        """`x op= y`: the result rebinds this same object (so a parameter updated as
        `p -= lr * p.grad` under no_grad really changes).

        While gradients are recorded, a leaf that requires grad refuses (as torch). Any other
        tensor takes the op's place on the tape (ResNet's `out += identity`): the value it
        had moves to a stand-in object that the earlier ops' tape entries point to, so their
        gradients still see the old value; ops that saved this tensor as an input see its
        version change and refuse at backward (torch's version counter)."""
        tracked = _autograd.enabled() and (
            self.requires_grad or (isinstance(other, Tensor) and other.requires_grad)
        )
        if tracked and self.requires_grad and self._node is None:
            raise RuntimeError(
                f"in-place {name} on a leaf tensor that requires grad while gradients are "
                "recorded; update parameters under `with no_grad():`"
            )
        old = self._stand_in() if tracked else self
        if other is self:  # x += x: both operands are the value before the update
            other = old
        out = other if name == "set" else old._bin(name, other)
        if out.shape != self.shape:
            raise RuntimeError(
                f"in-place {name}: the result has shape {out.shape}, which does not fit this "
                f"tensor's shape {self.shape}"
            )
        if out.dtype != self.dtype:
            if _kind(out.dtype) > _kind(self.dtype):  # float into int, as torch refuses
                raise RuntimeError(
                    f"in-place {name}: result type {out.dtype} can't be cast to this tensor's "
                    f"dtype {self.dtype}"
                )
            out = out.cast(self.dtype)
        self._assign(out)
        if tracked:
            self.requires_grad = out.requires_grad
            self._node, self._out = out._node, out._out
            if out._node is not None:
                out._node.outputs[out._out] = weakref.ref(self)
        return self

    def _stand_in(self) -> Tensor:
        """A new object holding this tensor's value and tape position (for in-place ops)."""
        old = make_tensor(self._dev, self._id, self.shape, self.dtype)
        old.requires_grad, old._node, old._out = self.requires_grad, self._node, self._out
        old._version = self._version
        if self._node is not None:
            self._node.outputs[self._out] = weakref.ref(old)
        return old

    def add_(self, o: Any, alpha: float = 1) -> Tensor:
        """In place: ``self += alpha * o``."""
        return self._inplace("add", o if alpha == 1 else o * alpha)

    def sub_(self, o: Any, alpha: float = 1) -> Tensor:
        """In place: ``self -= alpha * o``."""
        return self._inplace("sub", o if alpha == 1 else o * alpha)

    def mul_(self, o: Any) -> Tensor:
        """In place: ``self *= o``."""
        return self._inplace("mul", o)

    def div_(self, o: Any) -> Tensor:
        """In place: ``self /= o``."""
        return self._inplace("div", o)

    def zero_(self) -> Tensor:
        """In place: every value 0."""
        return self.fill_(0)

    def fill_(self, value: float) -> Tensor:
        """In place: every value ``value``."""
        return self._inplace("set", self._dev.full(self.shape, value, self.dtype))

    def copy_(self, src: Any) -> Tensor:
        """Take `src`'s values (a Tensor, NumPy or torch array), keeping this dtype and device."""
        if not isinstance(src, Tensor) or src._dev is not self._dev:
            src = self._dev.tensor(src.numpy() if isinstance(src, Tensor) else src)
        src = src.cast(self.dtype)
        return self._inplace("set", src if src.shape == self.shape else src.expand(self.shape))

    def __iadd__(self, o: Any) -> Tensor:
        return self._inplace("add", o)

    def __isub__(self, o: Any) -> Tensor:
        return self._inplace("sub", o)

    def __imul__(self, o: Any) -> Tensor:
        return self._inplace("mul", o)

    def __itruediv__(self, o: Any) -> Tensor:
        return self._inplace("div", o)

    # --- devices and dtypes -------------------------------------------------------------
    def to(self, target: Any = None, dtype: Any = None) -> Tensor:
        """Move to a device (a Device or a string: "cpu", "cuda:0"), cast to a dtype, or
        both (`t.to(dev, "float16")`), as torch's `.to`."""
        out = self
        if isinstance(target, str) and target in dtypes.DTYPES or _is_dtype(target):
            target, dtype = None, target
        if target is not None:
            dev = self._dev.resolve(target)  # Device.resolve: every device spelling
            if dev is not self._dev:
                out = dev._receive(self)
        return out.cast(dtype) if dtype is not None else out

    def cpu(self) -> Tensor:
        """This tensor on `Device.cpu()` (itself when already there)."""
        return self.to("cpu")

    def clone(self) -> Tensor:
        """A copy that gradients flow through (values behind an id never change in place)."""
        return call("reshape", self, shape=self.shape) if self.requires_grad else self.detach()

    def contiguous(self) -> Tensor:
        """Itself: tensors have no strides to make contiguous (torch code calls it)."""
        return self

    # --- operators ----------------------------------------------------------------------
    def _bin(self, name: str, other: Any, reverse: bool = False) -> Tensor:
        o = operand(other, self)
        return call(name, o, self) if reverse else call(name, self, o)

    def __getitem__(self, key: Any) -> Tensor:
        return _indexing.getitem(self, key)

    # --- DLPack (CPU) -----------------------------------------------------------------------
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """Hand the values to another library without a copy on its side (CPU tensors)."""
        self._dlpack_check()
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        self._dlpack_check()
        return (1, 0)  # kDLCPU

    def _dlpack_check(self) -> None:
        if getattr(self._dev, "spec", None) != "cpu":
            raise BufferError(
                f"DLPack export is for CPU tensors; this one is on {self._dev}: use t.to('cpu')"
            )
        if self.dtype == "bfloat16":
            raise BufferError("DLPack export of bfloat16 is not supported (NumPy has no bf16)")


_REPR_ALL_BELOW = 1000
"""Tensors with more elements print a summary (NumPy's threshold) and their shape."""


class _Size(int):
    """An element count that is also torch's `size()` method: `t.size`, `t.size()`,
    `t.size(0)` all read as their owners expect."""

    shape: tuple[int, ...]

    def __new__(cls, n: int, shape: tuple[int, ...]) -> _Size:
        out = super().__new__(cls, n)
        out.shape = shape
        return out

    def __call__(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]


def _is_dtype(x: Any) -> bool:
    """A dtype given as NumPy/Python type or torch dtype (`t.to(torch.float16)`)."""
    if x is None or isinstance(x, str) or hasattr(x, "_rec"):
        return False
    name = str(x).removeprefix("torch.")
    if name in dtypes.DTYPES:
        return True
    try:
        dtypes.normalize(x)
        return True
    except TypeError:
        return False


def _kind(name: str) -> int:
    """0 bool, 1 integer, 2 floating: an in-place result may not move up a kind."""
    return 2 if dtypes.is_float(name) else 1 if dtypes.is_int(name) else 0


__all__ = [
    "Builder",
    "RecordError",
    "Tensor",
    "call",
    "const",
    "make_tensor",
    "matmul",
    "operand",
]
