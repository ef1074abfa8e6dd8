"""Server-to-server moves: the source side (a connection whose first frame is a lone
``Fetch`` is answered with ``Data`` and the bytes on that stream) and the destination side
(``fetch_from``: dial the source and receive the tensor into the session's quota)."""

from __future__ import annotations

from typing import Any

import numpy as np
import trio

from ..protocol import messages as m
from ..protocol.bulk import BulkReceive, BulkSend, parse_header
from ..protocol.transport import Connection, Endpoint, FrameStream, TransportError
from ._peers import dial_peer
from ._replies import StartFetch
from ._session import Session
from ._state import LimitExceeded, ServerState

FETCH_TIMEOUT = 120.0
"""Seconds a server-to-server fetch may take before the destination reports CAPABILITY."""


def is_fetch(frame: bytes) -> bool:
    try:
        msgs = m.decode(frame)
    except m.DecodeError:
        return False
    return len(msgs) == 1 and isinstance(msgs[0], m.Fetch)


async def serve_fetch(state: ServerState, conn: Connection, s: FrameStream, frame: bytes) -> None:
    """Source side of a server-to-server move: Data, then the bytes as a bulk transfer on
    the same stream (chunks from a view of the tensor, acknowledged by the fetcher)."""
    reply, send = await trio.to_thread.run_sync(state.serve_fetch, frame, str(conn.peer_id))
    await s.send_frame(reply)
    if send is not None:
        await s.send_frame(send.header())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_acks, s, send)
            for chunk in send.chunks():
                await s.send_frame(chunk)
    await s.close()
    with trio.move_on_after(10):
        await s.receive_frame()  # the fetcher closes once it has the bytes


async def drain_acks(s: FrameStream, send: BulkSend) -> None:
    while not send.done:
        frame = await s.receive_frame()
        if frame is None:
            return
        try:
            send.on_ack(frame)
        except m.DecodeError as exc:
            raise TransportError(f"fetcher sent a bad BulkAck: {exc}") from None


class DialRefused(Exception):
    """The requesting peer is over its dial rate: answered LIMIT, not CAPABILITY."""


async def fetch_from(ep: Endpoint, session: Session, out: StartFetch) -> Any:
    """Destination side of a server-to-server move: dial the source (at an address this
    server resolves itself, ``dial_peer``), redeem the token, and receive the tensor in
    chunks into a buffer charged to the session; (dtype, shape, buffer), or the source's
    refusal as a string."""
    try:
        conn = await dial_peer(ep, session.state, out.source_peer, requester=session.peer_id)
    except LimitExceeded as exc:  # the peer's dial rate: its own code, not the source's
        raise DialRefused(str(exc)) from None
    try:
        s = await conn.open_stream()
        await s.send_frame(m.encode(m.Fetch(0, str(ep.peer_id), "", out.token)))
        (msg,) = m.decode(await s.receive_frame() or b"")
        if isinstance(msg, m.Error):
            return msg.message
        if not isinstance(msg, m.Data):
            return f"unexpected {type(msg).__name__} from the source"
        if not msg.bulk_id:
            buffer = np.frombuffer(msg.data, np.uint8).copy()
            session.reserve(buffer.nbytes)
            return (msg.dtype, msg.shape, buffer)
        header = parse_header(await s.receive_frame())
        session.reserve(header.size)
        try:
            rx = BulkReceive(header.bulk_id, header.size)
            rx.start(header)
            while not rx.done:
                chunk = await s.receive_frame()
                if chunk is None:
                    raise TransportError(f"the source ended the transfer at {rx.received}")
                ack = rx.feed(chunk)
                if ack is not None:
                    await s.send_frame(ack)
        except BaseException:
            session.release(header.size)
            raise
        return (msg.dtype, msg.shape, rx.buffer)
    finally:
        await conn.close("fetched", flush_timeout=2.0)
