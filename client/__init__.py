"""burn_remote: pick a device at run time, and the same tensor code runs there.

The public surface is re-exported here from private modules; tests/test_package.py keeps it
honest. Transport, server and GPU stacks load only when a device needs them.
"""

from . import data, functional, lora, nn, optim
from ._autograd import no_grad
from ._compile import CaptureError, compile
from ._creation import (
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
from ._device import Device
from ._extension import Extension, ExtensionOp
from ._jobs import ChecksumError, Job, JobError, Jobs
from ._ops import RecordError
from ._recorder import OpFailed
from ._remote import RemoteDevice, RemoteError
from ._tensor import Tensor, matmul

float16, bfloat16, float32, float64 = "float16", "bfloat16", "float32", "float64"
int8, uint8, int32, int64 = "int8", "uint8", "int32", "int64"
bool_ = "bool"

__all__ = [
    "CaptureError",
    "ChecksumError",
    "compile",
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
