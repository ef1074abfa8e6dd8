"""The CPU engine's thread count, set once and shared by BLAS and the engine's own kernels.

OpenBLAS (through threadpoolctl, when installed) and the pool that the chunked kernels
(``numpy_optim_kernels``) spread their chunks over use the same number of threads, so the
two never oversubscribe the cores: they run one after the other within a step, never at once.
The number comes from ``BURN_REMOTE_THREADS`` (``burn-remote serve --threads`` sets it), else
from the cores this process may run on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

THREADS_ENV = "BURN_REMOTE_THREADS"
"""Threads of the CPU engine (BLAS and fused kernels); unset: every core this process may use."""

SMALL_GEMM_MACS = 1 << 24
"""A matrix product with fewer multiply-adds than this (per matrix of a batch: ~0.1-0.2 ms on
one core) runs BLAS on one thread: split over threads its work is smaller than the threads'
hand-offs, and on a loaded machine a BLAS thread spinning for a descheduled partner measured
5-30x slower (a LoRA step of 3 s took 43 s on two threads). A batch of such products is
spread over the engine's threads instead, one BLAS thread each."""

PARALLEL_MIN_ELEMENTS = 1 << 18
"""Work below this many elements runs on the calling thread: handing it to the pool costs
more (~20-50 us a hand-off) than a second core gains on it."""

_state: dict[str, Any] = {"threads": None, "pool": None, "blas": None, "controllers": []}


def default_threads() -> int:
    """``BURN_REMOTE_THREADS`` if set, else the cores this process may run on."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{THREADS_ENV}={env!r}: expected a whole number of threads") from None
        if n < 1:
            raise ValueError(f"{THREADS_ENV}={env!r}: expected at least 1 thread")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads() -> int:
    """The engine's thread count, set from ``default_threads`` on first use."""
    n = _state["threads"]
    if n is None:
        n = set_threads(default_threads())
    return n


def set_threads(n: int) -> int:
    """Use ``n`` threads from now on, for BLAS (when threadpoolctl can reach it) and for the
    engine's pool. Returns ``n``."""
    if n < 1:
        raise ValueError(f"threads: expected at least 1, got {n}")
    if _state["threads"] == n:
        return n
    _state["threads"] = n
    pool = _state["pool"]
    _state["pool"] = None
    if pool is not None:
        pool.shutdown(wait=False)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # BLAS keeps its own setting (OPENBLAS_NUM_THREADS and the like)
        return n
    # not a context manager: the limit stays for the life of the process
    _state["blas"] = threadpool_limits(limits=n, user_api="blas")
    from threadpoolctl import ThreadpoolController

    _state["controllers"] = ThreadpoolController().select(user_api="blas").lib_controllers
    return n


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread inside the block (``SMALL_GEMM_MACS``), the engine's count after.
    A call each way into the BLAS library (~1 us); nothing when the engine has one thread or
    threadpoolctl cannot reach BLAS."""
    n = threads()
    controllers = _state["controllers"]
    if n == 1 or not controllers:
        yield
        return
    for c in controllers:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c in controllers:
            c.set_num_threads(n)


def run_parallel(fn: Callable[[Any], None], parts: Sequence[Any], elements: int) -> None:
    """``fn(part)`` for every part, spread over the engine's threads when ``elements`` (the
    work's size) is worth it; NumPy releases the GIL inside its loops, so the parts run at
    once. Exceptions propagate."""
    n = threads()
    if n == 1 or len(parts) < 2 or elements < PARALLEL_MIN_ELEMENTS:
        for part in parts:
            fn(part)
        return
    pool = _state["pool"]
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor  # here: a small step never needs it

        pool = _state["pool"] = ThreadPoolExecutor(n, thread_name_prefix="burn-cpu")
    for _ in pool.map(fn, parts):
        pass
