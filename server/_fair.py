"""Fair shares of the engine: weighted fair queuing over peers and jobs (issue 35).

Engine work (a session's steps placed on an engine worker, a job's plan runs) takes a *turn*
from ``FairShare`` before it runs and gives back the engine seconds it used after. At most
``slots`` turns run at once; when more are asked for, the next goes to the waiting *flow*
that has had the least engine time per unit of weight (its virtual time), the time charged
as measured after each turn (nobody knows a step's cost before it runs; a turn is charged
an estimate while it runs, the flow's last turn, so several slots do not all go to one
flow). A flow is one peer (all its sessions: opening more sessions buys no more engine) or
one job. Jobs weigh ``JOB_WEIGHT``: they run below interactive sessions and are never
starved. A flow that was idle comes back at most one SLICE behind the busy ones: idling
banks no more credit; a debt (long turns while others waited) is kept.

A session's turn ends after ``SLICE`` seconds of engine work (``Session.step``'s slice), at
a message boundary, so a peer that queued seconds of work waits its turn again between
slices instead of holding the engine. A flow that still has work when its turn ends asks
for the next in the same breath (``finish(more=True)``), so the gap before its next request
is not a free turn for the others. The loop's inline work (a step under ``INLINE_BUDGET``)
runs outside the turns, except while a *heavy* turn runs (``heavy``: one whose flow's last
turn took over HEAVY_TURN): then it goes to a worker and waits in fair order. Beside such a
turn on the CPU, its products waited inside OpenBLAS for the turn's, with the loop and every
session on it stalled (89 ms measured beside a 1024² matmul flood); beside light turns it
keeps the loop's throughput (taking a turn for every inline step cut bench/load.py's 50
sessions from ~380 to ~255 steps/s). Work that cannot wait for a turn (a group's collective
graphs, which wait on their other ranks) runs outside.

A turn also gives way *inside* a message, between two steps of a graph
(``engine/preempt``'s checkpoints, ``HeldTurn``): once it has run ``YIELD_AFTER`` and a
flow behind it in virtual time waits, it finishes there, asks again at once and waits in
fair order, so a peer's seconds-long graph or a job's plan no longer holds the engine to
its end. One step is never cut.

The bound: while two flows both wait, the engine seconds each received divided by its
weight differ by at most one turn's (``SLICE``, or one plan step that is longer).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from ..engine.preempt import checkpoints

SLOTS_ENV = "BURN_REMOTE_ENGINE_SLOTS"
CPU_SLOTS = 1
"""Engine turns at once on the CPU engine. It parallelises inside a step (OpenBLAS and the
engine's pool use every core), and OpenBLAS runs one threaded product at a time: a second
turn's product waits inside OpenBLAS until the first one's ends, with no order at all.
Measured on 2 cores: a 64x64x128 product beside a loop of 1024² products took 20 us at the
median but 4-50 ms at the tail, and a benign peer's captured-MLP step beside a flood of
1024² matmuls took 88 ms at the median with two slots, 24 ms with one (bench/flood.py)."""
DEVICE_SLOTS = 2
"""Engine turns at once on a GPU: one turn's host work (launches, its Python) overlaps the
other's kernels."""


def engine_slots(device: str) -> int:
    """Turns at once for a server on ``device``: ``BURN_REMOTE_ENGINE_SLOTS`` when set, else
    CPU_SLOTS on the CPU and DEVICE_SLOTS on a GPU."""
    told = os.environ.get(SLOTS_ENV)
    if told:
        return max(1, int(told))
    return CPU_SLOTS if device.split(":")[0] == "cpu" else DEVICE_SLOTS


ENGINE_SLOTS = engine_slots("cpu")
"""The default of a ``FairShare`` made without a device (tests, tools)."""

SLICE = 0.010
"""Engine seconds a session's turn may run before it goes back to the queue (at least one
message: a graph is not cut)."""

SESSION_WEIGHT = 1.0
"""Weight of a peer's sessions."""

JOB_WEIGHT = 0.25
"""Weight of a job: a job backlogged beside one busy peer gets a fifth of the engine."""

HEAVY_TURN = 0.002
"""A running turn whose flow's last turn took longer than this keeps the network loop's
inline steps off the engine (``FairShare.heavy``)."""

YIELD_AFTER = 0.001
"""Engine seconds a turn runs before it gives way at a step boundary to a flow behind it
(``HeldTurn.checkpoint``): each hand-over costs a thread switch (100-150 us here), so two
busy flows do not trade the engine step by step."""

HALF_LIFE = 10.0
"""Seconds over which a flow's recent engine time halves (the ``share`` shown)."""

Wake = Callable[[], None]


class Ticket:
    """One turn asked for: granted (then running) or waiting in its flow's queue."""

    __slots__ = ("flow", "granted", "done", "heavy", "_wake")

    def __init__(self, flow: _Flow, wake: Wake | None) -> None:
        self.flow = flow
        self.granted = False
        self.heavy = False
        """Granted as a heavy turn (counted in ``FairShare.heavy`` while it runs)."""
        self.done = False
        """Finished or cancelled: a second finish or cancel does nothing."""
        self._wake = wake


class _Flow:
    """One peer's or job's account: its virtual time, its waiting turns, what it used."""

    __slots__ = ("key", "kind", "weight", "vtime", "waiting", "running", "estimate", "seconds",
                 "turns", "recent", "stamp", "order")  # fmt: skip

    def __init__(self, key: str, kind: str, weight: float) -> None:
        self.key, self.kind, self.weight = key, kind, weight
        self.vtime = 0.0
        """Engine seconds used per unit of weight, with running turns charged ``estimate``."""
        self.waiting: deque[Ticket] = deque()
        self.running = 0
        self.estimate = 0.0
        """What a running turn is charged until it finishes: the flow's last turn."""
        self.seconds = 0.0
        """Engine seconds used since the flow appeared."""
        self.turns = 0
        self.recent = 0.0
        """Engine seconds used, decayed with HALF_LIFE as of ``stamp``."""
        self.stamp = 0.0
        self.order = 0
        """When it last started waiting or ran (ties go to the one waiting longest)."""


class FairShare:
    """The engine's turns, handed out by weighted fair queuing (thread-safe: the network
    loop, engine workers and the job runner all ask and finish)."""

    def __init__(self, slots: int = ENGINE_SLOTS, clock: Callable[[], float] = time.monotonic):
        if slots < 1:
            raise ValueError(f"FairShare needs slots >= 1, got {slots}")
        self.slots, self._clock = slots, clock
        self.busy = 0
        self.heavy = 0
        """Running turns whose flow's last turn took over HEAVY_TURN (read without the lock:
        the network loop keeps its inline steps off the engine while it is not 0)."""
        self._lock = threading.Lock()
        self._flows: dict[str, _Flow] = {}
        self._queued: set[_Flow] = set()
        """Flows with waiting turns."""
        self._vnow = 0.0
        """Virtual time where the last turn started (a new or idle flow starts near it)."""
        self._ticks = 0

    # --- asking and finishing ---------------------------------------------------------------
    def ask(self, key: str, kind: str, weight: float, wake: Wake | None = None) -> Ticket:
        """A turn for flow ``key``: granted at once when a slot is free and nobody waits,
        else queued; ``wake`` is called (from whichever thread grants it) once it is."""
        with self._lock:
            flow = self._flows.get(key)
            if flow is None:
                flow = self._flows[key] = _Flow(key, kind, weight)
            ticket = Ticket(flow, wake)
            if self.busy < self.slots and not self._queued:
                self._wakes_up(flow)
                self._start(ticket)
            else:
                self._queue(ticket)
        return ticket

    def finish(self, ticket: Ticket, seconds: float, more: bool = False) -> Ticket | None:
        """End a granted turn that used ``seconds`` of engine time; with ``more`` the flow
        asks for its next turn in the same step (returned, maybe already granted), so it
        keeps its place."""
        flow = ticket.flow
        with self._lock:
            if ticket.done or not ticket.granted:
                return None
            ticket.done = True
            self._charge(flow, seconds)
            flow.running -= 1
            self.busy -= 1
            self.heavy -= ticket.heavy
            again = None
            if more:
                again = Ticket(flow, None)
                self._queue(again, fresh=False)
            wakes = self._grant()
        for wake in wakes:
            wake()
        return again

    def cancel(self, ticket: Ticket) -> None:
        """Give up a turn: a waiting one leaves its queue, a granted one is finished unused."""
        with self._lock:
            if ticket.done:
                return
            if not ticket.granted:
                ticket.done = True
                flow = ticket.flow
                try:
                    flow.waiting.remove(ticket)
                except ValueError:
                    return
                if not flow.waiting:
                    self._queued.discard(flow)
                return
        self.finish(ticket, 0.0)

    def set_wake(self, ticket: Ticket, wake: Wake) -> bool:
        """Attach the callback of a ticket queued by ``finish(more=True)``; False when it is
        already granted (then nothing will call it)."""
        with self._lock:
            if ticket.granted:
                return False
            ticket._wake = wake
            return True

    def forget(self, key: str) -> None:
        """Drop an idle flow's account (its peer's last session ended, its job ended)."""
        with self._lock:
            flow = self._flows.get(key)
            if flow is not None and not flow.waiting and not flow.running:
                del self._flows[key]

    # --- blocking and trio front ends -------------------------------------------------------
    def run(self, key: str, kind: str, weight: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the caller's thread once a turn is granted, charged its time;
        its plan runs give way between steps (``HeldTurn``)."""
        event = threading.Event()
        ticket = self.ask(key, kind, weight, event.set)
        if not ticket.granted:
            event.wait()
        held = HeldTurn(self, ticket)
        try:
            with checkpoints(held.checkpoint):
                return fn(*args)
        finally:
            held.end()

    def outranked(self, ticket: Ticket, used: float) -> bool:
        """Whether another flow waits that is behind ``ticket``'s flow in virtual time, the
        running turn charged the ``used`` seconds it has run so far (at least its estimate):
        the turn should give way."""
        flow = ticket.flow
        with self._lock:
            vtime = flow.vtime + max(0.0, used - flow.estimate) / flow.weight
            return any(f is not flow and f.vtime < vtime for f in self._queued)

    async def wait(self, ticket: Ticket) -> None:
        """Wait (in trio) until ``ticket`` is granted; cancelled, the ticket is cancelled."""
        import trio

        if ticket.granted:
            return
        event = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake() -> None:  # from whichever thread grants it
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(event.set)

        if not self.set_wake(ticket, wake):
            return
        try:
            await event.wait()
        except BaseException:
            self.cancel(ticket)
            raise

    # --- what operators see -----------------------------------------------------------------
    def shares(self) -> dict[str, Any]:
        """Slots, and per flow: kind, weight, engine seconds and turns used, turns waiting,
        and ``share``: its part of the engine time used lately (decayed, HALF_LIFE)."""
        now = self._clock()
        with self._lock:
            flows = [
                (f, f.recent * 0.5 ** ((now - f.stamp) / HALF_LIFE)) for f in self._flows.values()
            ]
            total = sum(r for _, r in flows)
            return {
                "slots": self.slots,
                "busy": self.busy,
                "slice_s": SLICE,
                "flows": [
                    {
                        "flow": f.key,
                        "kind": f.kind,
                        "weight": f.weight,
                        "seconds": round(f.seconds, 6),
                        "turns": f.turns,
                        "waiting": len(f.waiting),
                        "running": f.running,
                        "share": round(r / total, 4) if total > 0 else 0.0,
                    }
                    for f, r in sorted(flows, key=lambda fr: fr[0].key)
                ],
            }

    # --- under the lock ---------------------------------------------------------------------
    def _wakes_up(self, flow: _Flow) -> None:
        """A flow with nothing waiting or running comes back no further than SLICE (per
        weight) behind the virtual time of the busy flows (where their running turns
        started), or, when none is busy, behind the virtual time of the last turn started
        (``_vnow``): idling banks at most one slice of credit, and a new flow starts level
        with the others, not at 0 (it would otherwise hold the engine until it had caught up
        with everything the old flows ever used). Ahead of it (a debt: its last turns ran
        while the others waited) it stays, so a job that asks turn by turn, with its own
        work between, still gets only its weight's share."""
        if flow.waiting or flow.running:
            return
        busy = [
            f.vtime - f.running * f.estimate / f.weight
            for f in self._flows.values()
            if f.waiting or f.running
        ]
        now = min(busy) if busy else self._vnow
        flow.vtime = max(flow.vtime, now - SLICE / flow.weight)

    def _start(self, ticket: Ticket) -> None:
        flow = ticket.flow
        ticket.granted = True
        ticket.heavy = flow.estimate > HEAVY_TURN
        self.heavy += ticket.heavy
        flow.running += 1
        self._vnow = max(self._vnow, flow.vtime)
        flow.vtime += flow.estimate / flow.weight
        self._ticks += 1
        flow.order = self._ticks
        self.busy += 1

    def _queue(self, ticket: Ticket, fresh: bool = True) -> None:
        """``fresh``: not the next turn of a flow that just ran (``finish(more=True)``)."""
        flow = ticket.flow
        if not flow.waiting:
            if fresh:
                self._wakes_up(flow)
            self._queued.add(flow)
            self._ticks += 1
            flow.order = self._ticks
        flow.waiting.append(ticket)

    def _charge(self, flow: _Flow, seconds: float) -> None:
        now = self._clock()
        flow.vtime += (seconds - flow.estimate) / flow.weight
        flow.estimate = seconds
        flow.seconds += seconds
        flow.turns += 1
        flow.recent = flow.recent * 0.5 ** ((now - flow.stamp) / HALF_LIFE) + seconds
        flow.stamp = now

    def _grant(self) -> list[Wake]:
        """Start waiting turns while slots are free, each time the waiting flow with the
        least virtual time (ties: the one waiting longest)."""
        wakes: list[Wake] = []
        queued = self._queued
        while self.busy < self.slots and queued:
            flow = min(queued, key=_rank)
            ticket = flow.waiting.popleft()
            if not flow.waiting:
                queued.discard(flow)
            self._start(ticket)
            if ticket._wake is not None:
                wakes.append(ticket._wake)
        return wakes


class HeldTurn:
    """A granted turn on an engine thread, which gives way at the engine's checkpoints
    (``engine/preempt``): after YIELD_AFTER, when a flow behind it waits, the turn is
    finished there with its next one asked in the same breath (``finish(more=True)``) and
    the thread waits for it. ``ticket`` is the turn held now; ``end`` finishes it."""

    __slots__ = ("fair", "ticket", "start")

    def __init__(self, fair: FairShare, ticket: Ticket) -> None:
        self.fair, self.ticket = fair, ticket
        self.start = time.perf_counter()

    def checkpoint(self) -> None:
        fair = self.fair
        if not fair._queued:  # nobody waits (read without the lock: a hint, checked below)
            return
        used = time.perf_counter() - self.start
        if used < YIELD_AFTER or not fair.outranked(self.ticket, used):
            return
        again = fair.finish(self.ticket, used, more=True)
        if again is None:  # finished elsewhere (cancelled): nothing to hold
            return
        if not again.granted:
            event = threading.Event()
            if fair.set_wake(again, event.set):
                event.wait()
        self.ticket, self.start = again, time.perf_counter()

    def end(self, more: bool = False) -> Ticket | None:
        """Finish the turn held now, charged its time since it was granted (``more``: as
        ``FairShare.finish``)."""
        return self.fair.finish(self.ticket, time.perf_counter() - self.start, more)


def _rank(flow: _Flow) -> tuple[float, int]:
    return flow.vtime, flow.order


__all__ = ["CPU_SLOTS", "DEVICE_SLOTS", "ENGINE_SLOTS", "HEAVY_TURN", "JOB_WEIGHT",
           "SESSION_WEIGHT", "SLICE", "YIELD_AFTER", "FairShare", "HeldTurn", "Ticket",
           "engine_slots"]  # fmt: skip
