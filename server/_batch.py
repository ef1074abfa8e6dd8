"""A run of replays of one cached graph, charged to the ledger once (issue 15).

A captured training loop sends, per step, its inputs' inline Uploads and one ExecuteGraph of
the same cached graph, and several steps arrive in one frame. Message by message each step
costs the session two ledger updates per Upload and ExecuteGraph (four locks a step) and a
placement question per message. ``start_run`` finds the longest run
``[Upload(inline)* ExecuteGraph(D)]+`` at the head of a session's queue (one digest D, at
least ``MIN_RUN_STEPS`` steps), reserves what it may add in one ledger update and installs a
:class:`RunLedger` on the session. The messages then go through the handler table as any
other (``Session.step``; one execution path): only where their charges go changes. The
session's ``put``, ``put_many``, ``drop`` and ``run_plan`` charge the run's reservation
without the ledger's lock, and the run settles in one update when its last message is
handled, when one fails, or when a charge passes the reservation (that charge, and what
follows, is then made as the message path makes it).

The reservation (the uploads' bytes, each step's declared growth net of the state it writes
in place, the plan's arena once) is checked as every message would be (the peer's cap, the
session's quota, the server's limit); a run that does not fit is not started.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ..engine.executor import Plan, input_check
from ..protocol import messages as m
from ._handlers import plan_matches
from ._state import LimitExceeded, pop_all

if TYPE_CHECKING:
    from ._session import Session

MIN_RUN_STEPS = 2
"""Steps a run must hold to be taken here (one step gains nothing from the batch)."""
MAX_RUN_STEPS = 64
"""Steps one run takes at most: bounds its reservation and how long it holds the session."""
MAX_RUN_SCAN = 1024
"""Queued messages looked at to find a run (a queue of anything else is not rescanned per
message: ``Session.run_skip``)."""

_perf = time.perf_counter


def find_run(s: Session, budget: float | None) -> tuple[int, int, Any, int, Any, float] | None:
    """The run at the head of ``s.queue``: (messages, steps, plan, upload bytes, its first
    ExecuteGraph, loop seconds it spends), or None when there is none worth taking.

    ``budget``: loop seconds left (None: no limit), spent at the plan's last run time per
    step as the message path spends it; on the loop a run ends before the step that does
    not fit (its uploads in), and the scan stops there. The plan is looked up once, and
    only when there are two steps to run."""
    execs: list[tuple[int, Any, int]] = []  # (position, message, upload bytes before it)
    digest = plan = budget_limit = None
    looked = False
    limit = MAX_RUN_STEPS
    cost = 0.0
    n = up_bytes = 0
    for msg in s.queue:
        if type(msg) is m.Upload:
            if msg.bulk_id:
                break
            up_bytes += len(msg.data)
        elif type(msg) is m.ExecuteGraph:
            if digest is None:
                digest = msg.digest
            elif msg.digest != digest:
                break
            elif budget is not None and not looked:  # a second step: what fits the loop
                plan, looked = _plan_for(s, execs[0][1]), True
                if plan is None:
                    break
                if plan.seconds is None:
                    return None  # not timed yet: the message path sends it to a worker
                cost = plan.seconds
                if cost > 0:  # one step more than fits: where the run ends
                    budget_limit = int(budget / cost) + 1
                    limit = min(limit, budget_limit)
            execs.append((n, msg, up_bytes))
            if len(execs) >= limit:
                break
        else:
            break
        n += 1
        if n >= MAX_RUN_SCAN:
            break
    if not execs:  # no run starts before the blocker
        s.run_skip = n
        return None
    cut = budget_limit is not None and len(execs) >= budget_limit
    if len(execs) < MIN_RUN_STEPS and not cut:
        s.run_skip = execs[0][0] + 1  # no run starts up to its only ExecuteGraph
        return None
    fit = len(execs)  # what the budget takes
    if cut and budget_limit is not None:
        fit = min(fit, budget_limit - 1)
    if not looked:
        plan = _plan_for(s, execs[0][1])
    valid = 0  # leading steps that bind as the plan wants
    if plan is not None:
        for _, msg, _ in execs:
            if not plan_matches(plan, msg):
                break
            valid += 1
    if valid < MIN_RUN_STEPS and (valid < len(execs) or not cut):
        # no run starts at any message up to the first ExecuteGraph
        s.run_skip = execs[0][0] + 1
        return None
    if fit < valid:  # the budget ends the run before this step (its uploads in)
        pos, _, up_bytes = execs[fit]
        return (pos, fit, plan, up_bytes, execs[0][1], math.inf) if pos else None
    end, _, up_bytes = execs[valid - 1]
    return end + 1, valid, plan, up_bytes, execs[0][1], valid * cost


def _plan_for(s: Session, msg: m.ExecuteGraph) -> Plan | None:
    """The plan of a run's ExecuteGraph when a run may use it (None: the message path's)."""
    if s.refused and msg.digest.hex() in s.refused:
        return None
    planned = s.planned
    plan = (
        planned[1] if planned is not None and planned[0] is msg else s.state.plan(msg.digest.hex())
    )
    if plan is None or plan.collective or plan.output_bytes is None:
        return None
    return plan


def start_run(s: Session, budget: float | None) -> tuple[int, float]:
    """Reserve the run at the head of the queue and install its ledger (``s.run``):
    (messages it covers, loop seconds they spend); (0, 0.0) when there is none or it does
    not fit the quotas (the message path then takes the queue as it is). The seconds are
    infinite when the loop's budget ended the run: its next step is not the loop's."""
    found = find_run(s, budget)
    if found is None:
        return 0, 0.0
    count, steps, plan, up_bytes, first, spent = found
    arena = plan.peak_bytes if steps else 0
    reserve = up_bytes + steps * growth(plan, first) + arena
    try:
        s.state.reserve_run(s, reserve)
    except LimitExceeded:
        return 0, 0.0
    s.state.note_arena(arena)
    s.run = RunLedger(s, plan, reserve, arena)
    return count, spent


def growth(plan: Plan, msg: Any) -> int:
    """What one step like ``msg`` adds to the store, from the declared shapes: its outputs,
    less the inputs it writes in place (a captured step's state). An estimate for the
    reservation only: every step's actual growth is checked against it as it is stored."""
    if msg is None:
        return 0
    sizes = plan.input_bytes
    if sizes is None:
        shapes, np_dtypes = input_check(plan)
        sizes = plan.input_bytes = [
            math.prod(shape) * dt.itemsize for shape, dt in zip(shapes, np_dtypes)
        ]
    written = set(msg.output_ids)
    replaced = {tid: n for tid, n in zip(msg.input_ids, sizes) if tid in written}
    assert plan.output_bytes is not None  # _plan_for gives a run no other plan
    return max(0, plan.output_bytes - sum(replaced.values()))


class RunLedger:
    """One run's charges: what it stored and dropped, against its reservation, settled in
    one ledger update (``settle``). The session routes its charges here while it is
    ``s.run``."""

    def __init__(self, s: Session, plan: Plan, reserve: int, arena: int) -> None:
        self.s, self.plan, self.reserve = s, plan, reserve
        self.room = reserve - arena
        """What the store may grow by: the rest stays for each step's arena."""
        self.base = s.nbytes
        self.added = self.delta = self.top = 0
        """Tensors and bytes stored so far, net of what was replaced and dropped; the most
        bytes it held at once (the server's peak)."""
        self.limit = s.state.limits.max_tensors

    def run_plan(self, plan: Plan, inputs: list[Any], values: Any, donated: list[int]) -> list:
        """``ServerState.run`` without holding the arena: the reservation holds it."""
        start = _perf()
        outs = self.s.state.executor.run(plan, inputs, values, donated)
        plan.seconds = _perf() - start
        return outs

    def store(self, new: dict[int, Any]) -> bool:
        """Store tensors within the reservation and the tensor count; False (nothing
        stored, the run settled: the caller charges them as the message path does) when
        they do not fit it."""
        store = self.s.store
        get = store.get
        added = delta = 0
        for tid, a in new.items():
            old = get(tid)
            if old is None:
                added += 1
                delta += a.nbytes
            else:
                delta += a.nbytes - old.nbytes
        if self.delta + delta > self.room or (added and len(store) + added > self.limit):
            self.settle()
            return False
        store.update(new)
        self.grew(added, delta)
        return True

    def grew(self, added: int, delta: int) -> None:
        """Count tensors stored by the run (the session's bytes follow at once)."""
        s = self.s
        self.added += added
        self.delta += delta
        if self.delta > self.top:
            self.top = self.delta
        s.nbytes = self.base + self.delta
        if s.nbytes > s.peak:
            s.peak = s.nbytes
        s.run_reserved = self.reserve - max(self.delta, 0)

    def drop(self, ids: Any) -> None:
        """``Session.drop`` inside the run (counted in its settlement)."""
        count, freed = pop_all(self.s.store, ids)
        self.added -= count
        self.delta -= freed
        self.s.nbytes = self.base + self.delta
        self.s.run_reserved = self.reserve - max(self.delta, 0)

    def settle(self) -> None:
        """One ledger update for the whole run: the reservation returned, what it stored
        and dropped charged; the session charges the ledger itself again."""
        s, reserve = self.s, self.reserve
        s.run = None
        s.nbytes = self.base + self.delta
        s.run_reserved = 0
        s.state.settle_run(reserve, self.added, self.delta, self.top)
