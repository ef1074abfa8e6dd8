"""``burn-remote relay``: the discovery and relay node.

It keeps signed address records (refusing unsigned, forged, stale and replayed ones, and
any but a registered peer's own), and forwards opaque datagrams between peers that proved
their key by signing a challenge. Keys cost nothing to make, so every table entry and every
budget is charged to its source IP address and network as well as to its id
(``_relay_peers``): one host cannot fill the relay or take more than its share. What
it forwards is QUIC, encrypted end to end between the peers; the relay has no session key
and never parses a payload. Sans-I/O core (:class:`RelayState`: datagram in, datagrams out)
under a thin trio loop, so tests can drive it without sockets.
"""

from __future__ import annotations

import logging
import secrets
import signal
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import BinaryIO

import trio

from ..protocol.relay import _wire as w
from ..protocol.relay._records import AddressRecord, RecordRefused, RecordStore
from ..protocol.transport import Identity, PeerId
from ._relay_limits import (
    CONTROL_BURST,
    HOST_CONTROL_BURST,
    HOST_CONTROL_RATE,
    LIMIT_LOG_INTERVAL,
    MAX_CONTROL_SOURCES,
    RelayLimits,
    TokenBucket,
)
from ._relay_peers import REGISTRATION_TTL, Challenges, PeerTable, source_of

log = logging.getLogger("burn_remote.relay")


@dataclass
class RelayStats:
    """Counters of one relay (``burn-remote relay`` logs them on exit)."""

    forwarded: int = 0
    forwarded_bytes: int = 0
    refused_records: int = 0
    accepted_records: int = 0
    auth_failures: int = 0
    unroutable: int = 0
    observed: int = 0
    """OBSERVE requests answered (peers learning their public address)."""
    limited: int = 0
    """Datagrams dropped because their sender was over a per-peer or per-address limit."""
    refused_registrations: int = 0
    """AUTHs that verified but were refused: their source (IP, network) or the table was full."""
    limited_bytes: int = 0


@dataclass
class _PeerBudget:
    bytes: TokenBucket
    datagrams: TokenBucket
    logged: float = float("-inf")


@dataclass
class RelayState:
    """The relay's logic without sockets: ``handle(datagram, addr, now)`` -> datagrams out."""

    identity: Identity
    store: RecordStore = field(default_factory=RecordStore)
    capture: BinaryIO | None = None
    """If set, every forwarded datagram is appended here (4-byte length, bytes): tests
    check that what the relay sees is ciphertext."""
    stats: RelayStats = field(default_factory=RelayStats)
    limits: RelayLimits = field(default_factory=RelayLimits)

    def __post_init__(self) -> None:
        self.peers = PeerTable()
        self._nonces = Challenges()
        self._budgets: dict[PeerId, _PeerBudget] = {}
        self._host_budgets: dict[str, _PeerBudget] = {}
        """Per IP address with registered peers (gone with its last peer)."""
        self._control: OrderedDict[tuple, TokenBucket] = OrderedDict()
        self._host_control: OrderedDict[str, TokenBucket] = OrderedDict()
        self._control_logged: dict[tuple, float] = {}

    def handle(self, data: bytes, addr: tuple, now: float) -> list[tuple[bytes, tuple]]:
        """One datagram from ``addr`` at wall-clock ``now``; returns (datagram, address)s."""
        if not data:
            return []
        kind, body = data[0], data[1:]
        try:
            if kind == w.SEND:
                return self._send(body, addr, now)
            if not self._control_allowed(addr, len(data), now):
                return []
            if kind == w.HELLO and len(body) == 32:
                nonce = secrets.token_bytes(32)
                self._nonces.put(addr, nonce)
                return [(bytes([w.CHALLENGE]) + self.identity.peer_id.raw + nonce, addr)]
            if kind == w.AUTH and len(body) == 96:
                return [self._auth(body, addr, now)]
            if kind == w.PUBLISH:
                return [self._publish(body, addr, now)]
            if kind == w.LOOKUP and len(body) == 32:
                rec = self.store.get(PeerId(body), now)
                if rec is None:
                    return [_err("unknown peer", addr)]
                return [(bytes([w.RECORD]) + rec.encode(), addr)]
            if kind == w.OBSERVE and len(body) >= w.OBSERVE_MIN:
                reply = bytes([w.OBSERVED]) + body[: w.TXID] + w.addr_text(addr).encode()
                if len(reply) > len(data):
                    return []  # never answer with more than was asked (no amplification)
                self.stats.observed += 1
                return [(reply, addr)]
            if kind == w.PING:
                peer = self.peers.at(addr)
                if peer is None:
                    return [_err("not registered", addr)]
                self.peers.touch(peer, now)
                return [(bytes([w.OK]) + b"pong", addr)]
        except ValueError as exc:
            return [_err(f"malformed request: {exc}", addr)]
        return []  # unknown type: silence, like any UDP service

    def _auth(self, body: bytes, addr: tuple, now: float) -> tuple[bytes, tuple]:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ed25519

        nonce = self._nonces.pop(addr)
        if nonce is None:
            self.stats.auth_failures += 1
            return _err("no challenge outstanding for this address (send HELLO first)", addr)
        peer = PeerId(body[:32])
        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(peer.raw)
            key.verify(body[32:], w.auth_message(self.identity.peer_id.raw, nonce))
        except (InvalidSignature, ValueError):
            self.stats.auth_failures += 1
            return _err("challenge signature does not verify", addr)
        why, removed = self.peers.register(peer, addr, now)
        for gone, reg in removed:
            self._forget(gone, reg.source.host)
        if why:
            self.stats.refused_registrations += 1
            return _err(why, addr)
        return (bytes([w.OK]) + b"registered", addr)

    def _publish(self, body: bytes, addr: tuple, now: float) -> tuple[bytes, tuple]:
        """Only a registered peer publishes, and only its own record: a record is charged
        to the peer and the source that sent it, so ids made for nothing fill nothing."""
        try:
            rec = AddressRecord.decode(body)
            peer = self.peers.at(addr)
            if peer is None or not self.peers.live(peer, now):
                raise RecordRefused("not registered: HELLO and AUTH from this address first")
            if rec.peer != peer:
                raise RecordRefused(
                    f"record of {str(rec.peer)[:12]}... sent by {str(peer)[:12]}...: a peer "
                    "publishes only its own record"
                )
            src = source_of(addr)
            self.store.accept(rec, now, (src.host, src.net), lambda p: not self.peers.live(p, now))
        except RecordRefused as exc:
            self.stats.refused_records += 1
            return _err(f"record refused: {exc}", addr)
        self.stats.accepted_records += 1
        return (bytes([w.OK]) + b"stored", addr)

    def _send(self, body: bytes, addr: tuple, now: float) -> list[tuple[bytes, tuple]]:
        src = self.peers.at(addr)
        if src is None or len(body) <= 32:
            self.stats.unroutable += 1
            return [_err("not registered", addr)] if src is None else []
        entry = self.peers.get(PeerId(body[:32]))
        if entry is None or now - entry.seen > REGISTRATION_TTL:
            self.stats.unroutable += 1
            return []
        self.peers.touch(src, now)
        payload = body[32:]
        if not self._budget_allows(src, source_of(addr).host, len(payload), now):
            return []
        self.stats.forwarded += 1
        self.stats.forwarded_bytes += len(payload)
        if self.capture is not None:
            self.capture.write(len(payload).to_bytes(4, "big") + payload)
        return [(bytes([w.RECV]) + src.raw + payload, entry.addr)]

    def _budget_allows(self, peer: PeerId, host: str, size: int, now: float) -> bool:
        """Charge one forwarded datagram to ``peer`` and to its IP address ``host``; False
        (and counted) when either is over a limit."""
        lim = self.limits
        budget = self._budgets.get(peer)
        if budget is None:
            budget = _PeerBudget(
                TokenBucket(lim.peer_bandwidth, now), TokenBucket(lim.peer_datagram_rate, now)
            )
            self._budgets[peer] = budget
        shared = self._host_budgets.get(host)
        if shared is None:
            shared = _PeerBudget(
                TokenBucket(lim.host_bandwidth, now), TokenBucket(lim.host_datagram_rate, now)
            )
            self._host_budgets[host] = shared
        if _afford(budget, size, now) and _afford(shared, size, now):
            _charge(budget, size)
            _charge(shared, size)
            return True
        self.stats.limited += 1
        self.stats.limited_bytes += size
        if now - budget.logged >= LIMIT_LOG_INTERVAL:
            budget.logged = now
            log.warning(
                "peer %s is over its relay limit (%s): its datagrams are dropped",
                peer,
                self.limits.describe(),
                extra={"event": "relay_peer_limited", "peer": str(peer)},
            )
        return False

    def _control_allowed(self, addr: tuple, size: int, now: float) -> bool:
        """Charge one control request to its source address and to its IP over all ports
        (bounded tables, LRU)."""
        if self.limits.control_rate <= 0:
            return True
        bucket = self._control.get(addr)
        if bucket is None:
            bucket = TokenBucket(self.limits.control_rate, now, CONTROL_BURST)
            self._control[addr] = bucket
            while len(self._control) > MAX_CONTROL_SOURCES:
                old, _ = self._control.popitem(last=False)
                self._control_logged.pop(old, None)
        self._control.move_to_end(addr)
        host = source_of(addr).host
        shared = self._host_control.get(host)
        if shared is None:
            shared = TokenBucket(HOST_CONTROL_RATE, now, HOST_CONTROL_BURST)
            self._host_control[host] = shared
            while len(self._host_control) > MAX_CONTROL_SOURCES:
                self._host_control.popitem(last=False)
        self._host_control.move_to_end(host)
        if bucket.take(1, now) and shared.take(1, now):
            return True
        self.stats.limited += 1
        self.stats.limited_bytes += size
        if now - self._control_logged.get(addr, float("-inf")) >= LIMIT_LOG_INTERVAL:
            self._control_logged[addr] = now
            log.warning(
                "%s sends control requests faster than %g/s: dropped",
                w.addr_text(addr),
                self.limits.control_rate,
                extra={"event": "relay_control_limited"},
            )
        return False

    def _forget(self, peer: PeerId, host: str) -> None:
        """``peer`` left the table: its budget goes, and its host's with its last peer."""
        self._budgets.pop(peer, None)
        if not self.peers.on_host(host):
            self._host_budgets.pop(host, None)


def _afford(budget: _PeerBudget, size: int, now: float) -> bool:
    """Whether ``budget`` has room for one datagram of ``size`` (nothing taken yet)."""
    return budget.datagrams.can(1, now) and budget.bytes.can(size, now)


def _charge(budget: _PeerBudget, size: int) -> None:
    budget.datagrams.take(1, budget.datagrams.last)
    budget.bytes.take(size, budget.bytes.last)


def _err(text: str, addr: tuple) -> tuple[bytes, tuple]:
    return (bytes([w.ERR]) + text.encode(), addr)


async def serve_relay(
    state: RelayState,
    bind: tuple[str, int],
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the relay on ``bind`` until cancelled; ``task_status`` gets the bound address."""
    import socket

    family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_DGRAM)
    with sock:
        await sock.bind(bind)
        task_status.started(sock.getsockname()[:2])
        while True:
            try:
                data, addr = await sock.recvfrom(65535)
            except OSError:
                continue
            for out, dest in state.handle(data, addr, time.time()):
                try:
                    await sock.sendto(out, dest)
                except OSError:  # unreachable peer: the datagram is lost, QUIC retransmits
                    pass


class Heartbeat:
    """When the relay's loop last turned (its ``/healthz`` reports a stalled loop), and how
    late that tick woke (``lag``: the loop's delay, about 0 when idle)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.lag = 0.0

    async def run(self) -> None:
        from ._status import HEARTBEAT

        while True:
            self.last = time.monotonic()
            await trio.sleep(HEARTBEAT)
            self.lag = max(0.0, time.monotonic() - self.last - HEARTBEAT)


def run_relay(
    identity: Identity,
    bind: tuple[str, int],
    capture: str | None = None,
    http: tuple[str, int] | None = None,
    limits: RelayLimits | None = None,
    http_token: str | None = None,
) -> int:
    """``burn-remote relay``: serve until SIGINT/SIGTERM, printing the peer id and address;
    ``http``: also serve /healthz and /metrics there (``http_token``: the bearer token
    /metrics wants)."""
    cap = open(capture, "ab", buffering=0) if capture else None  # noqa: SIM115
    state = RelayState(identity, capture=cap, limits=limits or RelayLimits())
    beat = Heartbeat()
    port_http = None
    if http is not None:
        from ._http import OperatorPort, _RelayCollector, relay_health, warn_if_open

        warn_if_open(http, http_token, "burn-remote relay")
        try:
            port_http = OperatorPort(
                None, http, relay_health(state, beat), _RelayCollector(state), http_token
            )
        except OSError as exc:
            print(f"burn-remote relay: cannot serve --http on {w.addr_text(http)}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 1

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_relay, state, bind)
            nursery.start_soon(beat.run)
            print("burn-remote relay", flush=True)
            print(f"peer id: {identity.peer_id}", flush=True)
            print(f"listening on: {w.addr_text((host, port))}", flush=True)
            print(f"limits: {state.limits.describe()}", flush=True)
            if port_http is not None:
                where = w.addr_text(port_http.address)
                print(f"http: http://{where} (/healthz, /metrics)", flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    finally:
        if cap is not None:
            cap.close()
        if port_http is not None:
            port_http.close()
    print(f"burn-remote relay: stopped; {state.stats}", flush=True)
    sys.stdout.flush()
    return 0


__all__ = ["RelayLimits", "RelayState", "RelayStats", "run_relay", "serve_relay"]
