"""Groups of RemoteDevices: the client only sets the group up; the servers move the bytes.

Set-up is two rounds over the client's authenticated sessions, each sent to every server
before any answer is awaited: ``GroupSetup`` (rank, every rank's peer id, a one-time random
capability; each server answers with its device and from then on admits its two ring
neighbours for a group link), then ``GroupStart`` (the engine: NCCL when every rank is a
CUDA server, else the ring), answered once both of a server's ring links are up. A server
that cannot be set up or linked fails the constructor with a GroupError naming its rank,
and the group is closed on every server.
"""

from __future__ import annotations

import secrets
from typing import Any

from burn_remote.protocol import messages as m

from ._group_error import GroupError, group_error
from ._recorder import OpFailed


class RemoteImpl:
    """A collective group over RemoteDevices, one rank per server: sets the group up on every
    server (GroupSetup, then GroupStart with "nccl" when every rank is CUDA, else "ring") and
    raises a GroupError naming the first rank that failed, after closing what was set up."""

    def __init__(self, group: Any) -> None:
        from ._remote import RemoteDevice

        devices = group.devices
        for d in devices:
            if not isinstance(d, RemoteDevice):
                raise ValueError(f"Group: {d!r} is neither a local replica nor a RemoteDevice")
        peers = tuple(d.peer_id for d in devices)
        if len(set(peers)) != len(peers):
            raise ValueError("Group: two devices are the same server (one rank per server)")
        self.group, self.devices = group, devices
        self.id = group.id
        capability = secrets.token_bytes(32)
        timeout_ms = max(1, int(group.timeout * 1000))
        try:
            kinds = self._round(lambda r: (m.GroupSetup, self.id, r, peers, capability, timeout_ms))
            devices_kinds = [k.device for k in kinds]
            engine = "nccl" if all(k.startswith("cuda") for k in devices_kinds) else "ring"
            self.engine = engine
            self._round(lambda r: (m.GroupStart, self.id, engine))
        except BaseException:
            self.close()
            raise

    def _round(self, request: Any) -> list[Any]:
        """Send one request to every rank, then wait for every answer; the first failure
        (by rank) is raised as a GroupError naming that rank."""
        asked = []
        for r, d in enumerate(self.devices):
            d._rec.flush()
            asked.append(d._rt._ask(*request(r)))
        replies, first = [], None
        for r, (d, rid) in enumerate(zip(self.devices, asked)):
            try:
                replies.append(d._rt._wait(rid))
            except GroupError as exc:
                first = first or exc
            except (OpFailed, ConnectionError) as exc:
                first = first or GroupError(
                    f"group {self.id:016x}: rank {r} ({d.peer_id}): {exc}", self.id, r, d.peer_id
                )
        if first is not None:
            raise first
        return replies

    def close(self) -> None:
        """Tell every rank's server that the group is over (GroupClose, queued and sent without
        waiting), skipping devices whose connection is already gone; the servers free its links."""
        for d in self.devices:
            rt = d._rt
            if rt.failed:
                continue
            with rt.cond:
                rt.proto._queue(m.GroupClose(self.id))
            rt.send()


__all__ = ["RemoteImpl", "group_error"]
