"""Batched, non-blocking UDP for the tunnel's hot paths (shims, relay and direct sockets).

Every datagram of a relayed or hole-punched session crosses these sockets twice per side, so
their cost per datagram bounds the session's throughput. A trio socket call checkpoints on
every datagram; here a loop waits once until a socket is readable, then reads what is
queued without awaiting, and a send awaits only when the kernel's buffer is full -- as the
QUIC endpoint's own receive loop does.
"""

from __future__ import annotations

import socket

import trio

from ..addressing import SocketAddress

BATCH = 64
"""Datagrams read per wake-up before other tasks get their turn."""
MAX_DATAGRAM = 65535


def udp_socket(family: int, bind: tuple[str, int]) -> socket.socket:
    """A non-blocking UDP socket bound to ``bind``."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind(bind)
    except OSError:
        sock.close()
        raise
    return sock


async def receive_batch(sock: socket.socket) -> list[tuple[bytes, SocketAddress]]:
    """Wait until ``sock`` is readable, then return what it holds (at most :data:`BATCH`).
    ICMP errors reported on the socket are skipped: the datagram they concern is lost."""
    await trio.lowlevel.wait_readable(sock)
    out: list[tuple[bytes, SocketAddress]] = []
    for _ in range(BATCH):
        try:
            out.append(sock.recvfrom(MAX_DATAGRAM))
        except BlockingIOError:
            break
        except OSError:
            continue
    return out


async def send(sock: socket.socket, data: bytes, addr: SocketAddress | None = None) -> bool:
    """Send one datagram (to the connected peer when ``addr`` is None); waits only while the
    send buffer is full. False when the network refused it (lost: QUIC retransmits)."""
    while True:
        try:
            if addr is None:
                sock.send(data)
            else:
                sock.sendto(data, addr)
            return True
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
        except OSError:
            return False


__all__ = ["BATCH", "receive_batch", "send", "udp_socket"]
