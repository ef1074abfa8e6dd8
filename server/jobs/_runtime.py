"""A job's device on the server's own engine: one backend, one plan cache, one memory ledger
and one set of limits for sessions and jobs alike.

Jobs run user-style code (nn, optim, lora) on a local ``Device``; its runtime here stores
tensors like a session does and charges every byte to the server's ledger
(``ServerState.account``) before keeping it, so ``--memory-limit`` refuses a job's tensors
exactly as it refuses a session's, and the plans a job compiles are the server's cached
plans (``burn-remote status`` and the metrics count them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...engine.executor import ExecutionError
from .._fair import JOB_WEIGHT
from .._state import ServerState, pop_all, replacement_cost


class JobRuntime:
    """The ``Runtime`` (see ``burn_remote._recorder``) of one running job."""

    def __init__(self, state: ServerState, owner: str) -> None:
        self.state = state
        self.owner = owner
        """Who the memory is charged to (``job <id>``), for the messages of refusals."""
        self.backend = state.backend
        self.store: dict[int, Any] = {}
        self.nbytes = 0
        self.peak = 0

    def _keep(self, items: Sequence[tuple[int, Any]]) -> None:
        """Charge, then store (replacing the same ids); nothing is kept past a limit."""
        added, delta = replacement_cost(self.store, items)
        self.state.account(added, delta, self.nbytes, self.owner)
        self.store.update(items)
        self.nbytes += delta
        self.peak = max(self.peak, self.nbytes)

    def upload(self, tensor_id: int, array: np.ndarray) -> None:
        self._keep([(tensor_id, self.backend.from_numpy(np.asarray(array, order="C")))])

    def execute(self, capture: Any) -> None:
        from burn_remote._recorder import op_failure

        state = self.state
        plan = state.plan(capture.digest) or state.compile(capture.digest, capture.graph)
        inputs = [self.store[i] for i in capture.input_ids]
        donated = [*capture.donated, *capture.inplace]  # in place: the graph takes them
        self.drop([capture.input_ids[k] for k in donated])
        try:
            outs = state.fair.run(  # a fair turn, below sessions (``_fair``)
                self.owner, "job", JOB_WEIGHT, state.run, plan, inputs, capture.values, donated
            )
        except ExecutionError as exc:
            raise op_failure(capture.where(exc.node), exc.op, str(exc)) from exc
        self._keep(list(zip(capture.output_ids, outs)))

    def read(self, tensor_id: int) -> np.ndarray:
        return self.backend.to_numpy(self.store[tensor_id])

    def drop(self, ids: Sequence[int]) -> None:
        count, freed = pop_all(self.store, ids)
        if count:
            self.nbytes -= freed
            self.state.account(-count, -freed, self.nbytes, self.owner)

    def release(self) -> None:
        """The job ended: everything it held goes back to the ledger."""
        self.drop(tuple(self.store))
        self.state.fair.forget(self.owner)

    def stats(self) -> dict[str, int]:
        return {"tensors": len(self.store), "bytes": self.nbytes, "peak": self.peak}


__all__ = ["JobRuntime"]
