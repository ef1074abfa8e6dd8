"""Local replicas: in-process devices whose graphs run on a worker thread each, in order.

A collective is a rendezvous: rank 0's graph cannot finish its ``all_reduce`` before rank
1's graph reaches its own. On an ordinary local device a flush runs the graph in the
caller's thread, so a loop that steps rank 0, then rank 1, would wait forever at rank 0.
A replica works like a GPU stream instead: uploads, graphs and drops are queued to its
worker and the caller goes on; reads, ``sync`` and statistics wait until the worker has run
everything queued before them. Failures of queued work are kept and raised at that next
wait, as a remote device raises a server's errors at the next sync.

A replica shows its group that it is alive through its ``liveness``
(``engine.collective.local.Liveness``): ops recorded and work queued for it, and the CPU its
worker uses while running a job. A rank that keeps making progress is never declared late
at a rendezvous, however long its step takes; a frozen one is, after the group's timeout.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._device import Device, LocalRuntime
from ._group_error import as_group_error
from ._recorder import OpFailed, Recorder

MAX_QUEUED = 256
"""Operations a replica's caller may queue ahead of its worker; past this ``put`` waits
(back-pressure; a replica stuck at a rendezvous fails by the group's timeout, so the wait
ends)."""


class ReplicaRuntime(LocalRuntime):
    """A LocalRuntime driven by its own worker thread (see the module docstring)."""

    def __init__(self, spec: str, name: str) -> None:
        from burn_remote.engine.collective.local import Liveness

        super().__init__(spec, pooled=False)
        self.name = name
        self.liveness = Liveness()
        """What this rank's groups read to tell a busy rank from a frozen one."""
        self.groups: dict[int, Any] = {}
        """Group id -> this replica's member (``engine.collective``), set by ``Group``."""
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue(MAX_QUEUED)
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name=f"replica {name}", daemon=True)
        self._worker.start()

    # --- the worker -------------------------------------------------------------------------
    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                with self.liveness.acting():
                    job()
            except BaseException as exc:  # kept for the next wait, in order
                with self._lock:
                    self._errors.append(exc)
            with self._lock:  # failed and idle: its partners stop waiting for it
                if self._errors and self._queue.empty():
                    self.liveness.failed(self._errors[0])

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker after everything queued; its result. Raises the first
        failure of queued work since the last wait, else ``fn``'s own."""
        done = threading.Event()
        box: list[Any] = []
        failed: list[BaseException] = []

        def job() -> None:
            try:
                box.append(fn())
            except BaseException as exc:
                failed.append(exc)
            finally:
                done.set()

        self._put(job, work=False)  # a wait: nothing that could reach a collective
        done.wait()
        with self._lock:
            errors, self._errors = self._errors + failed, []
        if errors:
            first = errors[0]
            if isinstance(first, KeyError):  # an input of a graph after a failed one
                raise OpFailed(f"tensor {first} was never computed (an earlier step failed)")
            raise first
        return box[0]

    def _put(self, job: Callable[[], Any], work: bool = True) -> None:
        """Queue `job`. Work (an upload, a graph, a drop) may lead to a collective, so a
        rank failed earlier is waited for again (the worker marks it failed under the same
        lock); a wait or a read may not, and leaves the mark: a failure the client received
        still keeps its partners from waiting for a rank that has nothing to bring."""
        self.liveness.touch()
        self._queue.put(job)
        if work:
            with self._lock:
                self.liveness.failed(None)

    # --- Runtime protocol -------------------------------------------------------------------
    def upload(self, tensor_id: int, array: Any) -> None:
        """Queue the upload to the worker and return; waits only when MAX_QUEUED jobs are ahead."""
        self._put(lambda: LocalRuntime.upload(self, tensor_id, array))

    def execute(self, capture: Any) -> None:
        """Queue the graph to the worker and return, so the caller can step the next rank before
        this one reaches its collective. A failure (a GroupError for a failed collective) is raised
        at the next read, sync or stats call."""
        from burn_remote.engine.collective import scope

        def run() -> None:
            try:
                with scope(self.groups, self.backend):
                    LocalRuntime.execute(self, capture)
            except OpFailed as exc:
                raise as_group_error(exc) from exc.__cause__

        self._put(run)

    def drop(self, ids: Sequence[int], into_graph: bool = False) -> None:
        """Free ``ids``: at once from the worker itself (a graph's donated inputs), else queued after
        the work that may still read them."""
        if threading.current_thread() is self._worker:  # from execute (donated inputs)
            LocalRuntime.drop(self, ids, into_graph)
        else:
            ids = list(ids)
            self._put(lambda: LocalRuntime.drop(self, ids, into_graph))

    def read(self, tensor_id: int) -> Any:
        """The tensor's NumPy value once everything queued before it has run; raises the first failure
        of queued work, or OpFailed for a tensor an earlier failed step never computed."""

        def get() -> Any:
            if tensor_id not in self.store:
                raise OpFailed(f"tensor {tensor_id} was never computed (an earlier step failed)")
            return LocalRuntime.read(self, tensor_id)

        return self._call(get)

    def wait(self) -> None:
        """Until everything queued ran; raises the first failure since the last wait."""
        self._call(lambda: None)

    def memory_stats(self) -> Any:
        """`LocalRuntime.memory_stats` once the queued work has run (raising its first failure)."""
        return self._call(lambda: LocalRuntime.memory_stats(self))

    def stats(self) -> dict[str, int]:
        """`LocalRuntime.stats` once the queued work has run (raising its first failure)."""
        return self._call(lambda: LocalRuntime.stats(self))


class _ReplicaRecorder(Recorder):
    """A Recorder whose every recorded op counts as its replica's progress."""

    def __init__(self, runtime: ReplicaRuntime) -> None:
        super().__init__(runtime)
        self.runtime: ReplicaRuntime = runtime

    def add(self, node: Any) -> None:
        self.runtime.liveness.touch()
        super().add(node)


class ReplicaDevice(Device):
    """One of ``collective.local_devices(n)``: a CPU device of its own (``Device.cpu()`` is
    one shared object, so it cannot be two ranks)."""

    _rec: _ReplicaRecorder

    def __init__(self, spec: str, index: int) -> None:
        runtime = ReplicaRuntime(spec, f"local:{index}")
        super().__init__(spec, runtime)
        self._rec = _ReplicaRecorder(runtime)
        self.index = index

    def acting(self) -> Any:
        """A context in which the calling thread works for this replica (records its
        step): its CPU time counts as the replica's progress at a rendezvous."""
        return self._rec.runtime.liveness.acting()

    def __repr__(self) -> str:
        return f"ReplicaDevice({self.spec!r}, {self.index})"

    def __reduce__(self) -> tuple:
        raise TypeError(f"cannot pickle {self!r}: a replica lives only in this process")

    def sync(self) -> None:
        """Run everything recorded and wait for this replica's worker to finish it; raises the first
        failure of its queued work (a GroupError when a collective failed)."""
        super().sync()
        self._rec.runtime.wait()


__all__ = ["MAX_QUEUED", "ReplicaDevice", "ReplicaRuntime"]
