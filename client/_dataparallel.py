"""DataParallel: one model trained on several devices, each replica on its shard of the batch.

Read as PyTorch DDP: every device holds a full replica of the parameters and optimizer
state; each step, every replica runs the same captured step (`br.compile`) on its own slice
of the batch; when `backward()` returns the gradients are already averaged across replicas
(an `all_reduce` op inside each replica's graph: the servers sum among themselves, nothing
passes through the client), so the optimizer makes the same update everywhere and the
replicas stay identical. The user's own model and optimizer are rank 0's; `state_dict()` is
one copy.

Unlike DDP there is no process per rank: one client thread records rank 0's step, then rank
1's, ... and each device runs its graph on its own (a server, or a local replica's worker
thread), meeting the others at the all-reduce.

Faults: a replica that dies fails the step on every survivor with the collective's
GroupError naming it. Every `snapshot_every` steps DataParallel waits for the replicas and
keeps a handle on their state (one extra copy on each device, no transfer), so
`rebuild()` can continue from that last good state on the survivors.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._dp_digest import ReplicaDivergence, digests
from ._dp_grads import BUCKET_BYTES
from ._dp_replicate import Replica, adopt, optimizer_params, replicate
from ._dp_shard import split_batch
from ._dp_snapshot import _Snapshot
from ._dp_step import DataParallelStep, _upload
from ._dp_sync import Outcome, wait_all
from ._recorder import epoch

REDUCTIONS = ("mean", "sum")
"""How a replica's loss relates to the whole batch's: a mean over its samples (gradients and
returned values are weighted by shard size) or a sum (they are summed)."""


class DataParallel:
    """Train `model` (and `optimizer`) on every device of `devices` at once.

    Args:
        model: an `nn.Module`; it is moved to `devices[0]` and is rank 0's replica (so
            `model.state_dict()` and `dp.state_dict()` are the same one copy).
        optimizer: an optimizer over `model`'s parameters (or None); each replica gets a
            copy, with the same settings objects (an lr scheduler on it steers all).
        devices: RemoteDevices on distinct servers, or `collective.local_devices(n)`.
        even_shards: refuse batches that do not split evenly (default: shards differ by at
            most one sample and are weighted by their size).
        loss_reduction: "mean" (the step's loss is a mean over its samples: gradients and
            returned values are averaged, weighted by shard size, which equals the whole
            batch's mean) or "sum" (they are summed).
        snapshot_every: wait for the replicas and keep their state every this many steps,
            so `rebuild` can continue from it (None: never; `rebuild` then needs a state).
        bucket_bytes: the largest flat gradient bucket of one all-reduce.
        group_timeout: passed to `collective.Group` (how long a rank waits for the others).
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        devices: Sequence[Any],
        even_shards: bool = False,
        loss_reduction: str = "mean",
        snapshot_every: int | None = 1,
        bucket_bytes: int = BUCKET_BYTES,
        group_timeout: float | None = None,
    ) -> None:
        devices = list(devices)
        _check_devices(devices)
        if loss_reduction not in REDUCTIONS:
            raise ValueError(
                f"loss_reduction: expected one of {REDUCTIONS}, got {loss_reduction!r}"
            )
        if snapshot_every is not None and (type(snapshot_every) is not int or snapshot_every < 1):
            raise ValueError(f"snapshot_every: a positive int or None, got {snapshot_every!r}")
        if optimizer is not None:
            _check_optimizer(model, optimizer)
        self.even_shards = even_shards
        self.loss_reduction = loss_reduction
        self.snapshot_every = snapshot_every
        self.bucket_bytes = bucket_bytes
        self.group_timeout = group_timeout
        model.to(devices[0])
        if optimizer is not None:
            for slots in optimizer.state.values():
                for t in slots.values():
                    if t.device is not devices[0]:
                        t._assign(t.to(devices[0]))
        self._user = Replica(0, devices[0], model, optimizer)
        self.replicas: list[Replica] = [self._user]
        self.replicas += [replicate(model, optimizer, d, r) for r, d in enumerate(devices[1:], 1)]
        self.group = self._make_group(devices)
        self._steps_made: weakref.WeakSet[DataParallelStep] = weakref.WeakSet()
        self._snapshots: list[_Snapshot] | None = None
        self._snapshot_step = 0
        self._mirrored = -1
        self.steps = 0
        """Steps submitted on this group (after `rebuild`: the steps of the state it
        continued from)."""
        self.last_failure: Outcome | None = None
        """What the last failed wait found (errors per rank, the dead ranks)."""
        self._broken = False
        self._needs_state = False

    # --- what users read ------------------------------------------------------------------
    @property
    def module(self) -> Any:
        """Rank 0's model: the model you passed in."""
        return self._user.model

    @property
    def optimizer(self) -> Any:
        """Rank 0's optimizer (the one you passed in), or None."""
        return self._user.optimizer

    @property
    def devices(self) -> list[Any]:
        """The device of each replica, rank 0 first."""
        return [r.device for r in self.replicas]

    @property
    def size(self) -> int:
        """The number of replicas."""
        return len(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def __repr__(self) -> str:
        return f"DataParallel({type(self.module).__name__}, devices={self.devices})"

    def state_dict(self) -> dict[str, np.ndarray]:
        """One copy of the parameters and buffers (rank 0's: every replica holds the same)."""
        return self.module.state_dict()

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The optimizer's state (rank 0's: every replica holds the same)."""
        if self.optimizer is None:
            raise ValueError("this DataParallel has no optimizer")
        return self.optimizer.state_dict()

    def load_state_dict(
        self, state: dict[str, Any], optimizer: dict[str, Any] | None = None
    ) -> None:
        """Load one copy into every replica (and the optimizer state, when given)."""
        for rep in self.replicas:
            rep.model.load_state_dict(state)
            if optimizer is not None and rep.optimizer is not None:
                rep.optimizer.load_state_dict(optimizer)
                for g, mine in zip(self.optimizer.groups, rep.optimizer.groups):
                    mine.settings = g.settings
        self._drop_snapshots()
        self._needs_state = False

    def train(self, mode: bool = True) -> DataParallel:
        """Put every replica in training mode (or eval mode with ``mode=False``)."""
        self.module.train(mode)
        self._mirror()
        return self

    def eval(self) -> DataParallel:
        """Put every replica in eval mode (dropout off)."""
        return self.train(False)

    # --- stepping -------------------------------------------------------------------------
    def compile(self, fn: Callable[..., Any]) -> DataParallelStep:
        """`fn(model, optimizer, *batch)` as a data-parallel captured step (a decorator).

        Call the result with the whole batch as host arrays (NumPy or torch): every array
        argument is split along axis 0, one shard per replica, and uploaded to that
        replica; other arguments (numbers, strings) go to every replica. Each replica runs
        `fn` with its own model, optimizer and shard, captured by `br.compile`. Gradients
        are averaged across replicas when `backward()` returns. The result comes back as
        rank 0's tensors holding the value combined over replicas the way gradients are
        (by default the shard-size-weighted mean: the whole batch's mean loss).
        """
        step = DataParallelStep(self, fn)
        self._steps_made.add(step)
        return step

    def sync(self) -> None:
        """Wait until every replica ran what it was given; raise the failure if one failed
        (a GroupError naming the dead replica, on a fault)."""
        self._settle(snapshot=False)

    def _run(self, step: DataParallelStep, args: tuple, kwargs: dict[str, Any]) -> Any:
        if self._needs_state:
            raise RuntimeError(
                "the replicas hold no good state after rebuild (snapshot_every=None): load "
                "one with dp.load_state_dict(state, optimizer_state) first"
            )
        if self._broken:
            raise RuntimeError(
                "a replica failed (see dp.last_failure); call dp.rebuild() to continue on "
                "the survivors from the last good state"
            )
        every = self.snapshot_every
        if every is not None and (
            self._snapshots is None or self.steps - self._snapshot_step >= every
        ):
            self._settle(snapshot=True)
        if self._mirrored != epoch():
            self._mirror()
        shards = split_batch(args, kwargs, len(self.replicas), self.even_shards)
        results = []
        try:
            for rep, a, kw, n in zip(self.replicas, shards.args, shards.kwargs, shards.sizes):
                weight = n / shards.total if self.loss_reduction == "mean" else 1.0
                run = step._for(rep)
                with _acting(rep.device):  # a long recording is not a late rank
                    results.append(run(_upload(a, rep.device), _upload(kw, rep.device), weight))
        except ConnectionError as exc:  # a replica's server is gone: the step cannot happen
            rank = len(results)
            for rep in self.replicas:
                rep.device._rec.pending = []
            self.last_failure = Outcome({rank: exc}, {rank})
            self._broken = True
            raise _failure(self, self.last_failure) from exc
        except BaseException:
            self._abort(submitted=len(results))
            raise
        self.steps += 1
        return results[0]

    def _abort(self, submitted: int) -> None:
        """A step raised on the client (in the user's step function, usually while rank 0
        records): forget what the replicas recorded, so no all-reduce waits for a partner
        that never comes; if a replica had already sent its step, the group is rebuilt
        around the same devices. With a snapshot of this very step's start the replicas go
        back to it and training can go on; otherwise `rebuild()` is needed."""
        for rep in self.replicas:
            rep.device._rec.pending = []
        if submitted:
            self._close_group()
            wait_all(self.devices)  # the sent steps fail at their all-reduce: drained here
            self.group = self._make_group(self.devices)
            for step in list(self._steps_made):
                step.reset()
        if self._snapshots is not None and self._snapshot_step == self.steps:
            for rep, snap in zip(self.replicas, self._snapshots):
                snap.restore(rep)
        else:
            self._broken = True

    def _settle(self, snapshot: bool) -> None:
        outcome = wait_all(self.devices, self._probe if self.group is not None else None)
        if not outcome.ok:
            self.last_failure = outcome
            self._broken = True
            alive = set(range(len(self.replicas))) - outcome.dead
            if outcome.dead and alive <= outcome.completed and self._snapshots:
                # every survivor ran all it was given before the failure showed (a rank
                # died between steps): their state now is good, the snapshot moves up to it
                for r in alive:
                    self._snapshots[r].release()
                    self._snapshots[r] = _Snapshot(self.replicas[r])
                self._snapshot_step = self.steps
            raise _failure(self, outcome)
        if snapshot:
            self._drop_snapshots()
            self._snapshots = [_Snapshot(r) for r in self.replicas]
            self._snapshot_step = self.steps

    def _probe(self) -> None:
        """One tiny all-reduce on every rank (see `_dp_sync`): it completes once a lagging
        rank catches up, or fails on every survivor naming a rank that died while idle."""
        from . import collective
        from ._autograd import no_grad

        lost: ConnectionError | None = None
        with no_grad():
            for rep in self.replicas:
                try:
                    collective.all_reduce(rep.device.zeros((1,)), self.group, "sum")
                    rep.device.flush()
                except ConnectionError as exc:  # its connection is gone already
                    rep.device._rec.pending = []
                    lost = lost or exc
        if lost is not None:
            raise lost

    def _drop_snapshots(self) -> None:
        for snap in self._snapshots or ():
            snap.release()
        self._snapshots = None

    def _mirror(self) -> None:
        """Copy rank 0's train/eval modes and requires_grad flags to every replica (a user
        calling `model.eval()` or freezing a layer on rank 0 must not split the replicas)."""
        mods = [m for _, m in self.module.named_modules()]
        flags = [t.requires_grad for _, t in self.module.named_tensors()]
        for rep in self.replicas[1:]:
            for mine, m in zip(mods, (m for _, m in rep.model.named_modules())):
                m.training = mine.training
            for flag, (_, t) in zip(flags, rep.model.named_tensors()):
                if t.requires_grad != flag:
                    t.requires_grad_(flag)
                    if not flag:
                        t.grad = None
        self._mirrored = epoch()

    # --- checking and recovering ----------------------------------------------------------
    def check_in_sync(self, optimizer: bool = True) -> str:
        """Compare every replica's parameters and buffers (and optimizer state) with rank
        0's, bit for bit; returns rank 0's digest (sha256 hex).

        Each replica's tensors are read in one transfer per dtype (a full copy of the model
        per replica crosses the network: a check, not something to run every step).

        Raises:
            ReplicaDivergence: names the first replica (rank, device) and tensor that differ.
        """
        self._settle(snapshot=False)
        ref = digests(self.replicas[0], optimizer)
        for rep in self.replicas[1:]:
            mine = digests(rep, optimizer)
            for (name, a), (_, b) in zip(ref, mine):
                if a != b:
                    raise ReplicaDivergence(
                        f"replica rank {rep.rank} on {rep.device} has diverged from rank 0: "
                        f"{name} differs (sha256 {b[:12]}... vs {a[:12]}...)",
                        rep.rank,
                        rep.device,
                        name,
                    )
        h = hashlib.sha256()
        for name, d in ref:
            h.update(name.encode() + bytes.fromhex(d))
        return h.hexdigest()

    def survivors(self) -> list[Any]:
        """The devices that did not fail in the last failure (waits for the replicas if no
        failure was seen yet)."""
        outcome = self.last_failure
        if outcome is None:
            outcome = wait_all(self.devices, self._probe if self.group is not None else None)
            if not outcome.ok:
                self.last_failure, self._broken = outcome, True
        return [r.device for r in self.replicas if r.rank not in outcome.dead]

    def rebuild(self, devices: Sequence[Any] | None = None) -> None:
        """Continue on `devices` (default: the survivors of the last failure), which must be
        replicas of this group, from the last good state (the snapshot DataParallel took;
        every survivor holds the same one). The new group keeps the survivors' rank order;
        if rank 0 died, your model and optimizer objects now live on the new rank 0. The
        steps after the snapshot are not applied anywhere: `dp.steps` says where to resume.

        Raises:
            ValueError: a device that is not one of this group's replicas, or none left.
            RuntimeError: no good state is held (snapshot_every=None): load one with
                `load_state_dict` after rebuilding with `devices` given.
        """
        keep_devices = self.survivors() if devices is None else list(devices)
        if not keep_devices:
            raise ValueError("rebuild: no device left to continue on")
        _check_devices(keep_devices)
        by_dev = {id(r.device): r for r in self.replicas}
        for d in keep_devices:
            if id(d) not in by_dev:
                raise ValueError(
                    f"rebuild: {d} is not a replica of this DataParallel (its devices: "
                    f"{self.devices}); rebuild continues on survivors only"
                )
        keep = [r for r in self.replicas if any(r.device is d for d in keep_devices)]
        if self._snapshots is None:
            if self._broken and devices is None:
                raise RuntimeError(
                    "rebuild: no good state is held (snapshot_every=None and a step failed); "
                    "rebuild with devices=..., then load a checkpoint with load_state_dict"
                )
            self._needs_state = self._broken
        else:
            for r in keep:
                self._snapshots[r.rank].restore(r)
            self.steps = self._snapshot_step
        if keep[0] is not self._user:
            adopt(self._user, keep[0])
            keep[0] = self._user
        self._close_group()
        wait_all([r.device for r in keep])  # the old group's failed steps: drained, not raised
        for rank, r in enumerate(keep):
            r.rank = rank
        self.replicas = keep
        self._drop_snapshots()
        self.group = self._make_group(self.devices)
        for step in list(self._steps_made):
            step.reset()
        self._broken = False
        self.last_failure = None

    def close(self) -> None:
        """Close the group (the devices stay open)."""
        self._close_group()
        for step in list(self._steps_made):
            step.reset()

    # --- internals ------------------------------------------------------------------------
    def _make_group(self, devices: list[Any]) -> Any:
        if len(devices) == 1:
            return None  # one replica: nothing to reduce with
        from . import collective

        if self.group_timeout is None:
            return collective.Group(devices)
        return collective.Group(devices, timeout=self.group_timeout)

    def _close_group(self) -> None:
        group, self.group = getattr(self, "group", None), None
        if group is not None:
            try:
                group.close()
            except Exception:  # a group with a dead member may not close cleanly
                pass


def _acting(device: Any) -> Any:
    """While the client records a local replica's step, that replica is working (its group's
    rendezvous waits for it); a server shows it is alive by its links' heartbeats."""
    acting = getattr(device, "acting", None)
    return acting() if acting is not None else contextlib.nullcontext()


def _check_devices(devices: list[Any]) -> None:
    from ._device import Device

    if not devices:
        raise ValueError("DataParallel needs at least one device")
    for k, d in enumerate(devices):
        if not isinstance(d, Device):
            raise TypeError(f"devices[{k}] is a {type(d).__name__}, not a Device/RemoteDevice")
        for j in range(k):
            if devices[j] is d:
                raise ValueError(
                    f"devices[{j}] and devices[{k}] are the same device {d}: each replica needs "
                    "a device of its own (for local replicas: collective.local_devices(n))"
                )


def _check_optimizer(model: Any, optimizer: Any) -> None:
    own = {id(t) for _, t in model.named_tensors()}
    for p in optimizer_params(optimizer):
        if id(p) not in own:
            raise ValueError(
                f"the optimizer holds a {p.dtype}{list(p.shape)} tensor that is not a parameter "
                "of the model: DataParallel replicates the model's parameters and the optimizer "
                "over them"
            )


def _failure(dp: DataParallel, outcome: Outcome) -> BaseException:
    """The error to raise, with a note of what DataParallel saw and how to go on: a
    survivor's GroupError (it names the culprit) when there is one; a GroupError naming the
    rank when only its own connection failed (nobody was in a collective with it yet)."""
    from . import collective

    errors = outcome.errors
    first: BaseException | None = next(
        (e for e in errors.values() if isinstance(e, collective.GroupError)), None
    )
    dead = sorted(outcome.dead)
    if first is None and dead:
        rank = dead[0]
        dev = dp.replicas[rank].device
        peer = getattr(dev, "peer_id", f"local:{rank}")
        gid = dp.group.id if dp.group is not None else 0
        first = collective.GroupError(
            f"group {gid:016x}: rank {rank} ({peer}): its connection was lost: {errors[rank]}",
            gid,
            rank,
            peer,
        )
    if first is None:
        first = errors[min(errors)]
    for r, exc in sorted(errors.items()):  # a rank's own failure behind a survivor's error
        if exc is not first and not isinstance(exc, collective.GroupError):
            text = str(exc).strip().splitlines()
            first.add_note(
                f"rank {r} ({dp.replicas[r].device}) itself failed with "
                f"{type(exc).__name__}: {text[0] if text else ''}"
            )
    if dead:
        alive = [f"rank {r.rank} ({r.device})" for r in dp.replicas if r.rank not in outcome.dead]
        first.add_note(
            f"DataParallel: rank(s) {dead} failed; survivors: {', '.join(alive) or 'none'}. "
            "dp.rebuild() continues on the survivors from the last good state "
            f"(step {dp._snapshot_step})."
        )
    else:
        first.add_note(
            f"DataParallel: the step failed on rank(s) {sorted(errors)}; dp.rebuild(dp.devices) "
            f"continues from the last good state (step {dp._snapshot_step})."
        )
    return first


__all__ = ["DataParallel", "DataParallelStep", "ReplicaDivergence"]
