"""The servers a data-parallel training job trains on, and what it does when one is lost.

A job that names ``devices`` runs ``burn_remote.DataParallel`` with this server as its
client: the data and the one checkpoint stay here, the replicas live on the named servers
(which must authorise this server's peer id), and the gradients are all-reduced among them.
Each server is reached before training starts, at the addresses this server resolves itself,
so a server that is down or unknown here fails the job at once with the spec's key path,
not halfway through.

A server lost *during* training (killed, cut off: the survivors' GroupError names it) does
not end the job by default: like ``dp.rebuild()`` for an interactive user, the job drops it,
logs which server and why, and continues on the survivors from the last state they all hold
(DataParallel keeps it on the devices at every step), redoing the step that failed. Every
replica count computes the whole batch's gradient, so the job ends as one server training on
the whole batch would, up to the rounding of a different summation order. A spec with
``require_all_devices = true`` fails instead, naming the server. The same holds when the
coordinator resumes from its checkpoint after a restart: the servers it can still reach
carry on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class DeviceUnreachable(ConnectionError):
    """A server named in ``devices`` could not be reached; names its key path."""


class DeviceLost(ConnectionError):
    """A server named in ``devices`` was lost mid-way and the spec requires all of them."""


def connect_devices(
    targets: list[str],
    key_path: Path | None,
    candidates: Callable[[str], Iterator[str]],
    dropped: list[tuple[int, str]] | None = None,
) -> list[Any]:
    """One RemoteDevice per target peer id, each answering a Sync (so it is up and admits
    us). ``candidates(peer)`` gives the ``PEER@HOST:PORT`` texts to try, in order: the
    addresses this server resolves itself (``server._peers.dial_targets``).

    With ``dropped`` given, a server that cannot be reached is left out and ``(k, why)``
    appended there (at least one must answer); without it, it fails the whole call."""
    from burn_remote import RemoteDevice

    devices: list[Any] = []
    try:
        for k, target in enumerate(targets):
            tried: list[str] = []
            for where in candidates(target):
                try:
                    dev = RemoteDevice(where, key=key_path)
                    dev.sync()
                except Exception as exc:
                    tried.append(f"{type(exc).__name__}: {exc}")
                    continue
                devices.append(dev)
                break
            else:
                why = "; ".join(tried) or "this server knows no address of it"
                if dropped is None or (k == len(targets) - 1 and not devices):
                    raise DeviceUnreachable(
                        f"devices[{k}] ({target}): cannot reach this server: {why}"
                    )
                dropped.append((k, why))
    except BaseException:
        close_devices(devices)
        raise
    return devices


def close_devices(devices: list[Any]) -> None:
    """End the sessions (their servers free the replicas' tensors)."""
    for dev in devices:
        try:
            dev.close()
        except Exception:  # a dead server's session is gone already
            pass


class Replicas:
    """The servers a job trains on now, by their place in the spec's ``devices``."""

    def __init__(self, targets: list[str], devices: list[Any], indices: list[int]) -> None:
        self.targets = targets
        self.devices = devices
        self.indices = indices
        """Rank -> k of ``devices[k]`` in the spec."""

    def name(self, rank: int) -> str:
        k = self.indices[rank]
        return f"devices[{k}] ({self.targets[k][:16]}...)"

    def refuse_loss(self, dp: Any, error: BaseException) -> None:
        """``require_all_devices``: raise DeviceLost naming the servers lost (``error``
        itself when none was: a failure every replica shares)."""
        outcome = _failure_of(dp)
        if outcome is None or not outcome.dead:
            raise error
        lost = "; ".join(f"{self.name(r)}: {_why(outcome, r)}" for r in sorted(outcome.dead))
        raise DeviceLost(
            f"lost {lost} (require_all_devices = true: the job stops rather than going on "
            "with the other servers)"
        ) from error

    def survive(self, dp: Any, error: BaseException) -> tuple[int, list[str]]:
        """After a failed step: continue on the survivors (``dp.rebuild()``) and return
        (the DataParallel step count of the state they continue from, one line per server
        dropped, naming it and why). Raises ``error`` when no server died (a failure every
        replica shares, e.g. an op error) or none is left."""
        outcome = _failure_of(dp)
        if outcome is None or not outcome.dead:
            raise error
        dead = sorted(outcome.dead)
        if len(dead) >= len(self.devices):
            raise error
        lines = [f"{self.name(r)} dropped: {_why(outcome, r)}" for r in dead]
        lost = [self.devices[r] for r in dead]
        dp.rebuild()  # the survivors, from the last state they all hold
        keep = [r for r in range(len(self.devices)) if r not in outcome.dead]
        self.devices = [self.devices[r] for r in keep]
        self.indices = [self.indices[r] for r in keep]
        close_devices(lost)
        return dp.steps, lines


def _failure_of(dp: Any) -> Any:
    """What DataParallel found when the step failed; when the error came from elsewhere (a
    read of rank 0's loss or parameters), wait for the replicas once so it finds out which
    server, if any, is gone."""
    if dp.last_failure is None:
        try:
            dp.sync()
        except Exception:  # recorded in dp.last_failure
            pass
    return dp.last_failure


def _why(outcome: Any, rank: int) -> str:
    """What a survivor said of ``rank`` (its GroupError), else the rank's own error."""
    from burn_remote import collective

    for r, exc in sorted(outcome.errors.items()):
        if r != rank and isinstance(exc, collective.GroupError) and exc.rank == rank:
            text = str(exc)  # from "group <id>: rank ..." on: the op's line says nothing here
            at = text.find(f"group {exc.group:016x}:")
            return _first_line(exc, text[at:] if at >= 0 else text)
    exc = outcome.errors.get(rank)
    return _first_line(exc) if exc is not None else "it stopped answering"


def _first_line(exc: BaseException, text: str | None = None) -> str:
    lines = (str(exc) if text is None else text).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


__all__ = ["DeviceLost", "DeviceUnreachable", "Replicas", "close_devices", "connect_devices"]
