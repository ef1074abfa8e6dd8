"""The CPU engine's thread count, set once and shared by BLAS and the engine's own kernels.

OpenBLAS (through threadpoolctl, when installed) and the pool that the chunked kernels
(``numpy_optim_kernels``) spread their chunks over use the same number of threads, so the
two never oversubscribe the cores: they run one after the other within a step, never at once.
The number comes from ``BURN_REMOTE_THREADS`` (``burn-remote serve --threads`` sets it), else
from the cores this process may run on.

The BLAS count is never changed around single calls. OpenBLAS keeps one count for the whole
process, and some products' last bits depend on it (measured: a 2048x32 @ 32x10 product
differs by 2e-6 between one and two threads). Switched per call, a step's result would
depend on which thread ran it (threadpoolctl lets only the first thread that set the count
change it: a server's engine threads could not, the test's main thread could) and on what
other sessions' steps were doing at that moment. Set once, a graph gives the same bits on
any thread, locally and on a server with the same count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

THREADS_ENV = "BURN_REMOTE_THREADS"
"""Threads of the CPU engine (BLAS and fused kernels); unset: every core this process may use."""

PARALLEL_MIN_WORK = 1 << 20
"""Work, in element passes, below which ``run_parallel`` stays on the calling thread. An
element pass is one element read and written by a cheap ufunc (``np.add``). Handing a part
to a pool thread and waiting for it costs 100-150 us on a 2-core VM (measured: a no-op part),
about what ``np.add`` takes over a million float32 elements: below that a second core loses."""

TRANSCENDENTAL_PASSES = 12
"""Element passes that one element of exp, tanh, sigmoid or a softmax costs (NumPy float32 exp
measured at 11-14x ``np.add`` an element), so that such kernels go to the pool from about 10^5
elements."""

_state: dict[str, Any] = {"threads": None, "pool": None, "blas": None}


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
        from threadpoolctl import ThreadpoolController, threadpool_limits
    except ImportError:  # BLAS keeps its own setting (OPENBLAS_NUM_THREADS and the like)
        return n
    # not a context manager: the limit stays for the life of the process
    _state["blas"] = threadpool_limits(limits=n, user_api="blas")
    if _blas_threads() not in (None, n):
        # threadpoolctl lets only the first thread that set OpenBLAS's count change it
        # (documented on its OpenBLASController); this setting is the process's, so it
        # takes that role over: without this a call from another thread is silently ignored
        for controller in ThreadpoolController().select(user_api="blas").lib_controllers:
            clear = getattr(controller, "clear_controlling_thread", None)  # threadpoolctl 3.7+
            if clear is not None:
                clear(force=True)
        _state["blas"] = threadpool_limits(limits=n, user_api="blas")
        if _blas_threads() != n:
            raise RuntimeError(
                f"threads: BLAS kept {_blas_threads()} threads when set to {n}"
                " (threadpoolctl could not change it from this thread)"
            )
    return n


def _blas_threads() -> int | None:
    """BLAS's thread count now (the first library's), None when threadpoolctl sees none."""
    from threadpoolctl import ThreadpoolController

    for info in ThreadpoolController().select(user_api="blas").info():
        return int(info["num_threads"])
    return None


def shares(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``[start, stop)`` spans cutting ``range(total)`` into at most ``parts`` equal shares,
    each starting on a multiple of ``align``: how the chunked kernels hand rows or elements
    to the engine's threads."""
    per = -(-total // (max(1, parts) * align)) * align
    return [(i, min(i + per, total)) for i in range(0, total, per)] if total else []


def run_parallel(fn: Callable[[Any], None], parts: Sequence[Any], work: int) -> None:
    """``fn(part)`` for every part: the calling thread runs the first and the pool the rest
    when ``work`` (element passes, ``PARALLEL_MIN_WORK``) is worth the hand-off; NumPy releases
    the GIL inside its loops, so the parts run at once. Exceptions propagate."""
    n = threads()
    if n == 1 or len(parts) < 2 or work < PARALLEL_MIN_WORK:
        for part in parts:
            fn(part)
        return
    pool = _state["pool"]
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor  # here: a small step never needs it

        pool = _state["pool"] = ThreadPoolExecutor(n - 1, thread_name_prefix="burn-cpu")
    pending = [pool.submit(fn, part) for part in parts[1:]]
    try:
        fn(parts[0])
    finally:
        for future in pending:  # every part has finished before its arrays are used or freed
            future.exception()
    for future in pending:
        future.result()
