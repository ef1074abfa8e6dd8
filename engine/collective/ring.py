"""The ring all-reduce, sans I/O: who sends which chunk when, and what a received piece does.

Bandwidth-optimal (each rank sends and receives 2 (n - 1) / n of the tensor, whatever n is):
the tensor is cut into n chunks; in n - 1 *reduce-scatter* steps every rank sends one chunk
to its successor and adds the chunk it receives from its predecessor into its own copy, so
that afterwards rank r holds chunk (r + 1) mod n summed over all ranks; in n - 1
*all-gather* steps those finished chunks travel once around the ring, overwriting. Each
element is summed by exactly one rank and then copied, so every rank ends bit-identical.

Chunks move in pieces of at most ``PIECE_BYTES`` and a rank forwards piece p of step k as
soon as it has received (and reduced) piece p of step k - 1 -- the chunk it sends at step k
is always the one it received at step k - 1 -- so the ring is pipelined: a large chunk does
not cross one hop whole before the next hop starts. ``simulate`` runs this schedule in
memory (the unit tests check it against NumPy); the server's link driver runs the same
functions over QUIC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PIECE_BYTES = 1024 * 1024
"""Largest piece of a chunk sent as one frame (the unit of pipelining); equal to the bulk
chunk, so a piece is one frame on the servers' links."""


def chunk_bounds(count: int, size: int) -> list[tuple[int, int]]:
    """``size`` contiguous element ranges covering ``count``, lengths differing by at most 1
    (some are empty when ``count < size``)."""
    base, extra = divmod(count, size)
    bounds, start = [], 0
    for k in range(size):
        stop = start + base + (k < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True, slots=True)
class Step:
    send: int
    """Chunk this rank sends to its successor."""
    receive: int
    """Chunk it receives from its predecessor."""
    reduce: bool
    """Add the received piece into ours (reduce-scatter) or overwrite (all-gather)."""


def schedule(rank: int, size: int) -> list[Step]:
    """The 2 (size - 1) steps of ``rank``; step k sends what step k - 1 received."""
    steps = [Step((rank - s) % size, (rank - s - 1) % size, True) for s in range(size - 1)]
    steps += [Step((rank + 1 - s) % size, (rank - s) % size, False) for s in range(size - 1)]
    return steps


def pieces(
    lo: int, hi: int, itemsize: int, piece_bytes: int = PIECE_BYTES
) -> list[tuple[int, int]]:
    """Element ranges of at most ``piece_bytes`` covering ``lo..hi`` (none when empty)."""
    per = max(1, piece_bytes // itemsize)
    return [(a, min(a + per, hi)) for a in range(lo, hi, per)]


@dataclass(frozen=True, slots=True)
class Plan:
    """One rank's ring all-reduce of a flat tensor of ``count`` elements."""

    rank: int
    size: int
    count: int
    itemsize: int
    piece_bytes: int = PIECE_BYTES

    @property
    def steps(self) -> list[Step]:
        return schedule(self.rank, self.size)

    def ranges(self, chunk: int) -> list[tuple[int, int]]:
        lo, hi = chunk_bounds(self.count, self.size)[chunk]
        return pieces(lo, hi, self.itemsize, self.piece_bytes)

    def sends(self) -> list[tuple[int, int, int]]:
        """(step, lo, hi) of every piece this rank sends, in order."""
        return [(k, a, b) for k, st in enumerate(self.steps) for a, b in self.ranges(st.send)]

    def receives(self) -> list[tuple[int, int, int, bool]]:
        """(step, lo, hi, reduce) of every piece this rank receives, in order."""
        return [
            (k, a, b, st.reduce)
            for k, st in enumerate(self.steps)
            for a, b in self.ranges(st.receive)
        ]


def apply(
    acc: np.ndarray, lo: int, hi: int, data: np.ndarray, reduce: bool, base: np.ndarray
) -> None:
    """A received piece: ``acc[lo:hi] = base[lo:hi] + data`` (reduce-scatter) or ``= data``
    (all-gather), written straight into the result, with no temporary.

    ``base`` is this rank's own input: every chunk is received exactly once during the
    reduce-scatter, so its local value is still the input's then, and the result needs no
    initial copy of the input (the chunk sent at step 0 is read from the input itself, and
    the result's copy of it arrives in the all-gather)."""
    if reduce:
        np.add(base[lo:hi], data, out=acc[lo:hi])
    else:
        acc[lo:hi] = data


def source(step: int, x: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Where the pieces sent at ``step`` are read: the input at step 0 (that chunk is not
    in the result yet), the result afterwards (what the previous step received)."""
    return x if step == 0 else acc


def finish(acc: np.ndarray, op: str, size: int) -> np.ndarray:
    """The sum becomes the mean (every rank divides the same bits the same way)."""
    if op == "mean":
        np.divide(acc, acc.dtype.type(size), out=acc)
    return acc


def simulate(
    arrays: Sequence[np.ndarray], op: str = "sum", piece_bytes: int = PIECE_BYTES
) -> list[np.ndarray]:
    """Run the ring among ``len(arrays)`` ranks in memory, piece by piece in lock step."""
    size = len(arrays)
    xs = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    if size == 1:
        return [finish(xs[0].copy(), op, 1).reshape(np.shape(arrays[0]))]
    accs = [np.empty_like(x) for x in xs]
    plans = [Plan(r, size, xs[0].size, xs[0].itemsize, piece_bytes) for r in range(size)]
    for k in range(2 * (size - 1)):
        # every rank's sends of step k first (what it holds after step k - 1), then applied
        sent = [
            [
                source(k, xs[r], accs[r])[a:b].copy()
                for a, b in plans[r].ranges(plans[r].steps[k].send)
            ]
            for r in range(size)
        ]
        for r in range(size):
            st = plans[r].steps[k]
            for (a, b), data in zip(plans[r].ranges(st.receive), sent[(r - 1) % size]):
                apply(accs[r], a, b, data, st.reduce, xs[r])
    return [finish(acc, op, size).reshape(np.shape(arrays[0])) for acc in accs]


__all__ = ["PIECE_BYTES", "Plan", "Step", "apply", "chunk_bounds", "finish", "pieces",
           "schedule", "simulate", "source"]  # fmt: skip
