"""Bulk transfers: a tensor's bytes on a stream of their own, in acknowledged chunks
(tags 17..18; ``protocol/bulk.py`` moves them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages_base import WireMessage

BULK_THRESHOLD = 256 * 1024
"""Tensor bytes above this travel on a bulk stream instead of inline (both directions); a
server whose frame limit is smaller announces a smaller threshold in Welcome.limits."""
BULK_CHUNK = 1024 * 1024
"""Largest raw-bytes frame on a bulk stream: a tensor moves as a sequence of these, each
written into its destination buffer as it arrives."""
BULK_ACK_EVERY = 2 * 1024 * 1024
"""The receiver of a bulk transfer sends BulkAck at least this often (in bytes) and at the
end; after a lost link the sender continues from the last acknowledged offset."""


@dataclass(frozen=True, slots=True)
class Bulk(WireMessage):
    """First frame of a bulk stream; raw-bytes frames of at most BULK_CHUNK follow, covering
    ``offset`` up to ``size``. Answered on the same stream by BulkAck."""

    TAG: ClassVar[int] = 17
    bulk_id: int
    """The id an Upload or Data named."""
    size: int
    """Length of the whole transfer in bytes."""
    offset: int
    """Where this stream's bytes start: 0, or (after a lost link) the last offset the
    receiver acknowledged; never beyond it."""


@dataclass(frozen=True, slots=True)
class BulkAck(WireMessage):
    """Receiver -> sender, on the bulk stream: bytes ``0..received`` are in the destination
    buffer. Sent at least every BULK_ACK_EVERY bytes and once the transfer is whole."""

    TAG: ClassVar[int] = 18
    bulk_id: int
    """The transfer."""
    received: int
    """Bytes of the transfer held by the receiver, counted from 0."""


BULK_WIRE: tuple[type[WireMessage], ...] = (
    Bulk,
    BulkAck,
)
"""Every message declared here, in tag order (``messages.MESSAGES`` joins the tables)."""
