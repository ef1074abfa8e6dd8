"""Where this server may dial another server: only addresses it resolves itself.

A server dials other servers on a client's behalf (a Fetch of a server-to-server move, a
group link). The client names the peer id, never the address: were the server to dial an
address a client chose, any authorised peer could make it send QUIC handshakes to any host
the server can reach (the issue measured 9.4 KB sent for a 108-byte request), behind the
operator's firewall included. So :func:`dial_peer` finds the address itself, in this order:

1. ``serve --peer PEER@HOST:PORT`` (repeatable): peers configured at start;
2. the server's address book: ``--address-book FILE``, default ``DATA_DIR/addresses.toml``
   (without ``--data-dir``, the node's own book, ``$BURN_REMOTE_ADDRESS_BOOK`` or
   ``$BURN_REMOTE_HOME/addresses.toml``), in the client's ``[[peer]]`` format, read again
   whenever it changes; an edit that does not parse keeps the last good book and is logged;
3. the signed record that the peer published on this server's relay (``serve --relay``):
   its direct addresses, else the relay's tunnel.

:func:`dial_targets` gives the same addresses to threads that dial with the blocking client
(a job training on other servers).

A record on the relay is signed by the peer it describes, so a hostile peer can list any
address in its own record; every dial is therefore also counted against the requesting
peer's rate (``SERVER_DIALS_PER_MINUTE``). There is no local-network discovery yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ..protocol.addressing import Address, format_host_port
from ..protocol.transport import (
    AddressBook,
    Connection,
    Endpoint,
    PeerId,
    PeerRejected,
    TransportError,
    format_peer_address,
    parse_peer_address,
)
from ..protocol.transport._paths import default_address_book_path

if TYPE_CHECKING:
    from ._state import ServerState

log = logging.getLogger("burn_remote.server")

ADDRESS_BOOK_NAME = "addresses.toml"
"""The server's address book inside its data directory."""
DIAL_TIMEOUT = 10.0
"""Seconds one address of a configured peer gets before the next address (or the relay)."""


class PeerDirectory:
    """The peers this server knows how to reach, from its own configuration only."""

    def __init__(
        self,
        configured: Sequence[str] = (),
        book: str | Path | None = None,
        relay: str | None = None,
    ) -> None:
        """``configured``: ``PEER@HOST:PORT`` texts (``--peer``); ``book``: the address
        book file (missing: empty). Raises ``ValueError`` naming a bad ``--peer`` and
        ``TransportError`` for a malformed book: a start-up error, so the operator sees it."""
        self.configured: dict[PeerId, list[Address]] = {}
        for text in configured:
            try:
                peer, addr = parse_peer_address(text)
            except ValueError as exc:
                raise ValueError(f"--peer {text!r}: {exc}; expected PEER@HOST:PORT") from None
            if addr is None:
                raise ValueError(f"--peer {text!r}: no address; expected PEER@HOST:PORT")
            self.configured.setdefault(peer, []).append(addr)
        self.relay = relay
        """``serve --relay``: where peers not configured here are looked up."""
        self.book_path = Path(book) if book is not None else None
        self._stamp: tuple[float, int] | None = None
        self._book = AddressBook()
        if self.book_path is not None:
            self._stamp = _stamp(self.book_path)
            self._book = AddressBook.load(self.book_path)

    @classmethod
    def for_server(
        cls,
        configured: Sequence[str],
        book: str | None,
        data_dir: str | None,
        relay: str | None = None,
    ) -> PeerDirectory:
        """``serve``'s directory: ``--address-book``, else the data dir's book, else the
        node's own book."""
        if book is None:
            book = str(Path(data_dir) / ADDRESS_BOOK_NAME) if data_dir else None
        return cls(configured, book if book is not None else default_address_book_path(), relay)

    def addresses(self, peer: PeerId) -> list[Address]:
        """Configured addresses of ``peer`` first, then its address-book entry's."""
        self._reload()
        found = list(self.configured.get(peer, ()))
        entry = self._book.lookup(peer)
        if entry is not None:
            found += [a for a in entry.addresses if a not in found]
        return found

    def describe(self) -> str:
        """Where an operator adds a peer (for refusals)."""
        where = "`serve --peer PEER@HOST:PORT`"
        return f"{where} or {self.book_path}" if self.book_path is not None else where

    def _reload(self) -> None:
        """Read the book again when it changed; a bad edit keeps the last good book."""
        if self.book_path is None:
            return
        stamp = _stamp(self.book_path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._book = AddressBook.load(self.book_path)
        except TransportError as exc:
            log.warning(
                "address book not reloaded, the last good one stays: %s",
                exc,
                extra={"event": "address_book_rejected"},
            )


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime, st.st_size)


async def dial_peer(ep: Endpoint, state: ServerState, peer: str, *, requester: str) -> Connection:
    """The one way the server dials another server (Fetch, group links, moves from relayed
    servers): counted against ``requester``'s dial rate, then the addresses of ``peer`` that
    this server resolves itself (module docstring), each checked to be ``peer`` by TLS.

    Raises:
        LimitExceeded: ``requester`` asked for more than SERVER_DIALS_PER_MINUTE dials.
        TransportError: nothing here knows an address of ``peer``, or none answered; the
            message names where the operator adds it.
        ValueError: ``peer`` is not a peer id.
    """
    pid = PeerId.parse(peer)
    state.allow_dial(requester, time.monotonic())
    directory = state.peers
    tried: list[str] = []
    for addr in directory.addresses(pid):
        with trio.move_on_after(DIAL_TIMEOUT):
            try:
                return await ep.connect(pid, addr)
            except PeerRejected:
                raise
            except (TransportError, OSError) as exc:
                tried.append(f"{format_host_port(*addr)}: {exc}")
                continue
        tried.append(f"{format_host_port(*addr)}: no answer in {DIAL_TIMEOUT:g} s")
    from ._relay_glue import connect_via_relay, has_relay

    if has_relay(ep):
        return await connect_via_relay(ep, str(pid))
    if tried:
        raise TransportError(f"peer {peer[:12]}... did not answer: {'; '.join(tried)}")
    raise TransportError(
        f"this server knows no address of peer {peer[:12]}... and has no relay (--relay): it "
        f"dials only peers it resolves itself; add it with {directory.describe()}"
    )


def dial_targets(
    state: ServerState, peer: str, *, requester: str, key_path: str | Path | None = None
) -> Iterator[str]:
    """What a thread of this server that dials with the blocking client (a job's
    ``RemoteDevice``) tries for ``peer``, in order: ``PEER@HOST:PORT`` texts from the same
    sources as :func:`dial_peer`, the relay's last and only when asked for. One dial is
    counted against ``requester``'s rate when the first is asked for.

    Raises:
        LimitExceeded: past SERVER_DIALS_PER_MINUTE; ValueError: not a peer id.
    """
    pid = PeerId.parse(peer)
    state.allow_dial(requester, time.monotonic())
    directory = state.peers
    for addr in directory.addresses(pid):
        yield format_peer_address(pid, addr)
    if directory.relay:
        from ..protocol.relay import RelayError, resolve_via_relay

        try:
            found = resolve_via_relay(str(pid), relay=directory.relay, key_path=key_path)
        except (RelayError, ValueError, TransportError):
            found = None
        if found is not None:
            yield format_peer_address(pid, found)


__all__ = ["ADDRESS_BOOK_NAME", "DIAL_TIMEOUT", "PeerDirectory", "dial_peer", "dial_targets"]
