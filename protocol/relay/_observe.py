"""Address discovery: ask the relay, from the QUIC socket itself, which address it sees.

Behind a NAT that is the NAT's public mapping of our QUIC socket -- the reflexive address
STUN finds -- which a peer publishes beside its local addresses in its signed record. The
question leaves from the QUIC endpoint's socket (not the relay association's), because only
that socket's mapping is worth publishing; the answer cannot be QUIC (its first byte has
neither QUIC header bit), so the endpoint hands it to :func:`observe_address` unparsed.
"""

from __future__ import annotations

import secrets
import socket
import weakref
from collections.abc import Callable
from typing import cast

import trio

from ..addressing import SocketAddress
from ..transport import Endpoint
from . import _wire as w
from ._client import REQUEST_TIMEOUT, REQUEST_TRIES, RelayError


class _Pending:
    def __init__(self) -> None:
        self.answer: str | None = None
        self.arrived = trio.Event()


_waiting: weakref.WeakKeyDictionary[Endpoint, dict[bytes, _Pending]] = weakref.WeakKeyDictionary()
"""Per endpoint: OBSERVE transaction id -> where its answer goes."""


def _install(ep: Endpoint) -> dict[bytes, _Pending]:
    table = _waiting.get(ep)
    if table is None:
        table = _waiting[ep] = {}
        chained = ep.on_foreign_datagram
        ep.on_foreign_datagram = lambda data, addr: _answer(table, data, addr, chained)
    return table


def _answer(
    table: dict[bytes, _Pending],
    data: bytes,
    addr: SocketAddress,
    chained: Callable[[bytes, SocketAddress], None] | None,
) -> None:
    """An OBSERVED for a question we asked (the random id proves that); anything else that
    is not QUIC goes to the handler installed before ours (hole punching's), if any, else
    is dropped, as the endpoint drops any datagram it cannot use."""
    if len(data) > 1 + w.TXID and data[0] == w.OBSERVED:
        pending = table.get(data[1 : 1 + w.TXID])
        if pending is not None and pending.answer is None:
            pending.answer = data[1 + w.TXID :].decode(errors="replace")
            pending.arrived.set()
            return
    if chained is not None:
        chained(data, addr)


async def observe_address(
    ep: Endpoint, relay: tuple[str, int], *, tries: int = REQUEST_TRIES
) -> str:
    """``host:port`` at which the relay at ``relay`` sees ``ep``'s socket (retried as the
    relay's other requests are).

    Raises:
        RelayError: no answer after ``tries`` requests, or an answer that is no address.
    """
    family = socket.AF_INET6 if ":" in ep.local_address[0] else socket.AF_INET
    try:
        infos = await trio.socket.getaddrinfo(relay[0], relay[1], family, socket.SOCK_DGRAM)
    except OSError as exc:
        raise RelayError(f"relay {w.addr_text(relay)}: {exc}") from None
    # (an AF_INET or AF_INET6 lookup yields IP socket addresses, never AF_UNIX's or others')
    dest = cast(SocketAddress, infos[0][4])
    table = _install(ep)
    txid = secrets.token_bytes(w.TXID)
    pending = table[txid] = _Pending()
    request = bytes([w.OBSERVE]) + txid + bytes(w.OBSERVE_MIN - w.TXID)
    try:
        for _ in range(tries):
            ep.send_datagram(request, dest)
            with trio.move_on_after(REQUEST_TIMEOUT):
                await pending.arrived.wait()
            if pending.answer is not None:
                try:
                    w.parse_hostport(pending.answer)
                except ValueError:
                    raise RelayError(f"relay answered OBSERVE with {pending.answer!r}") from None
                return pending.answer
    finally:
        del table[txid]
    raise RelayError(f"relay {w.addr_text(relay)} did not answer OBSERVE")


__all__ = ["observe_address"]
