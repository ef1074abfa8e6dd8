"""Hole punching under QUIC: a relayed peer's datagrams move to a direct path and back.

The QUIC endpoint above never notices: it talks to the tunnel's per-peer shim address (see
``_client``), which stays the same for the connection's life. This layer decides, datagram
by datagram, whether the shim's traffic leaves through the relay or from our *direct
socket* straight to the peer -- Iroh's magicsock, on the tunnel we already had.

* The direct socket learns its NAT mapping from the relay (OBSERVE, as the QUIC socket does
  for the record) and offers it, with its local address, to each peer in a CALL_ME_MAYBE
  sent through the relay when the peer's shim is made; the peer answers with its own.
* Both sides then ping each other's candidates at once from their direct sockets, which
  opens both NATs (``_peerpath`` has the rules). Disco messages are signed with the node
  keys (``_disco``), so nobody else can validate an address for a peer.
* Incoming QUIC datagrams on the direct socket are accepted only from addresses the peer
  has proved with a signed message, and are delivered to the shim exactly as relayed ones.

``$BURN_REMOTE_DIRECT=0`` turns it off for a process (the relay then carries everything).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress

import trio

from ..addressing import Address, SocketAddress
from ..transport import Endpoint, Identity, PeerId
from . import _disco as d
from . import _wire as w
from ._peerpath import PeerPath
from ._udp import receive_batch, send

log = logging.getLogger("burn_remote.relay")

DIRECT_ENV = "BURN_REMOTE_DIRECT"
"""``0`` turns hole punching off for this process: relayed peers stay relayed."""
TICK = 0.1
"""Seconds between checks of which pings are due."""
IDLE_TICK = 1.0
"""The same, for a peer that gave no sign for a minute (nothing is pinged then)."""
OBSERVE_TIMEOUT = 1.0
"""Seconds to wait for the relay's OBSERVED answer (a lost one is retried next refresh)."""
OBSERVE_REFRESH = 30.0
"""Seconds between refreshes of the direct socket's reflexive address."""
CMM_INTERVAL = 30.0
"""Seconds between CALL_ME_MAYBEs to one peer (one is sent at once when its shim is made,
and again when the peer sends one and ours is older than a second)."""
REPLAY_BYTES = 1 << 20
"""Bytes of the newest datagrams sent on a direct path kept for a replay through the relay
when that path goes quiet (see :meth:`DirectPaths._replay`)."""
CMM_ANSWER_GAP = 1.0
"""A CALL_ME_MAYBE is answered with ours unless ours went less than this many seconds ago."""


def direct_enabled() -> bool:
    return os.environ.get(DIRECT_ENV, "1").strip() not in ("0", "false", "no", "off")


RelaySend = Callable[[PeerId, bytes], Awaitable[None]]
Deliver = Callable[[PeerId, bytes], Awaitable[None]]


class DirectPaths:
    """The direct path of every relayed peer, and the socket it uses.

    Two ways to own that socket:

    * a **direct socket** of its own (a client: its QUIC endpoint lives on another thread):
      the shim hands each datagram to :meth:`send`, datagrams read by :meth:`run` go back
      through the shim;
    * the **QUIC endpoint's socket** (a server, ``endpoint=``): disco shares the socket as
      OBSERVE does, and the endpoint itself maps each peer's shim address to its direct
      path and back (:meth:`route`, :meth:`inbound`, installed as ``endpoint.router``): the
      server's datagrams then skip the shim and the tunnel's two extra hops entirely.
    """

    def __init__(
        self,
        identity: Identity,
        relay: SocketAddress,
        local_host: str,
        relay_send: RelaySend,
        deliver: Deliver,
        *,
        sock: socket.socket | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        if sock is not None and endpoint is None:
            port = sock.getsockname()[1]
        elif endpoint is not None and sock is None:
            port = endpoint.local_address[1]
        else:
            raise ValueError("DirectPaths needs exactly one of sock and endpoint")
        self.identity = identity
        self._sock = sock
        self._ep = endpoint
        self._relay = relay
        self._local = (local_host, port)
        self._relay_send = relay_send
        self._deliver = deliver
        self.peers: dict[PeerId, PeerPath] = {}
        self._recent: dict[PeerId, deque[bytes]] = {}
        self._recent_bytes: dict[PeerId, int] = {}
        self._by_addr: dict[Address, PeerId] = {}
        self._virtual: dict[PeerId, Address] = {}
        self._peer_at: dict[Address, PeerId] = {}
        self._cmm_sent: dict[PeerId, float] = {}
        self.reflexive: Address | None = None
        self._observe_txid = b""
        self._observed = trio.Event()
        self.sent_direct = 0
        self.received_direct = 0
        if endpoint is not None:
            self._chained = endpoint.on_foreign_datagram
            endpoint.on_foreign_datagram = self._on_foreign
            endpoint.router = self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        elif self._ep is not None and self._ep.router is self:
            self._ep.router = None

    def _send_now(self, data: bytes, addr: SocketAddress) -> None:
        """Send a disco or OBSERVE datagram (lost when the kernel's buffer is full: each is
        repeated)."""
        if self._ep is not None:
            self._ep.send_datagram(data, addr)
            return
        if self._sock is not None:
            with suppress(OSError):
                self._sock.sendto(data, addr)

    # -- candidates ------------------------------------------------------------------------

    def candidates(self) -> list[Address]:
        """Our addresses to offer: where the relay sees the direct socket, and the socket's
        own address on the route to the relay (the peer may share our network)."""
        out = [self.reflexive] if self.reflexive else []
        return out + ([self._local] if self._local not in out else [])

    async def observe(self) -> None:
        """Ask the relay which address our direct socket has (one try; the answer arrives
        on :meth:`run`'s loop)."""
        self._observe_txid = d.new_txid()[: w.TXID]
        self._observed = trio.Event()
        request = bytes([w.OBSERVE]) + self._observe_txid + bytes(w.OBSERVE_MIN - w.TXID)
        self._send_now(request, self._relay)
        with trio.move_on_after(OBSERVE_TIMEOUT):
            await self._observed.wait()

    async def observe_loop(self) -> None:
        """Keep the reflexive address fresh (a NAT may drop an idle mapping and make a new
        one); retried quickly until the first answer."""
        while True:
            await self.observe()
            await trio.sleep(OBSERVE_REFRESH if self.reflexive else OBSERVE_TIMEOUT)

    # -- peers -----------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery, peer: PeerId, virtual: SocketAddress) -> None:
        """Begin punching towards ``peer``, whose shim (the address QUIC knows it by on
        this side) was just made at ``virtual``."""
        if peer in self.peers:
            return
        self.peers[peer] = PeerPath()
        self._virtual[peer] = virtual[:2]
        self._peer_at[virtual[:2]] = peer
        nursery.start_soon(self._peer_loop, peer)

    async def _send_cmm(self, peer: PeerId) -> None:
        self._cmm_sent[peer] = time.monotonic()
        await self._relay_send(peer, d.call_me_maybe(self.identity, peer, self.candidates()))

    async def _peer_loop(self, peer: PeerId) -> None:
        path = self.peers[peer]
        await self._send_cmm(peer)
        while True:
            now = time.monotonic()
            if now - self._cmm_sent.get(peer, now) >= CMM_INTERVAL:
                await self._send_cmm(peer)
            if path.reported != "relay" and path.direct(now) is None:
                await self._replay(peer)
            for addr in path.pings_due(now):
                txid = d.new_txid()
                path.pinged(addr, txid, now)
                self._send_now(d.ping(self.identity, peer, txid), addr)
            self._report(peer, path, now)
            await trio.sleep(TICK if path.active(now) else IDLE_TICK)

    def _report(self, peer: PeerId, path: PeerPath, now: float) -> None:
        shown = path.describe(now)
        if shown != path.reported:
            how = f" (rtt {path.rtt * 1000:.1f} ms)" if shown != "relay" else ""
            was = "" if shown != "relay" else f"; {path.reported} went quiet"
            log.info("path to %s...: %s%s%s", str(peer)[:12], shown, how, was)
            path.reported = shown

    async def _replay(self, peer: PeerId) -> None:
        """Resend through the relay the newest datagrams the dead path may have swallowed.

        Not needed for correctness (QUIC retransmits), but QUIC only notices a silent path
        after its probe timeouts, which back off while the path is dead: seconds more. A
        replayed datagram it already had is dropped as a duplicate; one it lacked is
        acknowledged, and those acknowledgements make it retransmit older losses at once."""
        recent = self._recent.pop(peer, deque())
        size = self._recent_bytes.pop(peer, 0)
        for data in recent:
            await self._relay_send(peer, data)
        log.info("path to %s...: replayed %d datagrams (%d bytes) through the relay",
                 str(peer)[:12], len(recent), size)  # fmt: skip

    def describe(self, peer: PeerId) -> str:
        path = self.peers.get(peer)
        return "relay" if path is None else path.describe(time.monotonic())

    async def on_relayed(self, src: PeerId, data: bytes) -> None:
        """A disco message that came through the relay (a CALL_ME_MAYBE)."""
        try:
            msg = d.decode(data, self.identity.peer_id)
        except d.DiscoRefused as exc:
            log.debug("disco from the relay dropped: %s", exc)
            return
        path = self.peers.get(src)
        if msg.sender != src or msg.kind != d.CALL_ME_MAYBE or path is None:
            return
        now = time.monotonic()
        path.add_candidates(msg.candidates, now)
        if now - self._cmm_sent.get(src, float("-inf")) >= CMM_ANSWER_GAP:
            await self._send_cmm(src)

    # -- data ------------------------------------------------------------------------------

    async def send(self, peer: PeerId, data: bytes) -> bool:
        """Send ``data`` on the peer's direct path; False when there is none (use the
        relay)."""
        path = self.peers.get(peer)
        addr = path.direct(time.monotonic()) if path is not None else None
        if addr is None or self._sock is None:
            return False  # (in endpoint mode the endpoint sends direct datagrams itself)
        await send(self._sock, data, addr)  # when lost: the pings notice, QUIC retransmits
        self._remember(peer, data)
        return True

    def _remember(self, peer: PeerId, data: bytes) -> None:
        """Keep the newest datagrams sent directly, for :meth:`_replay`."""
        self.sent_direct += 1
        recent = self._recent.setdefault(peer, deque())
        recent.append(data)
        size = self._recent_bytes.get(peer, 0) + len(data)
        while size > REPLAY_BYTES:
            size -= len(recent.popleft())
        self._recent_bytes[peer] = size

    def direct_path(self, addr: SocketAddress) -> Address | None:
        """The direct path now in use for the peer whose shim is ``addr`` (None: ``addr`` is
        no shim, or its peer has no direct path): where that peer's host really is (the
        ring's TCP data plane dials it)."""
        peer = self._peer_at.get(addr[:2])
        return None if peer is None else self.peers[peer].direct(time.monotonic())

    def route(self, data: bytes, addr: SocketAddress) -> SocketAddress:
        """Endpoint mode: where a QUIC datagram for ``addr`` goes -- a peer's direct path
        when ``addr`` is its shim and the path is up, else ``addr`` itself."""
        peer = self._peer_at.get(addr[:2])
        if peer is None:
            return addr
        real = self.peers[peer].direct(time.monotonic())
        if real is None:
            return addr
        self._remember(peer, data)
        return real

    def inbound(self, addr: SocketAddress) -> SocketAddress:
        """Endpoint mode: the address QUIC knows the sender by -- its shim's, when ``addr``
        is a direct path the peer proved -- else ``addr`` itself."""
        peer = self._by_addr.get(addr[:2])
        if peer is None or not self.peers[peer].accepts(addr[:2], time.monotonic()):
            return addr
        self.received_direct += 1
        return self._virtual[peer]

    def _on_foreign(self, data: bytes, addr: SocketAddress) -> None:
        """Endpoint mode: a non-QUIC datagram on the QUIC socket."""
        if d.is_disco(data):
            self._on_disco(data, addr[:2])
        elif data[:1] == bytes([w.OBSERVED]) and data[1 : 1 + w.TXID] == self._observe_txid:
            self._on_observed(data)
        elif self._chained is not None:
            self._chained(data, addr)

    async def run(self) -> None:
        """Read the direct socket: QUIC datagrams from proved addresses, disco, OBSERVED."""
        sock = self._sock
        if sock is None:
            raise RuntimeError(
                "DirectPaths.run reads a direct socket: this one shares an endpoint's"
            )
        while True:
            for data, source in await receive_batch(sock):
                if not data:
                    continue
                addr = source[:2]
                if data[0] & 0xC0:
                    peer = self._by_addr.get(addr)
                    path = self.peers.get(peer) if peer is not None else None
                    if (
                        peer is not None
                        and path is not None
                        and path.accepts(addr, time.monotonic())
                    ):
                        self.received_direct += 1
                        await self._deliver(peer, data)
                elif d.is_disco(data):
                    self._on_disco(data, addr)
                elif data[0] == w.OBSERVED and addr == tuple(self._relay[:2]):
                    self._on_observed(data)

    def _on_observed(self, data: bytes) -> None:
        if data[1 : 1 + w.TXID] != self._observe_txid or not self._observe_txid:
            return
        try:
            self.reflexive = w.parse_hostport(data[1 + w.TXID :].decode(errors="replace"))
        except ValueError:
            return
        self._observed.set()

    def _on_disco(self, data: bytes, addr: Address) -> None:
        try:
            msg = d.decode(data, self.identity.peer_id)
        except d.DiscoRefused as exc:
            log.debug("disco from %s dropped: %s", addr, exc)
            return
        path = self.peers.get(msg.sender)
        if path is None:
            return  # only peers that reached us through the relay may punch
        now = time.monotonic()
        if msg.kind == d.PING:
            path.on_ping(addr, now)
            self._by_addr[addr] = msg.sender
            self._send_now(d.pong(self.identity, msg.sender, msg.txid, addr), addr)
        elif msg.kind == d.PONG and path.on_pong(msg.txid, addr, now):
            self._by_addr[addr] = msg.sender
            self._report(msg.sender, path, now)


__all__ = ["DIRECT_ENV", "DirectPaths", "direct_enabled"]
