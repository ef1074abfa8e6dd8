"""burn_remote: pick a device at run time, and the same tensor code runs there.

The public surface is re-exported here from private modules; tests/test_package.py keeps it
honest. Transport, server and GPU stacks load only when a device needs them.
"""

from typing import TYPE_CHECKING

from . import _blas_env  # noqa: F401  (first: it must run before NumPy loads OpenBLAS)

# What creating a CPU tensor needs loads now; the rest on first use (see __getattr__).
from ._autograd import no_grad
from ._device import DEVICE_KINDS, PEER_KIND, Device, DeviceKind
from ._ops import RecordError
from ._recorder import OpFailed
from ._tensor import Tensor, matmul
from .protocol.lazy import lazy_names


def _open_peer(target: str) -> Device:
    """A server's device: its row in the device table is added here, at the package's
    root, because the remote device sits above `Device` (which must not import it)."""
    from ._remote import RemoteDevice

    return RemoteDevice(target)


DEVICE_KINDS[PEER_KIND] = DeviceKind(
    "or a server: PEER@HOST:PORT or a peer id (an address-book name: RemoteDevice(name))",
    _open_peer,
)

_LAZY = {
    # name: (module, attribute or None for the module itself)
    "collective": (".collective", None),
    "data": (".data", None),
    "functional": (".functional", None),
    "lora": (".lora", None),
    "nn": (".nn", None),
    "optim": (".optim", None),
    "CaptureError": ("._compile", "CaptureError"),
    "compile": ("._compile", "compile"),
    "DataParallel": ("._dataparallel", "DataParallel"),
    "ReplicaDivergence": ("._dp_digest", "ReplicaDivergence"),
    "ShardError": ("._dp_shard", "ShardError"),
    "Extension": ("._extension", "Extension"),
    "ExtensionOp": ("._extension", "ExtensionOp"),
    "ChecksumError": ("._jobs", "ChecksumError"),
    "Job": ("._jobs", "Job"),
    "JobError": ("._jobs", "JobError"),
    "Jobs": ("._jobs", "Jobs"),
    "RemoteDevice": ("._remote", "RemoteDevice"),
    "RemoteError": ("._remote", "RemoteError"),
    **{
        name: ("._creation", name)
        for name in (
            "arange",
            "as_tensor",
            "device",
            "eye",
            "flatten",
            "from_dlpack",
            "from_numpy",
            "manual_seed",
            "ones",
            "rand",
            "randn",
            "tensor",
            "zeros",
        )
    },
}
"""Public names loaded on first use, so `import burn_remote` costs little more than NumPy."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from . import collective, data, functional, lora, nn, optim  # noqa: F401
    from ._compile import CaptureError, compile  # noqa: F401
    from ._creation import (  # noqa: F401
        arange,
        as_tensor,
        device,
        eye,
        flatten,
        from_dlpack,
        from_numpy,
        manual_seed,
        ones,
        rand,
        randn,
        tensor,
        zeros,
    )
    from ._dataparallel import DataParallel  # noqa: F401
    from ._dp_digest import ReplicaDivergence  # noqa: F401
    from ._dp_shard import ShardError  # noqa: F401
    from ._extension import Extension, ExtensionOp  # noqa: F401
    from ._jobs import ChecksumError, Job, JobError, Jobs  # noqa: F401
    from ._remote import RemoteDevice, RemoteError  # noqa: F401

float16, bfloat16, float32, float64 = "float16", "bfloat16", "float32", "float64"
int8, uint8, int32, int64 = "int8", "uint8", "int32", "int64"
bool_ = "bool"

__all__ = [
    "CaptureError",
    "ChecksumError",
    "collective",
    "compile",
    "DataParallel",
    "Device",
    "Extension",
    "ExtensionOp",
    "Job",
    "JobError",
    "Jobs",
    "OpFailed",
    "RecordError",
    "RemoteDevice",
    "RemoteError",
    "ReplicaDivergence",
    "ShardError",
    "Tensor",
    "arange",
    "as_tensor",
    "data",
    "device",
    "eye",
    "flatten",
    "from_dlpack",
    "from_numpy",
    "functional",
    "lora",
    "manual_seed",
    "matmul",
    "nn",
    "no_grad",
    "ones",
    "optim",
    "rand",
    "randn",
    "tensor",
    "zeros",
]
