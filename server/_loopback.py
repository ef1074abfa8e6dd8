"""An in-memory link: a RemoteDevice talking to a Session in the same thread, no sockets.

Tests (and anyone checking the protocol) get the whole client and server logic without QUIC;
frames still go through encode and decode, so the counters are the real ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from burn_remote._remote import RemoteDevice, RemoteRuntime
from burn_remote._remote_protocol import ClientProtocol

from ._replies import SendBulk, StartFetch
from ._session import Session
from ._state import ServerState


class LoopbackLink:
    """Moves every pending batch into the session and its replies back, on ``kick``."""

    def __init__(self, session: Session, proto: ClientProtocol, cond: threading.Condition) -> None:
        self.session, self.proto, self.cond = session, proto, cond
        self.frames: list[bytes] = []
        """Every control frame sent, for tests that inspect or mutate them."""

    def kick(self) -> None:
        with self.cond:
            while True:
                batch = self.proto.take()
                if batch is None:
                    return
                self.frames.append(batch.frame)
                self.session.feed_control(batch.frame)
                for bulk_id, payload in batch.bulk:
                    self.session.feed_bulk(bulk_id, payload)
                for out in self.session.step(time.monotonic()):
                    if isinstance(out, bytes):
                        self.proto.receive_control(out)
                    elif isinstance(out, SendBulk):
                        self.proto.receive_bulk(out.bulk_id, out.payload)
                    elif isinstance(out, StartFetch):
                        self.session.feed_fetched(out.tensor_id, "no network in memory")
                        self.session.queue and self._resume()
                self.cond.notify_all()

    def wait(self, done: Any, timeout: float) -> float:
        """Replies arrive within ``kick``: nothing to read here (see ``Link.wait``)."""
        return timeout

    def _resume(self) -> None:
        for out in self.session.step(time.monotonic()):
            if isinstance(out, bytes):
                self.proto.receive_control(out)

    def close(self) -> None:
        self.session.close()


def loopback_device(state: ServerState | None = None) -> tuple[RemoteDevice, Session]:
    """A RemoteDevice wired to a fresh in-memory Session of ``state`` (a CPU server if None)."""
    state = state or ServerState("cpu")
    session = Session(state, "memory-client")
    holder: dict[str, Any] = {}

    def factory(proto: ClientProtocol, cond: threading.Condition) -> LoopbackLink:
        holder["link"] = LoopbackLink(session, proto, cond)
        return holder["link"]

    dev = RemoteDevice.over(RemoteRuntime(factory))
    return dev, session


__all__ = ["LoopbackLink", "loopback_device"]
