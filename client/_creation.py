"""torch-style module-level constructors: `burn_remote.randn(2, 3, device=dev)` and friends.

Each is the device method of the same name on `device` (default `Device.cpu()`); unkeyed
random draws come from one default generator that `manual_seed` resets, as torch's does.
"""

from __future__ import annotations

from typing import Any

from ._device import Device
from ._tensor import Tensor


def _dev(device: Any) -> Device:
    return Device.cpu() if device is None else Device.resolve(device)


def device(spec: Any) -> Device:
    """A device from its name: "cpu", "cuda:0", "opencl", or a server ("PEER@HOST:PORT",
    or a peer id the address book knows), as `torch.device` is spelt (`Device.resolve`)."""
    return Device.resolve(spec)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``x.flatten(start_dim, end_dim)`` as a function (torch's ``torch.flatten``)."""
    return x.flatten(start_dim, end_dim)


def manual_seed(seed: int) -> None:
    """Reset the default generator: weight init, unkeyed random draws, dropout keys and
    DataLoader shuffles all repeat after the same seed."""
    from .nn._init import seed as _seed

    _seed(seed)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor holding a copy of ``data`` (array-like, NumPy, torch) on ``device`` (default cpu)."""
    return _dev(device).tensor(data, dtype, requires_grad)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``data`` as a tensor: a Tensor is moved or cast only as asked; other data is uploaded."""
    if isinstance(data, Tensor):
        out = data if device is None else data.to(device)
        return out if dtype is None else out.cast(dtype)
    return _dev(device).tensor(data, dtype)


from_numpy = as_tensor


def from_dlpack(x: Any, device: Any = None) -> Tensor:
    """A tensor with the values of any DLPack producer (a copy), on ``device``."""
    return _dev(device).from_dlpack(x)


def arange(
    start: float, end: float | None = None, step: float = 1, dtype: Any = None, device: Any = None
) -> Tensor:
    """Evenly spaced values in [start, end) (torch.arange: int64 for integer arguments)."""
    return _dev(device).arange(start, end, step, dtype)


def eye(n: int, m: int | None = None, dtype: Any = "float32", device: Any = None) -> Tensor:
    """The n x m identity matrix on ``device``."""
    return _dev(device).eye(n, m, dtype)


def randn(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    """Standard normal draws of ``shape`` from the seeded default generator (`manual_seed`)."""
    return _dev(device).randn(*shape, dtype=dtype)


def rand(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    """Uniform [0, 1) draws of ``shape`` from the seeded default generator (`manual_seed`)."""
    return _dev(device).rand(*shape, dtype=dtype)


def zeros(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    """A tensor of ``shape`` filled with 0 (``zeros(2, 3)`` or ``zeros((2, 3))``)."""
    s = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
    return _dev(device).zeros(s, dtype)


def ones(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    """A tensor of ``shape`` filled with 1 (``ones(2, 3)`` or ``ones((2, 3))``)."""
    s = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
    return _dev(device).ones(s, dtype)
