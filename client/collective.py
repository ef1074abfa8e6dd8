"""Collectives across devices: ``Group``, ``all_reduce``, ``GroupError``.

A group is an ordered set of devices (ranks). ``all_reduce`` records one op in the graph of
the tensor's device, so a data-parallel step (forward, backward, gradient all-reduce,
optimizer update) is one graph per rank, hashed, cached and replayed like any other.

- Remote devices (``RemoteDevice`` on distinct servers): the client tells every server the
  group (ranks, peers, a one-time capability) over its authenticated session; the servers
  link up along a ring and move the bytes among themselves (a bandwidth-optimal ring over
  their QUIC links; NCCL between GPU servers), never through the client.
- Local replicas (``local_devices(n)``): devices in this process whose graphs run on a
  worker thread each, so every rank reaches the rendezvous concurrently (see ``_replica``).

Every rank must issue the same collectives (shape, dtype, op) in the same order. A rank that
dies, is cut off, is late or disagrees fails the step on every surviving rank with
``GroupError`` naming it -- within seconds, never a hang -- and the group stays failed:
``close()`` it and build a new ``Group`` from the survivors.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from burn_remote.protocol import messages as m
from burn_remote.protocol.messages import LINK_TIMEOUT  # a dead rank goes unnoticed this long

from ._device import Device
from ._group_error import GroupError
from ._replica import ReplicaDevice
from ._tensor import Tensor

RENDEZVOUS_TIMEOUT = float(os.environ.get("BURN_REMOTE_RENDEZVOUS_TIMEOUT", "120"))
"""Default seconds a rank waits at a collective for the others (a rank that is alive but
never arrives: a client that stopped stepping it, or a different sequence of calls). A dead
or cut-off rank is found much sooner, by the links' heartbeats (LINK_TIMEOUT). Local
replicas count it from the missing rank's last progress, so a rank still being recorded or
computing is never late (``engine.collective.local``)."""


def local_devices(n: int, spec: str = "cpu") -> list[Device]:
    """``n`` distinct in-process replicas of device ``spec`` (ranks for tests and laptops);
    each runs its graphs on its own worker thread, in order."""
    if n < 1:
        raise ValueError(f"local_devices: n must be >= 1, got {n}")
    return [ReplicaDevice(spec, k) for k in range(n)]


class Group:
    """An ordered set of devices that run collectives together; rank = position.

    Args:
        devices: all from ``local_devices`` or all ``RemoteDevice``s of distinct servers.
        timeout: seconds a rank waits at a collective for the others (RENDEZVOUS_TIMEOUT).

    Raises:
        ValueError: an empty list, a device listed twice, or local and remote mixed.
        GroupError: (remote) a server could not be set up or could not reach its
            ring neighbour; it names the rank.
    """

    def __init__(self, devices: Sequence[Device], timeout: float | None = None) -> None:
        devices = list(devices)
        if not devices:
            raise ValueError("Group: needs at least one device")
        if len({id(d) for d in devices}) != len(devices):
            raise ValueError("Group: a device is listed twice (each rank needs its own device)")
        self.devices = devices
        self.id = secrets.randbits(63) | 1
        """Random, fixed for the group's life: the ``group`` attribute of its ops."""
        self.timeout = RENDEZVOUS_TIMEOUT if timeout is None else float(timeout)
        self.closed = False
        self._ranks = {id(d): r for r, d in enumerate(devices)}
        if all(isinstance(d, ReplicaDevice) for d in devices):
            self._impl: Any = _LocalImpl(self)
        elif not any(isinstance(d, ReplicaDevice) for d in devices):
            from ._collective_remote import RemoteImpl

            self._impl = RemoteImpl(self)
        else:
            raise ValueError("Group: devices must be all local replicas or all RemoteDevices")
        for dev in devices:  # a read on one rank sends what the others recorded first
            dev._rec.partners[self.id] = [d for d in devices if d is not dev]

    @property
    def size(self) -> int:
        """The number of devices in the group."""
        return len(self.devices)

    def rank(self, device: Device) -> int:
        """The rank of ``device`` (ValueError when it is not in the group)."""
        try:
            return self._ranks[id(device)]
        except KeyError:
            raise ValueError(f"{device!r} is not in this group") from None

    def close(self) -> None:
        """Leave the group on every rank (servers close their links); ranks waiting at a
        collective fail with GroupError. Idempotent."""
        if not self.closed:
            self.closed = True
            self._impl.close()
            for dev in self.devices:
                dev._rec.partners.pop(self.id, None)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Group {self.id:016x} of {self.size}{' (closed)' if self.closed else ''}>"


class _LocalImpl:
    """Local replicas: an in-memory rendezvous (``engine.collective.local``)."""

    def __init__(self, group: Group) -> None:
        from burn_remote.engine.collective.local import LocalGroup

        # (every device is a ReplicaDevice: Group chose this impl for that)
        self.runtimes = [d._rec.runtime for d in group.devices if isinstance(d, ReplicaDevice)]
        names = [rt.name for rt in self.runtimes]
        liveness = [rt.liveness for rt in self.runtimes]
        self.shared = LocalGroup(group.id, names, group.timeout, liveness)
        for rt, member in zip(self.runtimes, self.shared.members):
            rt.groups[group.id] = member

    def close(self) -> None:
        self.shared.close()
        for rt in self.runtimes:
            rt.groups.pop(self.shared.id, None)


def all_reduce(x: Tensor, group: Group, op: str = "mean") -> Tensor:
    """The elementwise sum (``op="sum"``) or mean (``"mean"``) of ``x`` over the group's
    ranks, on ``x``'s device; lazy, like any op. Every rank must call it in the same order
    with the same shape and dtype."""
    from ._ops import call

    if not isinstance(group, Group):
        raise TypeError(f"all_reduce: group must be a collective.Group, got {type(group).__name__}")
    if group.closed:
        raise ValueError(f"all_reduce: {group!r} is closed; build a new Group")
    group.rank(x.device)  # refuses a tensor on a device outside the group
    return call("all_reduce", x, group=group.id, op=op)


def sync(devices: Sequence[Device]) -> None:
    """Submit every device's work first (so all ranks reach their collectives together),
    and what the other ranks of their groups recorded, then wait for each of ``devices``;
    raises the first failure after all have been waited for."""
    first: BaseException | None = None
    waits = submit_all(devices)
    listed = {id(d) for d in devices}
    for d in devices:  # ranks of their groups outside ``devices``: their collectives too
        for partners in list(d._rec.partners.values()):
            for p in partners:
                if id(p) not in listed and not p._rec._held:
                    listed.add(id(p))
                    try:
                        p.flush()
                    except Exception as exc:
                        first = first or exc
    for wait in waits:
        try:
            wait()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


def submit_all(devices: Sequence[Device]) -> list[Callable[[], None]]:
    """Submit what is recorded on every device and return one wait per device (in order;
    each raises that device's failure).

    A RemoteDevice's work and its Sync are queued together and leave as one message, and
    the devices are sent back to back only once every one is queued: no rank's message waits
    for another rank's encoding, and each server answers the Sync as soon as the work is
    done, without a second message (and its wake-up) while its collective runs. A device
    whose submission fails gets a wait that raises that failure (the others still go)."""
    from ._remote import RemoteDevice

    waits: list[Callable[[], None]] = []
    queued = []
    for d in devices:
        try:
            if isinstance(d, RemoteDevice):
                d._rec.flush()
                rid = d._rt._ask(m.Sync, send=False)
                queued.append(d._rt)
                waits.append(functools.partial(d._rt._wait, rid))
            else:  # a local replica runs its graphs on a worker: its wait touches no recorder
                d.flush()
                waits.append(getattr(d._rec.runtime, "wait", None) or _ran)
        except Exception as exc:
            waits.append(functools.partial(_raise, exc))
    for rt in queued:
        rt.send()
    return waits


def _raise(exc: BaseException) -> None:
    raise exc


def _ran() -> None:
    """The wait of a plain local device: its flush ran the graph."""


__all__ = [
    "LINK_TIMEOUT",
    "RENDEZVOUS_TIMEOUT",
    "Group",
    "GroupError",
    "all_reduce",
    "local_devices",
    "submit_all",
    "sync",
]
