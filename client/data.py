"""A minimal DataLoader over NumPy arrays: batches as tensors, shuffled by key.

`DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)` yields `(x_batch, y_batch)`
tensors on `device` (default the CPU, so the PyTorch habit `x.to(device)` moves them). The
order of epoch `e` is a permutation drawn from `key` and `e` when a key is given, else from the
default generator that `burn_remote.manual_seed` resets: the same seed, the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._tensor import Tensor


def _host(a: Any) -> np.ndarray:
    if isinstance(a, Tensor):
        return a.numpy()
    if type(a).__module__.partition(".")[0] == "torch":
        from ._device import _from_torch

        return _from_torch(a)
    return np.asarray(a)


class TensorDataset:
    """Arrays (NumPy, torch or our tensors, read once to the host) indexed along axis 0."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("TensorDataset: give at least one array")
        self.arrays = [_host(a) for a in arrays]
        n = len(self.arrays[0])
        for i, a in enumerate(self.arrays):
            if len(a) != n:
                raise ValueError(f"TensorDataset: array {i} has {len(a)} rows, array 0 has {n}")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: Any) -> tuple[np.ndarray, ...]:
        return tuple(a[index] for a in self.arrays)


class DataLoader:
    """Batches of a TensorDataset as tensors; see the module docstring."""

    def __init__(
        self,
        dataset: TensorDataset,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        key: int | None = None,
        device: Any = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"DataLoader: batch_size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.drop_last, self.key, self.device = drop_last, key, device
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        if self.key is not None:
            return np.random.default_rng([self.key, self.epoch]).permutation(n)
        from .nn import _init

        return _init._rng.permutation(n)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        from ._device import Device

        dev = Device.cpu() if self.device is None else Device.parse(self.device)
        order = self._order()
        self.epoch += 1
        for b in range(len(self)):
            rows = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield tuple(dev.tensor(np.ascontiguousarray(a[rows])) for a in self.dataset.arrays)


__all__ = ["DataLoader", "TensorDataset"]
