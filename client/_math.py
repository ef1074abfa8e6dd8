"""The tensor's operator surface, written once over one primitive (`_call`), below the tensor.

In the way of tinygrad's op mixins: every method here only records ops through
``self._call(name, *operands, **attrs)`` (the recording path, `_tensor.call`), combines
operands through ``self._bin`` and reads ``shape``/``dtype``/``ndim``. So this module imports
nothing of the client, and `Tensor` (in `_tensor`) inherits the whole surface while this
floor stays below it: no import cycle, one place per op method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Self

from burn_remote.protocol import dtypes


class TensorMath:
    """Every op method of a tensor, written against `_call` and `_bin` (see the module
    docstring). `Tensor` supplies those and the state (`shape`, `dtype`, `requires_grad`)."""

    __slots__ = ()

    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    _dev: Any
    """The device the tensor lives on (its recorder, its runtime)."""
    _call: Callable[..., Any]
    """`_tensor.call`: record op ``name`` on these operands (a staticmethod on `Tensor`)."""

    @property
    def ndim(self) -> int:
        """The number of dimensions (``len(shape)``)."""
        return len(self.shape)

    def _bin(self, name: str, other: Any, reverse: bool = False) -> Self:
        """A binary op with ``other`` made an operand (a constant for a Python scalar)."""
        raise NotImplementedError

    def detach(self) -> Self:
        """The same value cut from the autograd graph (no gradient flows back through it); the
        tensor class defines it, as the math here only records ops."""
        raise NotImplementedError

    def __add__(self, o: Any) -> Self:
        return self._bin("add", o)

    def __radd__(self, o: Any) -> Self:
        return self._bin("add", o, True)

    def __sub__(self, o: Any) -> Self:
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> Self:
        return self._bin("sub", o, True)

    def __mul__(self, o: Any) -> Self:
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> Self:
        return self._bin("mul", o, True)

    def __truediv__(self, o: Any) -> Self:
        if not dtypes.is_float(self.dtype) and not (
            isinstance(o, TensorMath) and dtypes.is_float(o.dtype)
        ):
            return self.cast(dtypes.DEFAULT_FLOAT)._bin("div", o)
        return self._bin("div", o)

    def __rtruediv__(self, o: Any) -> Self:
        if not dtypes.is_float(self.dtype):  # true division: 1 / int tensor is a float
            return self.cast(dtypes.DEFAULT_FLOAT)._bin("div", o, True)
        return self._bin("div", o, True)

    def __floordiv__(self, o: Any) -> Self:
        return (
            self._call("floor", self._bin("div", o))
            if dtypes.is_float(self.dtype)
            else self._bin("div", o)
        )

    def __rfloordiv__(self, o: Any) -> Self:
        q = self._bin("div", o, True)
        return self._call("floor", q) if dtypes.is_float(q.dtype) else q

    def __pow__(self, o: Any) -> Self:
        return self._bin("pow", o)

    def __rpow__(self, o: Any) -> Self:
        return self._bin("pow", o, True)

    def __matmul__(self, o: Self) -> Self:
        return matmul(self, o)

    def __rmatmul__(self, o: Self) -> Self:
        return matmul(o, self)

    def __neg__(self) -> Self:
        return self._call("neg", self)

    def __abs__(self) -> Self:
        return self._call("abs", self)

    def __eq__(self, o: Any) -> Self:  # type: ignore[override]
        return self._bin("eq", o)

    def __ne__(self, o: Any) -> Self:  # type: ignore[override]
        return self._bin("ne", o)

    def __lt__(self, o: Any) -> Self:
        return self._bin("lt", o)

    def __le__(self, o: Any) -> Self:
        return self._bin("le", o)

    def __gt__(self, o: Any) -> Self:
        return self._bin("gt", o)

    def __ge__(self, o: Any) -> Self:
        return self._bin("ge", o)

    def __invert__(self) -> Self:
        return self._call("logical_not", self)

    def __and__(self, o: Any) -> Self:
        return self._bin("logical_and", o)

    def __or__(self, o: Any) -> Self:
        return self._bin("logical_or", o)

    # torch's method spellings of the operators
    def add(self, o: Any) -> Self:
        """``self + o`` (torch's method spelling)."""
        return self + o

    def sub(self, o: Any) -> Self:
        """``self - o`` (torch's method spelling)."""
        return self - o

    def mul(self, o: Any) -> Self:
        """``self * o`` (torch's method spelling)."""
        return self * o

    def div(self, o: Any) -> Self:
        """``self / o``: true division (torch's method spelling)."""
        return self / o

    def pow(self, o: Any) -> Self:
        """``self ** o`` (torch's method spelling)."""
        return self**o

    def eq(self, o: Any) -> Self:
        """Elementwise ``self == o``, a bool tensor."""
        return self == o

    def ne(self, o: Any) -> Self:
        """Elementwise ``self != o``, a bool tensor."""
        return self != o

    def lt(self, o: Any) -> Self:
        """Elementwise ``self < o``, a bool tensor."""
        return self < o

    def le(self, o: Any) -> Self:
        """Elementwise ``self <= o``, a bool tensor."""
        return self <= o

    def gt(self, o: Any) -> Self:
        """Elementwise ``self > o``, a bool tensor."""
        return self > o

    def ge(self, o: Any) -> Self:
        """Elementwise ``self >= o``, a bool tensor."""
        return self >= o

    def mm(self, o: Self) -> Self:
        """Matrix product ``self @ o`` (torch's ``mm``; NumPy matmul rules)."""
        return matmul(self, o)

    def view_as(self, other: Self) -> Self:
        """Reshaped to ``other``'s shape."""
        return self.reshape(other.shape)

    def expand_as(self, other: Self) -> Self:
        """Broadcast to ``other``'s shape (no copy is recorded)."""
        return self.expand(other.shape)

    # --- math methods (thin: the registry holds the definitions) ------------------------
    def exp(self) -> Self:
        """Elementwise e ** x."""
        return self._call("exp", self)

    def log(self) -> Self:
        """Elementwise natural logarithm."""
        return self._call("log", self)

    def sqrt(self) -> Self:
        """Elementwise square root."""
        return self._call("sqrt", self)

    def rsqrt(self) -> Self:
        """Elementwise 1 / sqrt(x), as one op."""
        return self._call("rsqrt", self)

    def sin(self) -> Self:
        """Elementwise sine (radians)."""
        return self._call("sin", self)

    def cos(self) -> Self:
        """Elementwise cosine (radians)."""
        return self._call("cos", self)

    def tanh(self) -> Self:
        """Elementwise hyperbolic tangent."""
        return self._call("tanh", self)

    def sigmoid(self) -> Self:
        """Elementwise logistic function 1 / (1 + e ** -x)."""
        return self._call("sigmoid", self)

    def relu(self) -> Self:
        """Elementwise max(x, 0)."""
        return self._call("relu", self)

    def abs(self) -> Self:
        """Elementwise absolute value."""
        return self._call("abs", self)

    def clamp(self, min: float | None = None, max: float | None = None) -> Self:
        """Values limited to [min, max] (either bound may be None)."""
        return self._call("clamp", self, min=min, max=max)

    # Reductions take NumPy's `axis`/`keepdims` or torch's `dim`/`keepdim`. Where torch's
    # answer differs (max/min with a dim give values and indices, var/std are unbiased), the
    # torch spelling gets torch's answer.
    def sum(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Self:
        """Sum over ``axis`` (NumPy) or ``dim`` (torch); everything by default."""
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("sum", self, axes=axis, keepdims=keepdims)

    def mean(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Self:
        """Mean over ``axis`` (NumPy) or ``dim`` (torch); everything by default."""
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("mean", self, axes=axis, keepdims=keepdims)

    def var(
        self,
        axis: Any = None,
        keepdims: bool = False,
        correction: int | None = None,
        *,
        dim: Any = None,
        keepdim: Any = None,
        unbiased: bool | None = None,
    ) -> Self:
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
        return self._call("var", self, axes=axis, keepdims=keepdims, correction=correction)

    def std(self, *args: Any, **kwargs: Any) -> Self:
        """Standard deviation: the square root of `var`, with its arguments."""
        return self.var(*args, **kwargs).sqrt()

    def max(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Any:
        """Maximum over ``axis``; with torch's ``dim=``, the (values, indices) pair torch gives."""
        if dim is not None:  # torch: (values, indices)
            return _min_max("max", self, dim, bool(keepdim))
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("max", self, axes=axis, keepdims=keepdims)

    def min(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Any:
        """Minimum over ``axis``; with torch's ``dim=``, the (values, indices) pair torch gives."""
        if dim is not None:
            return _min_max("min", self, dim, bool(keepdim))
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("min", self, axes=axis, keepdims=keepdims)

    def argmax(
        self,
        axis: int | None = None,
        keepdims: bool = False,
        *,
        dim: Any = None,
        keepdim: Any = None,
    ) -> Self:
        """Index of the maximum along ``axis`` (over the flattened tensor by default)."""
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("argmax", self, axis=axis, keepdims=keepdims)

    def argmin(
        self,
        axis: int | None = None,
        keepdims: bool = False,
        *,
        dim: Any = None,
        keepdim: Any = None,
    ) -> Self:
        """Index of the minimum along ``axis`` (over the flattened tensor by default)."""
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("argmin", self, axis=axis, keepdims=keepdims)

    def logsumexp(
        self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: Any = None
    ) -> Self:
        """log(sum(exp(x))) over ``axis``, computed without overflow."""
        axis, keepdims = _axes(axis, keepdims, dim, keepdim)
        return self._call("logsumexp", self, axes=axis, keepdims=keepdims)

    def softmax(self, axis: int = -1, *, dim: int | None = None) -> Self:
        """Softmax along ``axis`` (or torch's ``dim``)."""
        return self._call("softmax", self, axis=axis if dim is None else dim)

    def log_softmax(self, axis: int = -1, *, dim: int | None = None) -> Self:
        """log(softmax(x)) along ``axis``, computed without underflow."""
        return self._call("log_softmax", self, axis=axis if dim is None else dim)

    def reshape(self, *shape: Any) -> Self:
        """The same values in ``shape`` (one entry may be -1); free when unchanged."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return self if shape == self.shape else self._call("reshape", self, shape=tuple(shape))

    view = reshape

    def flatten(
        self, start: int = 0, end: int = -1, *, start_dim: Any = None, end_dim: Any = None
    ) -> Self:
        """Dimensions ``start``..``end`` merged into one (torch's ``start_dim``/``end_dim`` too)."""
        start = start if start_dim is None else start_dim
        end = end if end_dim is None else end_dim
        if self.ndim == 0:
            return self.reshape(1)
        start %= self.ndim
        end %= self.ndim
        return self.reshape(*self.shape[:start], -1, *self.shape[end + 1 :])

    def permute(self, *dims: Any) -> Self:
        """Dimensions reordered as ``dims``."""
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], tuple | list) else dims
        return self._call("permute", self, dims=tuple(dims))

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Self:
        """Dimensions ``dim0`` and ``dim1`` swapped (the last two by default)."""
        return self._call("transpose", self, dim0=dim0, dim1=dim1)

    @property
    def T(self) -> Self:
        """All dimensions reversed (a matrix's transpose)."""
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *shape: Any) -> Self:
        """Broadcast to ``shape`` (size-1 dimensions repeat; nothing is copied)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return self._call("expand", self, shape=tuple(shape))

    def squeeze(self, axis: Any = None, *, dim: Any = None) -> Self:
        """NumPy's: squeezing an axis that is not 1 raises; torch's spelling (`dim=`) leaves
        the tensor as it is, as torch does."""
        if dim is not None:
            dims = (dim,) if isinstance(dim, int) else tuple(dim)
            keep = tuple(d for d in dims if self.shape[d] == 1)
            return self if not keep else self._call("squeeze", self, axes=keep)
        return self._call("squeeze", self, axes=axis)

    def unsqueeze(self, axis: int | None = None, *, dim: int | None = None) -> Self:
        """A size-1 dimension inserted at ``axis`` (torch's ``dim``)."""
        return self._call("unsqueeze", self, axis=axis if dim is None else dim)

    def flip(self, axis: Any = None, *, dims: Any = None) -> Self:
        """Values reversed along ``axis`` (torch's ``dims``)."""
        axis = axis if dims is None else dims
        return self._call("flip", self, axes=(axis,) if isinstance(axis, int) else tuple(axis))

    # --- dtype casts: last, so `int`/`float` in the annotations above mean the builtins
    def cast(self, dtype: Any) -> Self:
        """The values as ``dtype`` (a dtype name, NumPy or torch dtype); itself when already so."""
        dtype = dtypes.normalize(dtype)
        return self if dtype == self.dtype else self._call("cast", self, dtype=dtype)

    astype = cast

    def float(self) -> Self:
        """Cast to float32."""
        return self.cast("float32")

    def double(self) -> Self:
        """Cast to float64."""
        return self.cast("float64")

    def half(self) -> Self:
        """Cast to float16."""
        return self.cast("float16")

    def long(self) -> Self:
        """Cast to int64."""
        return self.cast("int64")

    def int(self) -> Self:
        """Cast to int32."""
        return self.cast("int32")

    def type_as(self, other: Self) -> Self:
        """Cast to ``other``'s dtype."""
        return self.cast(other.dtype)


class _MinMax(NamedTuple):
    """torch's `max(dim=...)` / `min(dim=...)` result."""

    values: Any
    indices: Any


def _axes(axis: Any, keepdims: bool, dim: Any, keepdim: Any) -> tuple[Any, bool]:
    if dim is not None:
        if axis is not None:
            raise TypeError("give axis= or dim=, not both")
        axis = tuple(dim) if isinstance(dim, list) else dim
    return axis, keepdims if keepdim is None else bool(keepdim)


def _min_max(name: str, x: Any, dim: int, keepdim: bool) -> Any:
    values = x._call(name, x, axes=dim, keepdims=keepdim)
    indices = x._call(f"arg{name}", x, axis=dim, keepdims=keepdim)
    return _MinMax(values, indices)


def matmul(a: Any, b: Any) -> Any:
    """NumPy matmul semantics, 1-d operands included (promoted, then squeezed back)."""
    if not isinstance(a, TensorMath) or not isinstance(b, TensorMath):
        from ._recorder import not_a_tensor

        raise not_a_tensor("matmul", b if isinstance(a, TensorMath) else a)
    squeeze = []
    if a.ndim == 1:
        a = a.reshape(1, a.shape[0])
        squeeze.append(-2)
    if b.ndim == 1:
        b = b.reshape(b.shape[0], 1)
        squeeze.append(-1)
    out = a._call("matmul", a, b)
    if squeeze:
        out = (
            out.reshape(*out.shape[: out.ndim - len(squeeze)])
            if len(squeeze) == 2
            else out.squeeze(squeeze[0])
        )
    return out
