"""NumPy-style indexing: ints, slices, None, Ellipsis and one integer index tensor."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
from burn_remote.protocol.shapes import slice_len

from ._math import TensorMath  # every tensor is one (`_tensor.Tensor` builds on it)

T = TypeVar("T", bound=TensorMath)


def getitem(x: T, key: Any) -> T:
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(_as_index(x, k) for k in key)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    if n_real > x.ndim:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}: {n_real}")
    if any(k is Ellipsis for k in key):  # identity: `in` would call TensorMath.__eq__
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (x.ndim - n_real) + key[at + 1 :]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    starts, stops, steps, final = [], [], [], []
    tensor_axis, tensor_index, tensor_pos = None, None, 0
    axis = 0
    for k in key:
        if k is None:
            final.append(1)
            continue
        dim = x.shape[axis]
        if isinstance(k, TensorMath):
            if tensor_index is not None:
                raise IndexError("only one integer index tensor is supported per indexing")
            tensor_axis, tensor_index, tensor_pos = axis, k, len(final)
            starts.append(0)
            stops.append(dim)
            steps.append(1)
            final.extend(k.shape)
        elif isinstance(k, slice):
            a, o, s = k.indices(dim)
            starts.append(a)
            stops.append(o)
            steps.append(s)
            final.append(slice_len(a, o, s))
        else:
            i = int(k)
            if not -dim <= i < dim:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim}")
            i %= dim
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
        axis += 1
    y = x
    if tuple(starts) != (0,) * x.ndim or tuple(stops) != x.shape or any(s != 1 for s in steps):
        y = x._call("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    if tensor_index is not None:
        y = y._call("index_select", y, tensor_index, axis=tensor_axis)
    y = y.reshape(tuple(final)) if tuple(final) != y.shape else y
    if tensor_index is not None:
        # NumPy: integers count as advanced indices beside the tensor; when a slice or None
        # separates them, the index's dimensions go first (x[1, :, idx] has shape (n, ...)).
        adv = [i for i, k in enumerate(key) if isinstance(k, TensorMath | int | np.integer)]
        if adv[-1] - adv[0] + 1 != len(adv) and tensor_pos:
            n = tensor_index.ndim
            order = list(range(tensor_pos, tensor_pos + n))
            order += [d for d in range(y.ndim) if not tensor_pos <= d < tensor_pos + n]
            y = y.permute(*order)
    return y


def _as_index(x: TensorMath, k: Any) -> Any:
    if isinstance(k, TensorMath):
        if k.dtype == "bool":
            raise IndexError("boolean mask indexing is not supported; use where()")
        return k
    if isinstance(k, list | np.ndarray):
        arr = np.asarray(k)
        if arr.dtype.kind not in "iu":
            raise IndexError(f"index arrays must hold integers, got {arr.dtype}")
        return x._dev.tensor(arr.astype(np.int64))
    if k is None or k is Ellipsis or isinstance(k, slice | int | np.integer):
        return k
    raise IndexError(f"unsupported index {k!r}")
