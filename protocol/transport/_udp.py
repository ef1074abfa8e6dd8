"""UDP socket settings both QUIC drivers share (the trio ``Endpoint`` and the threaded
client, ``BlockingConnection``), kept free of trio so a client process never loads it."""

from __future__ import annotations

import errno
import socket
from contextlib import suppress

SEND_LOSS_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPERM, errno.ENOBUFS}
)
"""Errors of a UDP send that only mean "this datagram is lost" (QUIC retransmits): ICMP
errors from a gone or unreachable peer, a local firewall rule that drops it (netfilter
answers EPERM), a full device queue. Anything else is a bug and is raised."""


def size_buffers(sock: socket.socket, size: int) -> None:
    """Ask for big socket buffers: a burst of 64 KiB datagrams overflows the default."""
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)  # SO_*BUFFORCE (privileged)
        except OSError:
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, size)
