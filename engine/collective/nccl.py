"""All-reduce between GPU servers through NCCL (CuPy's ``cupy.cuda.nccl``).

NCCL is what GPU clusters run: it moves device memory directly (NVLink, InfiniBand, or TCP
between hosts) with no host copy. Its bootstrap needs every rank to hold the same unique id;
the servers pass rank 0's id around their authenticated ring links (``NcclId``), never
through the client. CuPy loads only here, when a group chooses the ``nccl`` engine (every
rank on a CUDA device); without CuPy or NCCL this module still imports, and ``available``
says why not.

A dead rank would leave NCCL waiting forever inside a collective, so the link watchdog calls
``abort`` (``ncclCommAbort``) on failure: the pending call returns with an error, which the
kernel turns into the group's ``GroupFailure``.
"""

from __future__ import annotations

from typing import Any

from ._errors import GroupFailure

_OPS = {"sum": "NCCL_SUM", "mean": "NCCL_SUM"}
_DTYPES = {
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
    "bfloat16": "NCCL_BFLOAT16",
}
"""Wire dtype -> NCCL data type (the names of ``cupy.cuda.nccl``'s constants)."""


def _nccl() -> Any:
    from cupy.cuda import nccl  # type: ignore[import-not-found]

    return nccl


def available() -> str | None:
    """None when NCCL can be used here, else why not."""
    try:
        nccl = _nccl()
        import cupy  # type: ignore[import-not-found]

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
        nccl.get_version()
    except Exception as exc:  # ImportError, CUDARuntimeError, missing libnccl
        return f"{type(exc).__name__}: {exc}"
    return None


def unique_id() -> bytes:
    """Rank 0's NCCL unique id, as bytes for the wire."""
    uid = _nccl().get_unique_id()
    return bytes(b & 0xFF for b in uid)


def _as_uid(data: bytes) -> tuple[int, ...]:
    """CuPy wants the id as a tuple of signed chars."""
    return tuple(b - 256 if b > 127 else b for b in data)


class Communicator:
    """One rank's NCCL communicator (joining blocks until every rank has joined)."""

    def __init__(self, size: int, rank: int, uid: bytes, backend: Any) -> None:
        nccl = _nccl()
        self.backend = backend
        device = getattr(backend, "device", None)
        if device is not None:
            with device:
                self.comm = nccl.NcclCommunicator(size, _as_uid(uid), rank)
        else:
            self.comm = nccl.NcclCommunicator(size, _as_uid(uid), rank)
        self.size = size
        self._aborted = False

    def all_reduce(self, x: Any, op: str, backend: Any, member: Any) -> Any:
        """Sum ``x`` over the ranks into a new device array, on the backend's stream."""
        nccl = _nccl()
        cp = backend.cp
        name = str(x.dtype) if str(x.dtype) != "bfloat16" else "bfloat16"
        if name not in _DTYPES:
            raise GroupFailure(member.id, -1, "", f"NCCL cannot reduce {name}")
        src = cp.ascontiguousarray(x)
        out = cp.empty_like(src)
        stream = getattr(backend, "stream", None)
        ptr = 0 if stream is None else stream.ptr
        try:
            self.comm.allReduce(
                src.data.ptr, out.data.ptr, src.size,
                getattr(nccl, _DTYPES[name]), getattr(nccl, _OPS[op]), ptr,
            )  # fmt: skip
            if stream is not None:
                stream.synchronize()
        except Exception as exc:
            if member.failure is not None:
                raise member.failure from exc
            raise GroupFailure(member.id, -1, "", f"NCCL all-reduce failed: {exc}") from exc
        if member.failure is not None:  # aborted: the result may be partial
            raise member.failure
        if op == "mean":
            out /= self.size
        return out.reshape(x.shape)  # ascontiguousarray made a 0-d array 1-d

    def abort(self) -> None:
        if not self._aborted:
            self._aborted = True
            try:
                self.comm.abort()
            except Exception:  # already destroyed, or NCCL without abort
                pass


__all__ = ["Communicator", "available", "unique_id"]
