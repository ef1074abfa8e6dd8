"""Groups of RemoteDevices: set up over the client's sessions (being built)."""

from __future__ import annotations

from typing import Any


class RemoteImpl:
    def __init__(self, group: Any) -> None:
        raise NotImplementedError(
            "collective.Group of RemoteDevices is not available yet (the server ring lands "
            "next); use collective.local_devices(n) for local replicas"
        )

    def close(self) -> None:  # pragma: no cover
        pass
