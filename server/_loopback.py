"""An in-memory link: a RemoteDevice talking to a Session in the same thread, no sockets.

Tests (and anyone checking the protocol) get the whole client and server logic without QUIC;
frames still go through encode and decode, so the counters are the real ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from burn_remote._remote import RemoteDevice, RemoteRuntime
from burn_remote._remote_protocol import ClientProtocol

from ..protocol import messages as m
from ..protocol.bulk import BulkSend
from ._replies import SendBulk, StartFetch
from ._session import Session
from ._state import LimitExceeded, ServerState


class LoopbackLink:
    """Moves every pending batch into the session and its replies back, on ``kick``."""

    def __init__(self, session: Session, proto: ClientProtocol, cond: threading.Condition) -> None:
        self.session, self.proto, self.cond = session, proto, cond
        self.frames: list[bytes | bytearray] = []
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
                    self._deliver_bulk(bulk_id, payload)
                for out in self.session.step(time.monotonic()):
                    if isinstance(out, bytes):
                        self.proto.receive_control(out)
                    elif isinstance(out, SendBulk):
                        self._return_bulk(out.send)
                    elif isinstance(out, StartFetch):
                        self.session.feed_fetched(out.tensor_id, "no network in memory")
                        if self.session.queue:
                            self._resume()
                self.cond.notify_all()

    def _deliver_bulk(self, bulk_id: int, payload: Any) -> None:
        """One transfer, received the way the network glue receives it (charged to the
        quota, written into its destination buffer), so an Upload finds the same buffer."""
        data = memoryview(payload).cast("B")
        try:
            rx = self.session.open_bulk(m.Bulk(bulk_id, len(data), 0))
        except LimitExceeded as exc:
            self.session.refuse_bulk(bulk_id, m.LIMIT, str(exc))
            return
        if rx is None:
            return
        rx.start(m.Bulk(bulk_id, len(data), 0))
        for at in range(0, len(data), m.BULK_CHUNK):
            rx.feed(data[at : at + m.BULK_CHUNK])
        self.session.feed_bulk(bulk_id, rx.buffer)

    def _return_bulk(self, send: BulkSend) -> None:
        """A transfer to the client, written into a buffer of its own as the client's
        receiver does, then acknowledged whole."""
        buffer = np.empty(send.size, np.uint8)
        buffer[:] = np.frombuffer(send.view, np.uint8)
        self.proto.receive_bulk(send.bulk_id, buffer)
        self.session.bulk_sent(send.bulk_id)

    def wait(self, done: Any, timeout: float, linger: bool = True) -> float:
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
