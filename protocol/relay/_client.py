"""A peer's side of the relay: authenticate, publish, look up, and tunnel QUIC through it.

The tunnel keeps the QUIC endpoint untouched: for each remote peer it opens a local UDP
"shim" socket. A dialling endpoint simply connects to the shim's address; what it sends
there leaves as ``SEND(peer, datagram)`` to the relay, and ``RECV(peer, datagram)`` from the
relay is delivered back from the shim. A serving node gets one shim per remote peer, which
forwards to its QUIC port, so the server sees each relayed client as a distinct address.
The relay only ever handles QUIC packets, encrypted end to end: it holds no session key.

Because QUIC sees only the shim, the shim's traffic can leave by another way without QUIC
noticing: ``_direct`` moves it to a hole-punched direct path when one validates, and back to
the relay when that path goes quiet.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ..addressing import SocketAddress
from ..transport import Endpoint, Identity, PeerId, TransportError
from . import _disco
from . import _wire as w
from ._direct import DirectPaths, direct_enabled
from ._records import AddressRecord, RecordRefused
from ._udp import receive_batch, send, udp_socket

log = logging.getLogger("burn_remote.relay")

REQUEST_TIMEOUT = 1.0
"""Seconds to wait for a control reply before retrying."""
REQUEST_TRIES = 4
PING_INTERVAL = 10.0
"""Seconds between registration refreshes (the relay forgets a peer after 60 s)."""
MAX_SHIMS = 256
"""Remote peers one tunnel carries at once."""


class RelayError(TransportError):
    """The relay refused a request or did not answer."""


@dataclass
class _Shim:
    peer: PeerId
    sock: socket.socket
    target: SocketAddress | None
    """Where datagrams from ``peer`` are delivered (the local QUIC endpoint)."""


class RelayClient:
    """One authenticated UDP association with a relay: requests, and the tunnel's shims."""

    def __init__(
        self,
        identity: Identity,
        sock: trio.socket.SocketType,
        nursery: trio.Nursery,
        raw: socket.socket,
    ) -> None:
        self.identity = identity
        self._sock = sock
        self._raw: socket.socket = raw
        """The same socket as ``sock``, for the batched hot path (``_udp``)."""
        self._nursery = nursery
        self._lock = trio.Lock()
        self._replies_send, self._replies = trio.open_memory_channel[bytes](16)
        self._shims: dict[PeerId, _Shim] = {}
        self.serve_to: SocketAddress | None = None
        """When set (a server), datagrams from unknown peers get a shim towards this address."""
        self.relay = w.addr_text(sock.getpeername()[:2])
        """The relay's ``host:port``, for messages (readable also when the network is down)."""
        self.relayed_out = 0
        self.relayed_in = 0
        self.observed: str | None = None
        """Our QUIC socket's address as the relay last saw it (set by ``serve_via_relay``)."""
        self.direct: DirectPaths | None = None
        """Hole punching (None when off): moves each shim's traffic to a direct path."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        identity: Identity,
        relay: tuple[str, int],
        *,
        authenticate: bool = True,
        direct: bool | None = None,
        endpoint: Endpoint | None = None,
    ) -> AsyncIterator[RelayClient]:
        """Associate with the relay at ``relay`` (and prove our key unless told not to).
        ``direct`` (default: ``$BURN_REMOTE_DIRECT``, on) punches holes towards the peers
        the tunnel carries: from ``endpoint``'s own socket when given (a server's QUIC
        endpoint, in this trio run), else from a socket of its own."""
        family = socket.AF_INET6 if ":" in relay[0] else socket.AF_INET
        raw = socket.socket(family, socket.SOCK_DGRAM)
        sock = trio.socket.from_stdlib_socket(raw)
        with sock:
            await sock.connect(relay)
            async with trio.open_nursery() as nursery:
                client = cls(identity, sock, nursery, raw)
                nursery.start_soon(client._read_loop)
                try:
                    if authenticate:
                        await client.authenticate()
                        nursery.start_soon(client._ping_loop)
                        if direct_enabled() if direct is None else direct:
                            await client._start_direct(family, endpoint)
                    yield client
                finally:
                    nursery.cancel_scope.cancel()
                    for shim in client._shims.values():
                        shim.sock.close()
                    if client.direct is not None:
                        client.direct.close()

    async def _start_direct(self, family: int, endpoint: Endpoint | None) -> None:
        sock = None
        if endpoint is None:
            wildcard = ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)
            sock = udp_socket(family, wildcard)
        direct = DirectPaths(
            self.identity,
            self._sock.getpeername()[:2],
            self.local_host,
            self._relay_send,
            self._deliver,
            sock=sock,
            endpoint=endpoint,
        )
        self.direct = direct
        if endpoint is None:
            self._nursery.start_soon(direct.run)
        await direct.observe()  # the first CALL_ME_MAYBE should carry the reflexive address
        self._nursery.start_soon(direct.observe_loop)

    def path_of(self, address: SocketAddress) -> str | None:
        """``"relay"`` or ``"direct host:port"`` for the peer behind our shim at
        ``address``; None when ``address`` is no shim of ours."""
        for shim in self._shims.values():
            if shim.sock.getsockname()[:2] == tuple(address[:2]):
                return self.direct.describe(shim.peer) if self.direct else "relay"
        return None

    @property
    def local_host(self) -> str:
        """Our address on the path to the relay; shims bind here."""
        return self._sock.getsockname()[0]

    # -- requests ----------------------------------------------------------------------------

    async def _request(self, datagram: bytes, expect: int) -> bytes:
        async with self._lock:
            while True:  # drop stale replies of earlier, timed-out tries
                try:
                    self._replies.receive_nowait()
                except trio.WouldBlock:
                    break
            unsent: OSError | None = None
            for _ in range(REQUEST_TRIES):
                try:
                    await self._sock.send(datagram)
                except OSError as exc:  # ENETUNREACH while our network is down: retry later
                    unsent = exc
                    await trio.sleep(REQUEST_TIMEOUT)
                    continue
                with trio.move_on_after(REQUEST_TIMEOUT):
                    while True:
                        reply = await self._replies.receive()
                        if reply[0] == expect:
                            return reply[1:]
                        if reply[0] == w.ERR:
                            raise RelayError(f"relay: {reply[1:].decode(errors='replace')}")
            if unsent is not None:
                raise RelayError(f"relay at {self.relay}: cannot send ({unsent})")
            raise RelayError(f"relay at {self.relay} did not answer")

    async def authenticate(self) -> None:
        """Prove our key by signing the relay's challenge; the relay then forwards to us."""
        me = self.identity.peer_id.raw
        body = await self._request(bytes([w.HELLO]) + me, w.CHALLENGE)
        relay_peer, nonce = body[:32], body[32:64]
        sig = self.identity.private_key.sign(w.auth_message(relay_peer, nonce))
        await self._request(bytes([w.AUTH]) + me + sig, w.OK)

    async def publish(self, record: AddressRecord) -> None:
        """Store our record on the relay; raises :class:`RecordRefused` with its reason."""
        try:
            await self._request(bytes([w.PUBLISH]) + record.encode(), w.OK)
        except RelayError as exc:
            raise RecordRefused(str(exc)) from None

    async def lookup(self, peer: PeerId) -> AddressRecord | None:
        """The peer's record, verified here too (a relay cannot forge one), or None."""
        try:
            body = await self._request(bytes([w.LOOKUP]) + peer.raw, w.RECORD)
        except RelayError as exc:
            if "unknown peer" in str(exc):
                return None
            raise
        rec = AddressRecord.decode(body)
        if rec.peer != peer:
            raise RecordRefused("relay answered with another peer's record")
        rec.verify()
        return rec

    # -- tunnel ------------------------------------------------------------------------------

    async def dial(self, peer: PeerId) -> tuple[str, int]:
        """A local address that reaches ``peer`` through the relay (dial it with QUIC)."""
        shim = self._shims.get(peer) or await self._new_shim(peer, None)
        return shim.sock.getsockname()[:2]

    def is_tunnel(self, address: SocketAddress) -> bool:
        """Whether ``address`` is one of our shims (a peer reached through the relay)."""
        return any(s.sock.getsockname()[:2] == tuple(address[:2]) for s in self._shims.values())

    async def _new_shim(self, peer: PeerId, target: SocketAddress | None) -> _Shim:
        if len(self._shims) >= MAX_SHIMS:
            raise RelayError(f"tunnel already carries {MAX_SHIMS} peers")
        shim = _Shim(peer, udp_socket(self._sock.family, (self.local_host, 0)), target)
        self._shims[peer] = shim
        self._nursery.start_soon(self._shim_loop, shim)
        if self.direct is not None:
            self.direct.start(self._nursery, peer, shim.sock.getsockname())
        return shim

    async def _shim_loop(self, shim: _Shim) -> None:
        header = bytes([w.SEND]) + shim.peer.raw
        relay = self._raw
        while True:
            for data, addr in await receive_batch(shim.sock):
                if shim.target is None:
                    shim.target = addr
                elif addr != shim.target:
                    continue  # only the endpoint the shim serves may use it
                if self.direct is not None and await self.direct.send(shim.peer, data):
                    continue
                if await send(relay, header + data):
                    self.relayed_out += 1

    async def _relay_send(self, peer: PeerId, payload: bytes) -> None:
        """A datagram for ``peer`` through the relay (lost like any other when dropped)."""
        await send(self._raw, bytes([w.SEND]) + peer.raw + payload)

    async def _read_loop(self) -> None:
        while True:
            for data, _addr in await receive_batch(self._raw):
                if not data:
                    continue
                if data[0] == w.RECV and len(data) > 33:
                    if _disco.is_disco(data[33:]):
                        await self._on_relayed_disco(PeerId(data[1:33]), data[33:])
                    else:
                        await self._deliver(PeerId(data[1:33]), data[33:])
                else:
                    try:
                        self._replies_send.send_nowait(data)
                    except trio.WouldBlock:
                        pass

    async def _on_relayed_disco(self, src: PeerId, payload: bytes) -> None:
        """A CALL_ME_MAYBE: a server makes the peer's shim first (the QUIC handshake that
        follows, or already came, uses it), then both sides punch."""
        if self.direct is None or await self._shim_for(src) is None:
            return
        await self.direct.on_relayed(src, payload)

    async def _shim_for(self, src: PeerId) -> _Shim | None:
        shim = self._shims.get(src)
        if shim is None and self.serve_to is not None:
            try:
                shim = await self._new_shim(src, self.serve_to)
            except RelayError:
                return None
        return shim

    async def _deliver(self, src: PeerId, payload: bytes) -> None:
        shim = await self._shim_for(src)
        if shim is None:
            return
        if shim.target is not None and await send(shim.sock, payload, shim.target):
            self.relayed_in += 1

    async def _ping_loop(self) -> None:
        """Refresh the registration; a relay that cannot be reached (our network is down,
        the relay restarts) is retried every round and never ends the association."""
        while True:
            await trio.sleep(PING_INTERVAL)
            try:
                await self._request(bytes([w.PING]), w.OK)
            except RelayError:
                try:
                    await self.authenticate()  # the relay restarted or forgot us
                except RelayError as exc:
                    log.warning("relay registration failed: %s", exc)


__all__ = ["RelayClient", "RelayError"]
