"""The endpoint: one UDP socket, the connection-id table, and the receive loop.

Datagrams are read in batches without awaiting between them, fed to their connections, and
each touched connection then drains its events and sends once: acknowledgements and window
updates for a whole batch leave together. A datagram whose destination connection id is
unknown starts a new connection only if the endpoint is serving and it parses as a QUIC
Initial of at least 1200 bytes (RFC 9000 section 14.1) that decrypts; an unknown version
gets a Version Negotiation reply; anything else is dropped without a word.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Protocol

import trio
from aioquic.buffer import Buffer
from aioquic.quic.packet import (
    QuicHeader,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)

from ..addressing import Address, SocketAddress, format_host_port
from ._addressing import Resolver
from ._auth import PeerAuth
from ._authorized import AuthorizedPeers
from ._config import EndpointConfig, qh3_part
from ._connection import Connection, Handler, LegacyRefusal
from ._engine import EndpointEngine, ReceiveLedger
from ._errors import PeerRejected, TransportError
from ._identity import Identity, PeerId
from ._quic import aioquic_connection, client_connection
from ._udp import SEND_LOSS_ERRNOS, size_buffers

log = logging.getLogger("burn_remote.transport")

REFUSED_LOG_EVERY = 10.0
"""Seconds between two ``peer_refused`` log lines for one peer and reason."""
REFUSED_LOG_PEERS = 4096
"""Peers remembered for that throttle (the table is cleared past it: bounded memory)."""

CID_LENGTH = 8
"""Length of the connection ids this endpoint issues (short headers carry no length)."""

_RECV_BATCH = 256
_SOL_UDP = 17
_UDP_SEGMENT = 103  # Linux >= 4.18: one sendmsg carries many equal-size datagrams (GSO)
_UDP_GRO = 104  # Linux >= 5.0: one recvmsg returns many coalesced datagrams (GRO)
_GSO_MAX_SEGMENTS = 64
_GSO_MAX_BYTES = 65000
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4)
_SUPPORTED_VERSIONS = [0x00000001, 0x6B3343CF]

HANDSHAKE_RATE = 20.0
"""New handshakes a second one source address (IP and port) may start (token bucket)."""
HANDSHAKE_BURST = 4.0
"""Handshakes one source address may start at once before the rate applies. One UDP socket
dials one connection at a time (relayed peers each get a tunnel socket of their own), so a
few allow quick reconnects; each admitted Initial costs a TLS handshake (about 2-3 ms of
this loop), and a burst of 40 let one flooding socket delay others' connects by ~100 ms."""
RETRY_ABOVE = 64
"""Half-open handshakes (TLS or key proof not done yet) above which a new client must first
answer a QUIC Retry."""
MAX_UNAUTHENTICATED = 256
"""Connections whose peer has not proven its key yet above which new Initials are dropped:
with ``handshake_timeout`` and ``_auth.PREAUTH_BYTES`` it bounds what strangers hold."""
MAX_TRACKED_SOURCES = 4096
"""Source addresses whose handshake rate is remembered at once."""


class Router(Protocol):
    """What :attr:`Endpoint.router` must offer (see ``relay._direct.DirectPaths``)."""

    def route(self, data: bytes, addr: SocketAddress) -> SocketAddress: ...

    def inbound(self, addr: SocketAddress) -> SocketAddress: ...


class Endpoint:
    """A node's UDP endpoint: dials peers and, while :meth:`serve` runs, accepts them.

    Create with ``async with Endpoint.open(identity, ...) as ep``.
    """

    def __init__(
        self,
        identity: Identity,
        sock: socket.socket,
        config: EndpointConfig,
        authorized: AuthorizedPeers,
        nursery: trio.Nursery,
    ) -> None:
        self.identity = identity
        self._sock = sock
        self._config = config
        self._authorized = authorized
        self._refused_logged: dict[tuple[str, str], float] = {}
        """(peer, reason) -> when its refusal was last logged (``_admit``)."""
        self._nursery = nursery
        self._cids: dict[bytes, Connection] = {}
        self._conns: set[Connection] = set()
        self._handler: Handler | None = None
        self._refuse_legacy: LegacyRefusal | None = None
        self._backlog: deque[tuple[bytes, SocketAddress]] = deque()
        self._writable = trio.Event()
        self.max_connections = 1024
        self.on_foreign_datagram: Callable[[bytes, SocketAddress], None] | None = None
        """Called with datagrams that cannot be QUIC (neither the long-header nor the fixed
        bit set, RFC 9000 17.2-17.3): the relay's address-discovery answers share the QUIC
        socket, as STUN shares it in ICE, so that they observe this socket's NAT mapping."""
        self._admission = _Admission()
        self._server_quic = _server_quic_factory(config)
        self.batch_time = 0.0
        """trio's clock when the receive loop read the batch of datagrams it is working on
        (what a ``FrameStream.on_frame`` fast path may take for "now" instead of reading
        the clock again)."""
        self.router: Router | None = None
        """A path layer under QUIC (hole punching, ``relay._direct``): maps the address a
        connection knows a peer by to where its datagrams really go, and back. QUIC never
        sees the real address, so a path change is no migration to it."""
        # Off by default: on loopback, GSO measured ~2x slower and GRO neutral (bench).
        self._gso = config.udp_offload and _try_setsockopt(sock, _UDP_SEGMENT, 0)
        self._gro = config.udp_offload and _try_setsockopt(sock, _UDP_GRO, 1)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        identity: Identity,
        bind: tuple[str, int] = ("127.0.0.1", 0),
        *,
        config: EndpointConfig | None = None,
        authorized_peers: AuthorizedPeers | Iterable[PeerId] | str | os.PathLike[str] | None = None,
        allow_any: bool = False,
    ) -> AsyncIterator[Endpoint]:
        """Bind a UDP socket and run the endpoint until the block exits.

        Args:
            identity: this node's key; its certificate is presented to every peer.
            bind: local (host, port); port 0 picks a free one.
            config: sizes, windows and timeouts (defaults suit bulk tensors).
            authorized_peers: peer ids (or an ``authorized_peers`` file, re-read when it
                changes, or a ready :class:`AuthorizedPeers`) that :meth:`serve` admits.
                ``None`` admits nobody.
            allow_any: admit every client with a valid certificate (open mode); required
                explicitly so that a missing list never means "everyone".
        """
        config = config or EndpointConfig()
        _server_quic_factory(config)  # fails here, before binding, if qh3 is absent
        if isinstance(authorized_peers, AuthorizedPeers):
            authorized = authorized_peers
        else:
            authorized = AuthorizedPeers(authorized_peers, allow_any=allow_any)
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            size_buffers(sock, config.socket_buffer)
            sock.setblocking(False)
            sock.bind(bind)
            async with trio.open_nursery() as nursery:
                ep = cls(identity, sock, config, authorized, nursery)
                nursery.start_soon(ep._receive_loop)
                nursery.start_soon(ep._backlog_loop)
                try:
                    yield ep
                finally:
                    ep._shutdown()
                    nursery.cancel_scope.cancel()
        finally:
            sock.close()

    @property
    def local_address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        return self._sock.getsockname()[:2]

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id

    @property
    def connections(self) -> frozenset[Connection]:
        """Live connections (both directions); for diagnostics and tests."""
        return frozenset(self._conns)

    async def serve(self, handler: Handler, *, refuse_legacy: LegacyRefusal | None = None) -> None:
        """Accept authorised peers until cancelled; ``handler(conn)`` runs once per
        connection, in that connection's nursery, after the client proved its key and was
        admitted. When the handler returns the connection is closed gracefully.

        A client that offered only an older transport (``LEGACY_ALPNS``) never reaches the
        handler: its first frame is answered with ``refuse_legacy(frame)`` (the application's
        version error, in the form that client reads) and the connection is closed."""
        if self._handler is not None:
            raise RuntimeError("serve() is already running on this endpoint")
        self._handler = handler
        self._refuse_legacy = refuse_legacy
        try:
            await trio.sleep_forever()
        finally:
            self._handler = None
            self._refuse_legacy = None

    async def connect(self, peer: PeerId | str, addr: tuple[str, int]) -> Connection:
        """Dial ``peer`` at ``addr`` and return once both sides accepted each other. The
        connection runs aioquic whatever ``quic_engine`` says: that setting chooses how this
        endpoint *serves* (and how ``BlockingConnection`` dials); what an endpoint dials
        (server-to-server moves, group links, relays) is not on a client's round trip.

        Raises:
            PeerRejected: the server's key is not ``peer``, or the server refused us.
            TransportError: no answer within ``handshake_timeout``, or another failure.
        """
        peer_id = PeerId.parse(peer) if isinstance(peer, str) else peer
        host, port = await _resolve(addr, self._sock.family)
        remote = (host, port) if self._sock.family == socket.AF_INET else (host, port, 0, 0)
        auth, ledger = (
            PeerAuth(self.identity, is_client=True, expected_peer=peer_id),
            ReceiveLedger(),
        )
        quic = client_connection(self.identity, self._config, host, auth.sink, ledger)
        conn = Connection(self, quic, remote, self._config, auth, ledger)
        self._adopt(conn, [quic.host_cid])
        quic.connect(remote, now=trio.current_time())
        conn._transmit()
        self._nursery.start_soon(conn._run)
        await conn._ready.wait()
        if conn._error is not None:
            raise conn._error
        return conn

    async def dial(self, target: str | PeerId, resolver: Resolver | None = None) -> Connection:
        """Connect to ``peer@host:port``, a peer id, or an address-book name, trying each
        address the resolver knows in turn. An authentication failure is final (the next
        address would be the same peer, or the same impostor); other failures move on.

        Raises:
            PeerRejected: as for :meth:`connect`.
            TransportError: every address failed (the message lists each reason).
        """
        peer, addresses = await (resolver or Resolver()).resolve(target)
        failures = []
        for addr in addresses:
            try:
                return await self.connect(peer, addr)
            except PeerRejected:
                raise
            except (TransportError, OSError) as exc:
                failures.append(f"{addr[0]}:{addr[1]}: {exc}")
        raise TransportError(f"could not reach {peer}: " + "; ".join(failures))

    def send_datagram(self, data: bytes, addr: SocketAddress) -> None:
        """Send one non-QUIC datagram from this endpoint's socket (address discovery); lost
        like any UDP datagram when the path drops it."""
        self._sendto(data, addr)

    # -- connection table ------------------------------------------------------------------

    def _adopt(self, conn: Connection, cids: Iterable[bytes]) -> None:
        self._conns.add(conn)
        for cid in cids:
            conn._cids.add(cid)
            self._cids[cid] = conn

    def _register_cid(self, cid: bytes, conn: Connection) -> None:
        self._cids[cid] = conn

    def _forget_cid(self, cid: bytes) -> None:
        self._cids.pop(cid, None)

    def _forget(self, conn: Connection) -> None:
        self._conns.discard(conn)
        for cid in conn._cids:
            if self._cids.get(cid) is conn:
                del self._cids[cid]
        conn._cids.clear()

    def _shutdown(self) -> None:
        for conn in list(self._conns):
            conn._abandon("endpoint closing")

    # -- I/O -------------------------------------------------------------------------------

    def _send_batch(self, datagrams: list[tuple[bytes, SocketAddress]]) -> None:
        """Send datagrams, several per syscall where the kernel offers UDP GSO: a run of
        equal-size datagrams to one address (the last may be shorter) goes out in one
        ``sendmsg``; the wire still carries the same separate datagrams."""
        router = self.router
        if router is not None:
            datagrams = [(data, router.route(data, addr)) for data, addr in datagrams]
        if not self._gso or len(datagrams) == 1 or self._backlog:
            for data, addr in datagrams:
                self._sendto(data, addr)
            return
        i, n = 0, len(datagrams)
        while i < n:
            data, addr = datagrams[i]
            seg = len(data)
            j, total = i + 1, seg
            while j < n and j - i < _GSO_MAX_SEGMENTS:
                nxt, naddr = datagrams[j]
                if naddr != addr or len(nxt) > seg or total + len(nxt) > _GSO_MAX_BYTES:
                    break
                total += len(nxt)
                j += 1
                if len(nxt) < seg:
                    break  # a shorter datagram can only end a GSO run
            if j - i == 1:
                self._sendto(data, addr)
            else:
                self._sendmsg_gso([d for d, _ in datagrams[i:j]], seg, addr)
            i = j

    def _sendmsg_gso(self, parts: list[bytes], seg: int, addr: SocketAddress) -> None:
        try:
            self._sock.sendmsg(
                [b"".join(parts)], [(_SOL_UDP, _UDP_SEGMENT, seg.to_bytes(2, "little"))], 0, addr
            )
        except BlockingIOError:
            for data in parts:
                self._backlog.append((data, addr))
            self._writable.set()
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EIO, errno.EOPNOTSUPP):
                self._gso = False  # the route or device refuses GSO: send one by one
                for data in parts:
                    self._sendto(data, addr)
            elif exc.errno not in SEND_LOSS_ERRNOS:
                raise

    def _sendto(self, data: bytes, addr: SocketAddress) -> None:
        if self._backlog:
            self._backlog.append((data, addr))
            return
        try:
            self._sock.sendto(data, addr)
        except BlockingIOError:
            self._backlog.append((data, addr))
            self._writable.set()
        except OSError as exc:  # e.g. ECONNREFUSED from an ICMP error: the peer is gone
            if exc.errno not in SEND_LOSS_ERRNOS:
                raise

    async def _backlog_loop(self) -> None:
        while True:
            await self._writable.wait()
            self._writable = trio.Event()
            while self._backlog:
                await trio.lowlevel.wait_writable(self._sock)
                while self._backlog:
                    data, addr = self._backlog[0]
                    try:
                        self._sock.sendto(data, addr)
                    except BlockingIOError:
                        break
                    except OSError:
                        pass
                    self._backlog.popleft()

    async def _receive_loop(self) -> None:
        sock = self._sock
        cids = self._cids
        while True:
            await trio.lowlevel.wait_readable(sock)
            touched: dict[Connection, None] = {}
            now = self.batch_time = trio.current_time()
            for data, addr in self._read_batch():
                if not data:
                    continue
                first = data[0]
                if not first & 0xC0:
                    if self.on_foreign_datagram is not None:
                        self.on_foreign_datagram(data, addr)
                    continue
                if first & 0x80:
                    if len(data) < 7:
                        continue
                    dcid = data[6 : 6 + data[5]]
                else:
                    dcid = data[1 : 1 + CID_LENGTH]
                if self.router is not None:
                    addr = self.router.inbound(addr)
                conn = cids.get(dcid)
                if conn is not None:
                    conn._quic.receive_datagram(data, addr, now)
                    touched[conn] = None
                elif first & 0x80 and self._handler is not None:
                    conn = self._accept_initial(data, addr, now)
                    if conn is not None:
                        touched[conn] = None
            for conn in touched:
                conn._process_events()
                quic = conn._quic  # window updates: the readers' _consumed sends them
                if quic.close_pending or (conn._error is None and quic.data_queued):
                    conn._transmit()  # a reply written meanwhile (FrameStream.on_frame)
                    continue
                timer = quic.get_timer()
                if quic.close_pending or (conn._error is None and quic.send_due_at(now, timer)):
                    conn._transmit()
                else:  # the ACK a datagram is owed may be due before the armed timer: after
                    conn._arm(timer)  # a quiet spell that was the idle timeout's, seconds away

    def _read_batch(self) -> list[tuple[bytes, SocketAddress]]:
        """Read what the socket holds now (bounded), splitting GRO-coalesced reads."""
        sock = self._sock
        out: list[tuple[bytes, SocketAddress]] = []
        for _ in range(_RECV_BATCH):
            try:
                if self._gro:
                    data, ancdata, _flags, addr = sock.recvmsg(65536, _GRO_CMSG_SPACE)
                else:
                    data, addr = sock.recvfrom(65536)
                    ancdata = None
            except BlockingIOError:
                break
            except OSError:  # ICMP errors surface here on Linux; nothing to do
                continue
            seg = 0
            if ancdata:
                for level, kind, value in ancdata:
                    if level == _SOL_UDP and kind == _UDP_GRO:
                        seg = int.from_bytes(value[:4], "little")
            if seg and len(data) > seg:
                out.extend((data[k : k + seg], addr) for k in range(0, len(data), seg))
            else:
                out.append((data, addr))
        return out

    def _send_retry(
        self, header: QuicHeader, version: int, addr: SocketAddress, now: float
    ) -> None:
        source_cid = os.urandom(CID_LENGTH)
        token = self._admission.retry.create_token(
            address=addr,
            original_destination_connection_id=header.destination_cid,
            retry_source_connection_id=source_cid,
            now=now,
        )
        self._sendto(
            encode_quic_retry(
                version=version,
                source_cid=source_cid,
                destination_cid=header.source_cid,
                original_destination_cid=header.destination_cid,
                retry_token=token,
            ),
            addr,
        )

    def _admit(self, peer: PeerId, addr: SocketAddress, now: float) -> str | None:
        """The admission policy's answer, logged when it refuses: one structured
        ``peer_refused`` event per peer and reason every REFUSED_LOG_EVERY seconds (a peer
        retrying in a loop does not flood the log)."""
        reason = self._authorized.check(peer)
        if reason is None:
            return None
        key = (str(peer), reason)
        if now - self._refused_logged.get(key, -REFUSED_LOG_EVERY) >= REFUSED_LOG_EVERY:
            if len(self._refused_logged) > REFUSED_LOG_PEERS:
                self._refused_logged.clear()
            self._refused_logged[key] = now
            where = format_host_port(str(addr[0]), int(addr[1]))
            log.warning(
                "peer %s... refused from %s: %s",
                str(peer)[:12],
                where,
                reason,
                extra={"event": "peer_refused", "peer": str(peer), "address": where},
            )
        return reason

    def _accept_initial(self, data: bytes, addr: SocketAddress, now: float) -> Connection | None:
        if self._admission.exhausted(addr, now):  # a flooding source: not even parsed
            return None
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=CID_LENGTH)
        except Exception:  # garbage: any parse failure just drops the datagram
            return None
        if header.version is not None and header.version not in _SUPPORTED_VERSIONS:
            if len(data) >= 1200:
                self._sendto(
                    encode_quic_version_negotiation(
                        source_cid=header.destination_cid,
                        destination_cid=header.source_cid,
                        supported_versions=_SUPPORTED_VERSIONS,
                    ),
                    addr,
                )
            return None
        version = header.version  # (None only in a short header, which is no Initial)
        if version is None or header.packet_type != QuicPacketType.INITIAL or len(data) < 1200:
            return None
        size = self._config.datagram_size_for(addr[0])
        if len(self._conns) >= self.max_connections:
            log.warning("refusing new connection from %s: %d connections", addr, len(self._conns))
            return None
        if not self._admission.allow(addr, now):
            return None  # this source started too many handshakes: its Initial is dropped
        half_open = self._admission.half_open(self._conns)
        if half_open >= MAX_UNAUTHENTICATED:
            return None  # strangers hold enough; each is gone within handshake_timeout
        retry_cid = None
        if half_open > RETRY_ABOVE:
            if not header.token:  # prove the address first: a Retry costs one datagram
                self._send_retry(header, version, addr, now)
                return None
            try:
                original = self._admission.retry.validate_token(
                    address=addr,
                    destination_cid=header.destination_cid,
                    token=header.token,
                    now=now,
                )
            except ValueError:
                return None
            retry_cid, header_dcid = header.destination_cid, original
        else:
            header_dcid = header.destination_cid
        auth = PeerAuth(
            self.identity, is_client=False, authorize=lambda peer: self._admit(peer, addr, now)
        )
        ledger = ReceiveLedger()
        quic = self._server_quic(
            self.identity, self._config, size, header_dcid, retry_cid, auth, ledger
        )
        quic.receive_datagram(data, addr, now)
        if not quic.first_flight_accepted:
            if quic.close_pending:  # it decrypted, but TLS refused the hello (wrong ALPN):
                for datagram, to in quic.datagrams_to_send(now):  # say so with the alert now
                    self._sendto(datagram, to)
            return None  # well-formed header, but it did not decrypt: not a client
        conn = Connection(
            self,
            quic,
            addr,
            self._config,
            auth,
            ledger,
            handler=self._handler,
            refuse_legacy=self._refuse_legacy,
        )
        self._adopt(conn, [header.destination_cid, quic.host_cid])
        self._nursery.start_soon(conn._run)
        return conn


class ServerQuic(Protocol):
    """What makes the engine that answers a client's first Initial (``_server_quic_factory``)."""

    def __call__(
        self,
        identity: Identity,
        config: EndpointConfig,
        size: int,
        odcid: bytes,
        retry_cid: bytes | None,
        auth: PeerAuth,
        ledger: ReceiveLedger,
    ) -> EndpointEngine: ...


def _server_quic_factory(config: EndpointConfig) -> ServerQuic:
    """How this endpoint answers a client's first Initial: aioquic's connection, or qh3's
    (``config.quic_engine``; imported only when asked for). Connections this endpoint dials
    run aioquic either way (``Endpoint.connect``)."""
    if config.quic_engine == "qh3":
        qh3_server_connection = qh3_part("_qh3_server").qh3_server_connection

        def qh3_quic(
            identity: Identity,
            config: EndpointConfig,
            size: int,
            odcid: bytes,
            retry_cid: bytes | None,
            auth: PeerAuth,
            ledger: ReceiveLedger,
        ) -> EndpointEngine:
            return qh3_server_connection(
                identity,
                config,
                size,
                original_destination_connection_id=odcid,
                retry_source_connection_id=retry_cid,
                secrets=auth.sink,
                ledger=ledger,
            )

        return qh3_quic

    def aioquic_quic(
        identity: Identity,
        config: EndpointConfig,
        size: int,
        odcid: bytes,
        retry_cid: bytes | None,
        auth: PeerAuth,
        ledger: ReceiveLedger,
    ) -> EndpointEngine:
        return aioquic_connection(
            identity,
            config,
            size,
            auth.sink,
            ledger,
            is_client=False,
            original_destination_connection_id=odcid,
            retry_source_connection_id=retry_cid,
        )

    return aioquic_quic


class _Admission:
    """Which Initials start a handshake: at most HANDSHAKE_RATE a second (burst
    HANDSHAKE_BURST) from one source address, and, while more than RETRY_ABOVE handshakes are
    half open, only from a client that answered a Retry (it proved it receives at the
    address it claims). aioquic's retry-token handler seals the tokens."""

    def __init__(self) -> None:
        from aioquic.quic.retry import QuicRetryTokenHandler

        self.retry = QuicRetryTokenHandler()
        self._buckets: dict[Address, tuple[float, float]] = {}

    def exhausted(self, addr: SocketAddress, now: float) -> bool:
        """Whether ``addr`` has no handshake left to start now (nothing is spent): checked
        before a datagram is parsed, so a flood from one source costs a lookup each."""
        got = self._buckets.get(addr[:2])
        return got is not None and got[0] + (now - got[1]) * HANDSHAKE_RATE < 1

    def allow(self, addr: SocketAddress, now: float) -> bool:
        key = addr[:2]
        tokens, last = self._buckets.get(key, (HANDSHAKE_BURST, now))
        tokens = min(HANDSHAKE_BURST, tokens + (now - last) * HANDSHAKE_RATE)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return False
        if len(self._buckets) > MAX_TRACKED_SOURCES:  # forget sources that went quiet
            full = HANDSHAKE_BURST / HANDSHAKE_RATE  # seconds after which a bucket is full
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full}
        self._buckets[key] = (tokens - 1, now)
        return True

    def half_open(self, conns: Iterable[Connection]) -> int:
        """Open connections whose peer has not proven its key (TLS or its proof to come,
        or a client of an older transport waiting for its refusal)."""
        return sum(1 for conn in conns if conn.is_unproven)


def _try_setsockopt(sock: socket.socket, option: int, value: int) -> bool:
    """Whether the kernel accepts a UDP-level option (GSO/GRO are Linux-only)."""
    try:
        sock.setsockopt(_SOL_UDP, option, value)
    except OSError:
        return False
    return True


async def _resolve(addr: tuple[str, int], family: int) -> tuple[str, int]:
    host, port = addr[0], int(addr[1])
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    infos = await trio.socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    if not infos:
        raise TransportError(f"cannot resolve {host!r}")
    return str(infos[0][4][0]), port
