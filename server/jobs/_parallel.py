"""The servers a data-parallel training job trains on, dialled with the server's own key.

A job that names ``devices`` runs ``burn_remote.DataParallel`` with this server as its
client: the data and the one checkpoint stay here, the replicas live on the named servers
(which must authorise this server's peer id), and the gradients are all-reduced among them.
Each server is reached before training starts, at the addresses this server resolves itself,
so a server that is down or unknown here fails the job at once with the spec's key path,
not halfway through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class DeviceUnreachable(ConnectionError):
    """A server named in ``devices`` could not be reached; names its key path."""


def connect_devices(
    targets: list[str], key_path: Path | None, candidates: Callable[[str], Iterator[str]]
) -> list[Any]:
    """One RemoteDevice per target peer id, each answering a Sync (so it is up and admits
    us). ``candidates(peer)`` gives the ``PEER@HOST:PORT`` texts to try, in order: the
    addresses this server resolves itself (``server._peers.dial_targets``)."""
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
                raise DeviceUnreachable(f"devices[{k}] ({target}): cannot reach this server: {why}")
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


__all__ = ["DeviceUnreachable", "close_devices", "connect_devices"]
