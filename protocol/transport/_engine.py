"""The seam between the drivers and the QUIC engines, declared.

The drivers (``Connection``/``Endpoint`` under trio, ``BlockingConnection`` under threads)
speak to a sans-I/O QUIC connection through these members only, all public; the adapters
implement them: ``PeerQuicConnection`` (aioquic, ``_quic``), ``Qh3ClientConnection``
(``_qh3``) and ``Qh3ServerConnection`` (``_qh3_server``). Events come out as aioquic's
event classes (``aioquic.quic.events``), which the qh3 adapters translate to.

What the driver knows and an engine needs (how much the application has read, the frames
readers wait for) is the driver's ``ReceiveLedger``: the driver writes it, an engine reads
it when it computes the windows it grants. It is not the engine's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from aioquic.quic.events import QuicEvent


class ReceiveLedger:
    """What the application has read and is waiting for, per connection (the driver's)."""

    __slots__ = ("buffered", "consumed", "frame_credit", "frame_credit_total")

    def __init__(self) -> None:
        self.consumed: dict[int, int] = {}
        """Stream id -> bytes the application has read from it."""
        self.buffered = 0
        """Bytes delivered by the engine and not read yet, over all streams."""
        self.frame_credit: dict[int, int] = {}
        """Stream id -> size of the frame a reader waits for (it may arrive whole)."""
        self.frame_credit_total = 0
        """The sum of ``frame_credit``."""

    def read(self, stream_id: int, n: int) -> None:
        """The application read ``n`` more bytes of a stream."""
        self.consumed[stream_id] = self.consumed.get(stream_id, 0) + n
        self.buffered -= n

    def set_credit(self, stream_id: int, n: int) -> None:
        """A reader waits for a frame of ``n`` bytes on this stream (0: no longer)."""
        self.frame_credit_total += n - self.frame_credit.pop(stream_id, 0)
        if n:
            self.frame_credit[stream_id] = n

    def forget(self, stream_id: int) -> None:
        """A stream both sides finished with."""
        self.consumed.pop(stream_id, None)
        self.set_credit(stream_id, 0)


@runtime_checkable
class QuicEngine(Protocol):
    """A connection as both drivers drive it (every engine, either side)."""

    ledger: ReceiveLedger

    def receive_datagram(self, data: bytes, addr: Any, now: float) -> None: ...
    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Any]]: ...
    def get_timer(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def next_event(self) -> QuicEvent | None: ...
    def send_stream_data(self, stream_id: int, data: Any, end_stream: bool = False) -> None: ...
    def send_ping(self, uid: int) -> None: ...
    def stop_stream(self, stream_id: int, error_code: int) -> None: ...
    def close(self, *, error_code: int = 0, reason_phrase: str = "") -> None: ...
    def open_bidi_stream(self) -> int: ...
    def finish_stream(self, stream_id: int) -> None: ...
    def sender_buffered(self, stream_id: int) -> int: ...
    def unacknowledged(self) -> bool: ...
    def send_due_at(self, now: float, timer: float | None) -> bool: ...
    def window_update_due(self, stream_id: int) -> bool: ...
    def ack_now(self, now: float) -> None: ...

    @property
    def handshake_confirmed(self) -> bool: ...

    @property
    def close_pending(self) -> bool:
        """A close was asked for and its CONNECTION_CLOSE is not sent yet."""
        ...


@runtime_checkable
class ClientEngine(QuicEngine, Protocol):
    """A client connection (``BlockingConnection``'s, and what ``Endpoint`` dials)."""

    def connect(self, addr: Any, now: float) -> None: ...


@runtime_checkable
class EndpointEngine(QuicEngine, Protocol):
    """A connection as the trio ``Endpoint`` and ``Connection`` drive it: what a server
    adds (its first flight's verdict, its connection id) and the shells' common rest."""

    host_cid: bytes

    def reset_stream(self, stream_id: int, error_code: int) -> None: ...

    @property
    def is_client(self) -> bool: ...

    @property
    def data_queued(self) -> bool:
        """Stream data was written since the last build (it is due now)."""
        ...

    @property
    def first_flight_accepted(self) -> bool:
        """Server: the client's first Initial decrypted (a garbage one leaves no trace)."""
        ...


if TYPE_CHECKING:  # the type checker holds each adapter to its interface

    def _conforms(
        a: Any, b: Any, c: Any
    ) -> tuple[EndpointEngine, ClientEngine, ClientEngine, EndpointEngine]:
        from ._qh3 import Qh3ClientConnection
        from ._qh3_server import Qh3ServerConnection
        from ._quic import PeerQuicConnection

        aioquic: PeerQuicConnection = a
        qh3_client: Qh3ClientConnection = b
        qh3_server: Qh3ServerConnection = c
        served: EndpointEngine = aioquic
        dialled: ClientEngine = aioquic
        qh3_dialled: ClientEngine = qh3_client
        qh3_served: EndpointEngine = qh3_server
        return served, dialled, qh3_dialled, qh3_served
