"""Every primitive op's kernel for one OpenCL backend, gathered from the kernel modules.

The one module that imports all of them (the backend calls `build_kernels` once per device),
so the kernel modules never import each other to be complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..collective import all_reduce_kernel
from .opencl_losses import loss_kernels
from .opencl_nn import nn_kernels
from .opencl_ops import ops_kernels

if TYPE_CHECKING:
    from .opencl_backend import OpenCLBackend


def build_kernels(be: OpenCLBackend) -> dict[str, Any]:
    """Op name -> kernel on ``be``'s queue, for every primitive op."""
    kernels = {**ops_kernels(be), **nn_kernels(be)}
    kernels.update(loss_kernels(kernels))  # losses are built from the kernels above
    kernels["all_reduce"] = all_reduce_kernel  # the bytes leave the device anyway
    return kernels
