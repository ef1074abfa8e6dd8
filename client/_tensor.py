"""Tensor: a handle on one recorded value. The math is written once, as calls into the registry."""

from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import numpy as np
from burn_remote.protocol import dtypes


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


class _MinMax(NamedTuple):
    """torch's `max(dim=...)` / `min(dim=...)` result."""

    values: Any
    indices: Any


def _unpickle(dev: Any, array: np.ndarray, requires_grad: bool) -> Tensor:
    return dev.tensor(array, requires_grad=requires_grad)


class Tensor:
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
        return self._dev

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> _Size:
        """The element count (NumPy's `.size`); called, torch's `size()` / `size(dim)`."""
        n = 1
        for d in self.shape:
            n *= d
        return _Size(n, self.shape)

    def numel(self) -> int:
        return int(self.size)

    def dim(self) -> int:
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

    def item(self) -> float | int | bool:
        if self.shape and math.prod(self.shape) != 1:  # (not .size: an object per call)
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self._dev._rec.read_item(self._id)

    def tolist(self) -> Any:
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
        if flag and not dtypes.is_float(self.dtype):
            raise TypeError(f"only floating-point tensors can require gradients, not {self.dtype}")
        if flag != self.requires_grad:
            _recorder.structure_changed()  # compiled steps capture again
        self.requires_grad = flag
        return self

    def backward(self, grad: Tensor | None = None) -> None:
        """Record the backward ops into the pending graph; leaf tensors get `.grad`."""
        _autograd.backward(self, grad)

    def detach(self) -> Tensor:
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
        return self._inplace("add", o if alpha == 1 else o * alpha)

    def sub_(self, o: Any, alpha: float = 1) -> Tensor:
        return self._inplace("sub", o if alpha == 1 else o * alpha)

    def mul_(self, o: Any) -> Tensor:
        return self._inplace("mul", o)

    def div_(self, o: Any) -> Tensor:
        return self._inplace("div", o)

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def fill_(self, value: float) -> Tensor:
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
            from ._creation import device

            dev = device(target)
            if dev is not self._dev:
                out = dev._receive(self)
        return out.cast(dtype) if dtype is not None else out

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def cast(self, dtype: Any) -> Tensor:
        dtype = dtypes.normalize(dtype)
        return self if dtype == self.dtype else _ops.call("cast", self, dtype=dtype)

    astype = cast

    def float(self) -> Tensor:
        return self.cast("float32")

    def double(self) -> Tensor:
        return self.cast("float64")

    def half(self) -> Tensor:
        return self.cast("float16")

    def long(self) -> Tensor:
        return self.cast("int64")

    def int(self) -> Tensor:
        return self.cast("int32")

    def type_as(self, other: Tensor) -> Tensor:
        return self.cast(other.dtype)

    def clone(self) -> Tensor:
        """A copy that gradients flow through (values behind an id never change in place)."""
        return _ops.call("reshape", self, shape=self.shape) if self.requires_grad else self.detach()

    def contiguous(self) -> Tensor:
        return self

    # --- operators ----------------------------------------------------------------------
    def _bin(self, name: str, other: Any, reverse: bool = False) -> Tensor:
        o = _ops.operand(other, self)
        return _ops.call(name, o, self) if reverse else _ops.call(name, self, o)

    def __add__(self, o: Any) -> Tensor:
        return self._bin("add", o)

    def __radd__(self, o: Any) -> Tensor:
        return self._bin("add", o, True)

    def __sub__(self, o: Any) -> Tensor:
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> Tensor:
        return self._bin("sub", o, True)

    def __mul__(self, o: Any) -> Tensor:
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> Tensor:
        return self._bin("mul", o, True)

    def __truediv__(self, o: Any) -> Tensor:
        if not dtypes.is_float(self.dtype) and not (
            isinstance(o, Tensor) and dtypes.is_float(o.dtype)
        ):
            return self.cast(dtypes.DEFAULT_FLOAT)._bin("div", o)
        return self._bin("div", o)

    def __rtruediv__(self, o: Any) -> Tensor:
        if not dtypes.is_float(self.dtype):  # true division: 1 / int tensor is a float
            return self.cast(dtypes.DEFAULT_FLOAT)._bin("div", o, True)
        return self._bin("div", o, True)

    def __floordiv__(self, o: Any) -> Tensor:
        return (
            _ops.call("floor", self._bin("div", o))
            if dtypes.is_float(self.dtype)
            else self._bin("div", o)
        )

    def __rfloordiv__(self, o: Any) -> Tensor:
        q = self._bin("div", o, True)
        return _ops.call("floor", q) if dtypes.is_float(q.dtype) else q

    def __pow__(self, o: Any) -> Tensor:
        return self._bin("pow", o)

    def __rpow__(self, o: Any) -> Tensor:
        return self._bin("pow", o, True)

    def __matmul__(self, o: Tensor) -> Tensor:
        return matmul(self, o)

    def __rmatmul__(self, o: Tensor) -> Tensor:
        return matmul(o, self)

    def __neg__(self) -> Tensor:
        return _ops.call("neg", self)

    def __abs__(self) -> Tensor:
        return _ops.call("abs", self)

    def __eq__(self, o: Any) -> Tensor:  # type: ignore[override]
        return self._bin("eq", o)

    def __ne__(self, o: Any) -> Tensor:  # type: ignore[override]
        return self._bin("ne", o)

    def __lt__(self, o: Any) -> Tensor:
        return self._bin("lt", o)

    def __le__(self, o: Any) -> Tensor:
        return self._bin("le", o)

    def __gt__(self, o: Any) -> Tensor:
        return self._bin("gt", o)

    def __ge__(self, o: Any) -> Tensor:
        return self._bin("ge", o)

    def __invert__(self) -> Tensor:
        return _ops.call("logical_not", self)

    def __and__(self, o: Any) -> Tensor:
        return self._bin("logical_and", o)

    def __or__(self, o: Any) -> Tensor:
        return self._bin("logical_or", o)

    def __getitem__(self, key: Any) -> Tensor:
        return _indexing.getitem(self, key)

    # torch's method spellings of the operators
    def add(self, o: Any) -> Tensor:
        return self + o

    def sub(self, o: Any) -> Tensor:
        return self - o

    def mul(self, o: Any) -> Tensor:
        return self * o

    def div(self, o: Any) -> Tensor:
        return self / o

    def pow(self, o: Any) -> Tensor:
        return self**o

    def eq(self, o: Any) -> Tensor:
        return self == o

    def ne(self, o: Any) -> Tensor:
        return self != o

    def lt(self, o: Any) -> Tensor:
        return self < o

    def le(self, o: Any) -> Tensor:
        return self <= o

    def gt(self, o: Any) -> Tensor:
        return self > o

    def ge(self, o: Any) -> Tensor:
        return self >= o

    def mm(self, o: Tensor) -> Tensor:
        return matmul(self, o)

    def view_as(self, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

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

    # --- math methods (thin: the registry holds the definitions) ------------------------
    def exp(self) -> Tensor:
        return _ops.call("exp", self)

    def log(self) -> Tensor:
        return _ops.call("log", self)

    def sqrt(self) -> Tensor:
        return _ops.call("sqrt", self)

    def rsqrt(self) -> Tensor:
        return _ops.call("rsqrt", self)

    def sin(self) -> Tensor:
        return _ops.call("sin", self)

    def cos(self) -> Tensor:
        return _ops.call("cos", self)

    def tanh(self) -> Tensor:
        return _ops.call("tanh", self)

    def sigmoid(self) -> Tensor:
        return _ops.call("sigmoid", self)

    def relu(self) -> Tensor:
        return _ops.call("relu", self)

    def abs(self) -> Tensor:
        return _ops.call("abs", self)

    def clamp(self, min: float | None = None, max: float | None = None) -> Tensor:
        return _ops.call("clamp", self, min=min, max=max)

    # Reductions take NumPy's `axis`/`keepdims` or torch's `dim`/`keepdim`. Where torch's
    # answer differs (max/min with a dim give values and indices, var/std are unbiased), the
    # torch spelling gets torch's answer.
    def sum(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Tensor:
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("sum", self, axes=axis, keepdims=keepdims)

    def mean(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Tensor:
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("mean", self, axes=axis, keepdims=keepdims)

    def var(
        self,
        axis: Any = None,
        keepdims: bool = False,
        correction: int | None = None,
        *,
        dim: Any = None,
        keepdim: Any = None,
        unbiased: bool | None = None,
    ) -> Tensor:
        """NumPy's default (correction 0) with `axis`; torch's (1) with `dim` or `unbiased`.
        Bare `x.var()` means 0 to NumPy and 1 to torch, so it asks which."""
        torch_style = dim is not None or keepdim is not None or unbiased is not None
        if correction is None and axis is None and not torch_style:
            raise TypeError(
                "var()/std() over everything: NumPy divides by n, torch by n - 1; say which "
                "with correction=0 or correction=1 (or give axis= / dim=)"
            )
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        if correction is None:
            correction = int(unbiased if unbiased is not None else torch_style)
        return _ops.call("var", self, axes=axis, keepdims=keepdims, correction=correction)

    def std(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.var(*args, **kwargs).sqrt()

    def max(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Any:
        if dim is not None:  # torch: (values, indices)
            return _min_max("max", self, dim, bool(keepdim))
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("max", self, axes=axis, keepdims=keepdims)

    def min(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Any:
        if dim is not None:
            return _min_max("min", self, dim, bool(keepdim))
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("min", self, axes=axis, keepdims=keepdims)

    def argmax(
        self,
        axis: int | None = None,
        keepdims: bool = False,
        *,
        dim: Any = None,
        keepdim: Any = None,
    ) -> Tensor:
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("argmax", self, axis=axis, keepdims=keepdims)

    def argmin(
        self,
        axis: int | None = None,
        keepdims: bool = False,
        *,
        dim: Any = None,
        keepdim: Any = None,
    ) -> Tensor:
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("argmin", self, axis=axis, keepdims=keepdims)

    def logsumexp(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Tensor:
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return _ops.call("logsumexp", self, axes=axis, keepdims=keepdims)

    def softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
        return _ops.call("softmax", self, axis=axis if dim is None else dim)

    def log_softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
        return _ops.call("log_softmax", self, axis=axis if dim is None else dim)

    def reshape(self, *shape: Any) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return self if shape == self.shape else _ops.call("reshape", self, shape=tuple(shape))

    view = reshape

    def flatten(
        self, start: int = 0, end: int = -1, *, start_dim: Any = None, end_dim: Any = None
    ) -> Tensor:
        start = start if start_dim is None else start_dim
        end = end if end_dim is None else end_dim
        if self.ndim == 0:
            return self.reshape(1)
        start %= self.ndim
        end %= self.ndim
        return self.reshape(*self.shape[:start], -1, *self.shape[end + 1 :])

    def permute(self, *dims: Any) -> Tensor:
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], tuple | list) else dims
        return _ops.call("permute", self, dims=tuple(dims))

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
        return _ops.call("transpose", self, dim0=dim0, dim1=dim1)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *shape: Any) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return _ops.call("expand", self, shape=tuple(shape))

    def squeeze(self, axis: Any = None, *, dim: Any = None) -> Tensor:
        """NumPy's: squeezing an axis that is not 1 raises; torch's spelling (`dim=`) leaves
        the tensor as it is, as torch does."""
        if dim is not None:
            dims = (dim,) if isinstance(dim, int) else tuple(dim)
            keep = tuple(d for d in dims if self.shape[d] == 1)
            return self if not keep else _ops.call("squeeze", self, axes=keep)
        return _ops.call("squeeze", self, axes=axis)

    def unsqueeze(self, axis: int | None = None, *, dim: int | None = None) -> Tensor:
        return _ops.call("unsqueeze", self, axis=axis if dim is None else dim)

    def flip(self, axis: Any = None, *, dims: Any = None) -> Tensor:
        axis = axis if dims is None else dims
        return _ops.call("flip", self, axes=(axis,) if isinstance(axis, int) else tuple(axis))


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


def _axes(axis: Any, keepdims: bool, dim: Any, keepdim: Any) -> tuple[Any, bool]:
    if dim is not None:
        if axis is not None:
            raise TypeError("give axis= or dim=, not both")
        axis = tuple(dim) if isinstance(dim, list) else dim
    return axis, keepdims if keepdim is None else bool(keepdim)


def _min_max(name: str, x: Tensor, dim: int, keepdim: bool) -> Any:
    values = _ops.call(name, x, axes=dim, keepdims=keepdim)
    indices = _ops.call(f"arg{name}", x, axis=dim, keepdims=keepdim)
    return _MinMax(values, indices)


def _kind(name: str) -> int:
    """0 bool, 1 integer, 2 floating: an in-place result may not move up a kind."""
    return 2 if dtypes.is_float(name) else 1 if dtypes.is_int(name) else 0


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """NumPy matmul semantics, 1-d operands included (promoted, then squeezed back)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul: both operands must be tensors")
    squeeze = []
    if a.ndim == 1:
        a = a.reshape(1, a.shape[0])
        squeeze.append(-2)
    if b.ndim == 1:
        b = b.reshape(b.shape[0], 1)
        squeeze.append(-1)
    out = _ops.call("matmul", a, b)
    if squeeze:
        out = (
            out.reshape(*out.shape[: out.ndim - len(squeeze)])
            if len(squeeze) == 2
            else out.squeeze(squeeze[0])
        )
    return out


from . import _autograd, _indexing, _ops, _recorder  # noqa: E402  (circular: these import Tensor)
