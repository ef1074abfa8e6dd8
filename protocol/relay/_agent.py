"""Relay use from the two kinds of node.

* A **server** (``burn-remote serve --relay``) runs :func:`serve_via_relay` in its nursery:
  it registers, publishes its signed record (refreshed before it expires, with a higher
  sequence number each time) and accepts relayed clients into its QUIC port.
* A **client** (``RemoteDevice("peer-id")`` with no address-book entry) calls
  :func:`resolve_via_relay`: look the record up, try the direct addresses with a QUIC
  handshake, and when none answers, dial through the relay. The client's relay association
  lives on a background thread (:class:`RelayAgent`) for the life of the process.
"""

from __future__ import annotations

import logging
import os
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ..addressing import SocketAddress, parse_host_port
from ..transport import (
    Endpoint,
    EndpointConfig,
    Identity,
    PeerId,
    PeerRejected,
    TransportError,
    ask_resolvers,
    default_address_book_path,
    default_key_path,
)
from ._client import RelayClient, RelayError
from ._observe import observe_address
from ._records import MAX_ADDRESSES, AddressRecord

log = logging.getLogger("burn_remote.relay")

RELAY_ENV = "BURN_REMOTE_RELAY"
"""``host:port`` of the relay a client uses when the address book has no entry."""
PROBE_TIMEOUT_ENV = "BURN_REMOTE_PROBE_TIMEOUT"
"""Seconds a direct address gets to complete a QUIC handshake before the relay is used
(default 3)."""


def configured_relay(book: str | Path | None = None) -> str | None:
    """``$BURN_REMOTE_RELAY``, else a top-level ``relay = "host:port"`` in the address book."""
    if os.environ.get(RELAY_ENV):
        return os.environ[RELAY_ENV]
    path = Path(book) if book else default_address_book_path()
    try:
        relay = tomllib.loads(path.read_text()).get("relay")
    except (FileNotFoundError, tomllib.TOMLDecodeError):
        return None
    return relay if isinstance(relay, str) else None


async def serve_via_relay(
    identity: Identity,
    relay: str,
    quic_address: tuple[str, int],
    addresses: list[str],
    *,
    ttl: int = 600,
    endpoint: Endpoint | None = None,
    punch: Endpoint | None = None,
    task_status: trio.TaskStatus[RelayClient] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register with ``relay``, publish our record, and forward relayed peers to our QUIC
    port until cancelled. Republishes at a third of the TTL so the record never lapses.

    With ``endpoint`` (our QUIC endpoint), each record also lists the address at which the
    relay sees that endpoint's socket (:func:`observe_address`): behind a NAT, the NAT's
    public mapping. ``client.observed`` holds the last one seen (None: none yet).

    With ``punch`` (our QUIC endpoint), relayed peers are moved to direct paths from that
    endpoint's socket (see ``_direct``)."""
    async with RelayClient.open(identity, parse_host_port(relay), endpoint=punch) as client:
        client.serve_to = relayed_target(quic_address, client.local_host)

        async def record() -> AddressRecord:
            listed = list(addresses)
            if endpoint is not None:
                try:
                    client.observed = await observe_address(endpoint, parse_host_port(relay))
                except RelayError as exc:
                    log.warning("address discovery through %s failed: %s", relay, exc)
                if client.observed is not None and client.observed not in listed:
                    listed.append(client.observed)
            return AddressRecord.create(identity, listed[:MAX_ADDRESSES], relay, ttl=ttl)

        await client.publish(await record())
        task_status.started(client)
        while True:
            await trio.sleep(max(1.0, ttl / 3))
            try:
                await client.publish(await record())
            except (RelayError, ValueError):
                pass  # try again next round; the old record is still valid for 2/3 of its TTL


def relayed_target(quic_address: tuple[str, int], local_host: str) -> tuple[str, int]:
    """Where relayed datagrams enter our QUIC port. A wildcard listener is reached at the
    address our relay socket uses (``local_host``), the one the tunnel's shims bind to: its
    replies then leave from the address the shim expects. (Loopback would not do: a socket
    bound to the wildcard answers a shim on the host's own address from that address, and
    the shim drops datagrams from any other source.)"""
    host, port = quic_address
    if host not in ("0.0.0.0", "::"):
        return (host, port)
    if (":" in local_host) == (host == "::"):
        return (local_host, port)
    return ("127.0.0.1" if host == "0.0.0.0" else "::1", port)


class RelayAgent:
    """A relay association on a daemon thread, shared by every RemoteDevice of the process."""

    _agents: dict[tuple[str, str], RelayAgent] = {}
    _lock = threading.Lock()

    def __init__(self, identity: Identity, relay: str) -> None:
        self.identity = identity
        self.relay = relay
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._client: RelayClient | None = None
        self._error: BaseException | None = None
        self._cancel: trio.CancelScope | None = None
        self._thread = threading.Thread(target=self._run, name="burn-remote-relay", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._client is None:
            raise RelayError(f"cannot use relay {relay}: {self._error}")

    @classmethod
    def get(cls, relay: str, key_path: str | Path | None = None) -> RelayAgent:
        """The process's agent for ``relay`` and this key, started on first use."""
        identity = Identity.load_or_create(key_path or default_key_path())
        k = (relay, str(identity.peer_id))
        with cls._lock:
            agent = cls._agents.get(k)
            if agent is None or agent._client is None:
                agent = cls._agents[k] = cls(identity, relay)
            return agent

    @classmethod
    def close_all(cls) -> None:
        """End every agent of the process (their RemoteDevices then fail with a clear
        "stopped" error). An agent otherwise lives as long as the process and keeps
        re-registering with a relay that went away, which is right for a client that
        outlives a relay restart, wrong for one that is done with the relay."""
        with cls._lock:
            agents, cls._agents = list(cls._agents.values()), {}
        for agent in agents:
            agent.close()

    def close(self) -> None:
        """Leave the relay and stop the agent's thread."""
        token, scope = self._token, self._cancel
        if token is not None and scope is not None and self._thread.is_alive():
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass
        self._thread.join(10)

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self._cancel:
                async with RelayClient.open(self.identity, parse_host_port(self.relay)) as client:
                    self._client = client
                    self._ready.set()
                    await trio.sleep_forever()
            self._error = RuntimeError("closed")

        try:
            trio.run(main)
        except BaseException as exc:  # reported to the caller of __init__ / later calls
            self._error = exc
        finally:
            self._client = None
            self._ready.set()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``await fn(client, *args)`` on the agent's thread and return its result."""
        if self._client is None or self._token is None:
            raise RelayError(f"relay agent for {self.relay} stopped: {self._error}")
        return trio.from_thread.run(fn, self._client, *args, trio_token=self._token)

    def lookup(self, peer: PeerId) -> AddressRecord | None:
        return self.call(RelayClient.lookup, peer)

    def dial(self, peer: PeerId) -> tuple[str, int]:
        return self.call(RelayClient.dial, peer)

    def path_of(self, address: SocketAddress) -> str | None:
        """Which way our tunnel to the peer at ``address`` (a shim) goes now: ``"relay"``
        or ``"direct host:port"``; None when ``address`` is not one of our shims."""
        client = self._client
        return None if client is None else client.path_of(address)

    def probe(self, peer: PeerId, address: tuple[str, int]) -> bool:
        """Whether a QUIC handshake with ``peer`` at ``address`` gets an answer (even a
        refusal: that still proves the path works)."""
        return self.call(_probe, peer, address)

    def first_reachable(
        self, peer: PeerId, addresses: list[tuple[str, int]]
    ) -> tuple[str, int] | None:
        """The first of ``addresses`` (in the record's order) whose probe gets an answer.
        All are probed at once, so a record listing a dead local address and a dead public
        one costs one probe timeout before the relay, not two."""
        return self.call(_first_reachable, peer, addresses)


async def _first_reachable(
    client: RelayClient, peer: PeerId, addresses: list[tuple[str, int]]
) -> tuple[str, int] | None:
    answered = [False] * len(addresses)

    async def one(i: int) -> None:
        answered[i] = await _probe(client, peer, addresses[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(addresses)):
            nursery.start_soon(one, i)
    return next((a for a, ok in zip(addresses, answered) if ok), None)


async def _probe(client: RelayClient, peer: PeerId, address: tuple[str, int]) -> bool:
    timeout = float(os.environ.get(PROBE_TIMEOUT_ENV, "3"))
    bind = ("::", 0) if ":" in address[0] else ("0.0.0.0", 0)
    config = EndpointConfig(handshake_timeout=timeout, keepalive_interval=None)
    reachable = False
    try:
        async with Endpoint.open(client.identity, bind=bind, config=config) as ep:
            with trio.move_on_after(timeout + 1):
                try:
                    conn = await ep.connect(peer, address)
                    reachable = True
                    await conn.close("probe", flush_timeout=0.5)
                except PeerRejected:
                    reachable = True  # refused us, but it answered: the path works
                except (TransportError, OSError):
                    pass
    except* (TransportError, OSError):
        pass
    return reachable


def is_relay_tunnel(address: SocketAddress) -> bool:
    """Whether ``address`` (as :func:`resolve_via_relay` returned it) is this process's end of
    a relay tunnel: meaningful here only, so it must not be handed to another node."""
    with RelayAgent._lock:
        agents = list(RelayAgent._agents.values())
    return any(a._client is not None and a._client.is_tunnel(address) for a in agents)


def tunnel_path(address: SocketAddress) -> str | None:
    """``"relay"`` or ``"direct host:port"`` when ``address`` is this process's end of a relay
    tunnel (see :func:`is_relay_tunnel`), else None: what ``RemoteDevice.stats()`` reports."""
    with RelayAgent._lock:
        agents = list(RelayAgent._agents.values())
    for agent in agents:
        shown = agent.path_of(address)
        if shown is not None:
            return shown
    return None


def resolve_peer(peer: str, key_path: str | Path | None = None) -> tuple[str, int] | None:
    """The address to dial ``peer`` at: the transport's resolver hooks first, then the
    configured relay; None if nobody knows."""
    return ask_resolvers(peer) or resolve_via_relay(peer, key_path=key_path)


def resolve_via_relay(
    peer: str, relay: str | None = None, key_path: str | Path | None = None
) -> tuple[str, int] | None:
    """An address at which ``peer`` can be dialled: a direct one from its signed record when a
    handshake gets through, else a local tunnel through the relay. None: relay has no record."""
    relay = relay or configured_relay()
    if relay is None:
        return None
    pid = PeerId.parse(peer)
    agent = RelayAgent.get(relay, key_path)
    rec = agent.lookup(pid)
    if rec is None:
        return None
    addresses = []
    for text in rec.addresses:
        try:
            addresses.append(parse_host_port(text))
        except ValueError:
            continue
    direct = agent.first_reachable(pid, addresses) if addresses else None
    if direct is not None:
        return direct
    if rec.relay and rec.relay != relay:
        agent = RelayAgent.get(rec.relay, key_path)
    return agent.dial(pid)


__all__ = [
    "RELAY_ENV",
    "RelayAgent",
    "configured_relay",
    "is_relay_tunnel",
    "resolve_peer",
    "resolve_via_relay",
    "serve_via_relay",
    "tunnel_path",
]
