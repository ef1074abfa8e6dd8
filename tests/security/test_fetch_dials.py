"""Fetch (a server-to-server move) makes the server dial only a peer whose address it
resolves itself, never an address a client names, and at a bounded rate per peer.

A UDP socket of the test's own stands for "an arbitrary address": anything the server sends
there is a dial the attacker chose. The control case (the same socket configured by the
operator with ``--peer``) shows the socket does see a dial, so the refusals can fail.
"""

from __future__ import annotations

import socket
import time

from burn_remote.protocol import messages as m
from burn_remote.protocol.transport import Identity

QUIET = 2.0
"""Seconds the sink listens after a refusal: a dial's first Initial leaves at once, its
retransmissions within a second."""


class Sink:
    """A UDP socket on loopback that counts the datagrams sent to it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def received(self, seconds: float) -> int:
        """Bytes that arrived within ``seconds``."""
        total = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                total += len(self.sock.recv(65536))
            except TimeoutError:
                pass
        return total

    def close(self) -> None:
        self.sock.close()


def _refusal(c, *msgs) -> m.Error:  # type: ignore[no-untyped-def]
    c.send(*msgs, m.Sync(99))
    got: list = []
    while not any(isinstance(r, m.Ack) for r in got):
        got += c.replies(timeout=60)
    (err,) = [r for r in got if isinstance(r, m.Error)]
    return err


def test_a_fetch_naming_an_address_is_refused_and_nothing_is_dialled(secure, peers, raw, guard_of):
    sink = Sink()
    stranger = str(Identity.generate().peer_id)  # a peer "at" the sink
    server = secure()
    guard = guard_of(server, peers.victim)
    c = raw(server, peers.attacker)
    c.hello()

    err = _refusal(c, m.Fetch(7, stranger, sink.address, b"t" * 32))
    assert err.code == m.FORBIDDEN, err
    assert "resolves itself" in err.message and sink.address in err.message
    # the same peer without an address: the server knows none for it and has no relay
    err = _refusal(c, m.Fetch(8, stranger, "", b"t" * 32))
    assert err.code == m.CAPABILITY, err
    assert "knows no address" in err.message and "--peer" in err.message
    assert sink.received(QUIET) == 0  # not one datagram left for the named address
    got = c.call(m.Read(9, 7))
    assert isinstance(got, m.Error) and got.code == m.MISSING_TENSOR  # nothing stored
    guard.check()

    # Control: an operator who configures that peer at the sink makes the server dial it.
    configured = secure("--peer", f"{stranger}@{sink.address}")
    c2 = raw(configured, peers.attacker)
    c2.hello()
    c2.send(m.Fetch(7, stranger, "", b"t" * 32))
    assert sink.received(QUIET) > 0
    sink.close()


def test_fetch_dials_are_rate_limited_per_peer(secure, peers, raw, guard_of):
    from burn_remote.server._state import SERVER_DIALS_PER_MINUTE

    source = secure()
    server = secure("--peer", source.target)  # the operator told it where the source is
    guard = guard_of(server, peers.victim)
    c = raw(server, peers.attacker)
    c.hello()
    # a made-up token: each Fetch is one dial answered at once with a refusal; past the
    # rate the server refuses to dial at all
    codes = []
    for k in range(SERVER_DIALS_PER_MINUTE + 5):
        fetch = m.Fetch(100 + k, source.peer_id, "", b"t" * 32)
        c.send(fetch, m.Sync(k + 1))
        while True:
            got = c.replies(timeout=60)
            codes += [r.code for r in got if isinstance(r, m.Error)]
            if any(isinstance(r, m.Ack) for r in got):
                break
    assert codes.count(m.CAPABILITY) == SERVER_DIALS_PER_MINUTE  # dialled, refused there
    assert codes.count(m.LIMIT) == 5  # not dialled at all
    guard.check()


def test_the_address_book_is_read_again_and_a_bad_edit_keeps_the_last_good_one(tmp_path):
    from burn_remote.protocol.transport import PeerId
    from burn_remote.server._peers import PeerDirectory

    peer = Identity.generate().peer_id
    book = tmp_path / "addresses.toml"
    directory = PeerDirectory(book=book)  # missing: empty
    assert directory.addresses(peer) == []
    book.write_text(f'[[peer]]\nid = "{peer}"\naddresses = ["10.0.0.5:4433"]\n')
    assert directory.addresses(peer) == [("10.0.0.5", 4433)]
    book.write_text(f'[[peer]]\nid = "{peer}"\naddresses = ["10.0.0.5"]\n')  # no port
    assert directory.addresses(peer) == [("10.0.0.5", 4433)]
    assert directory.addresses(PeerId.parse(str(peer))) == [("10.0.0.5", 4433)]
