"""A send the kernel refuses for one datagram (a firewall rule dropping it answers EPERM, a
full queue ENOBUFS, ICMP errors) loses that datagram only: the endpoint goes on, QUIC resends.
A DROP rule in a server's OUTPUT chain used to end the server."""

from __future__ import annotations

import errno

import pytest
import trio
from burn_remote.protocol.transport import Endpoint, EndpointConfig, Identity
from burn_remote.protocol.transport._endpoint import SEND_LOSS_ERRNOS


class _Refusing:
    """A UDP socket whose sends fail with ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.tries = code, 0

    def sendto(self, data: bytes, addr: tuple) -> int:
        self.tries += 1
        raise OSError(self.code, "refused")


@pytest.mark.parametrize("code", sorted(SEND_LOSS_ERRNOS), ids=errno.errorcode.get)
def test_lost_datagram_errors_do_not_raise(code: int) -> None:
    async def main() -> int:
        async with Endpoint.open(Identity.generate(), config=EndpointConfig()) as ep:
            real, ep._sock = ep._sock, _Refusing(code)
            try:
                ep._sendto(b"x" * 100, ("127.0.0.1", 9))
                return ep._sock.tries
            finally:
                ep._sock = real

    assert trio.run(main) == 1


def test_other_send_errors_still_raise() -> None:
    async def main() -> None:
        async with Endpoint.open(Identity.generate(), config=EndpointConfig()) as ep:
            real, ep._sock = ep._sock, _Refusing(errno.EBADF)
            try:
                with pytest.raises(OSError):  # a bug, not a lost datagram
                    ep._sendto(b"x", ("127.0.0.1", 9))
            finally:
                ep._sock = real

    trio.run(main)
