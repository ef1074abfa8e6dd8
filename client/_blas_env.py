"""OpenBLAS told, before NumPy loads it, not to keep its idle threads spinning.

After each product OpenBLAS's worker threads busy-wait for 2**28 cycles (about 0.1 s) by
default before they sleep, so the CPU engine's own threads, which run the elementwise
kernels, the optimizer's update and the loss between the products, share the cores with
spinning ones: measured on a 2-core VM, a 3 MiB sigmoid right after a GEMM took 10.2 ms
against 5.9 ms with the spin cut, and a SmolLM2 LoRA step ~5 % longer. OpenBLAS reads
``OPENBLAS_THREAD_TIMEOUT`` (a power of two of cycles, 4-30) once, when it is loaded, so
this module runs first in ``import burn_remote`` and sets it only when NumPy is not loaded
yet and the user has not set it. Imports nothing but ``os`` and ``sys``.
"""

from __future__ import annotations

import os
import sys

BLAS_SPIN_ENV = "OPENBLAS_THREAD_TIMEOUT"
BLAS_SPIN = "16"
"""2**16 cycles (~25 us): back-to-back products still find their threads awake."""


def quiet_blas_spin() -> bool:
    """Set ``BLAS_SPIN_ENV`` to ``BLAS_SPIN`` when unset and NumPy (hence OpenBLAS) is not
    loaded yet; True when it did."""
    if "numpy" in sys.modules or BLAS_SPIN_ENV in os.environ:
        return False
    os.environ[BLAS_SPIN_ENV] = BLAS_SPIN
    return True


quiet_blas_spin()
