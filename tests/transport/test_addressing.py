"""Address literals, the TOML address book, resolver hooks, and dialling through them."""

from __future__ import annotations

import pytest
from burn_remote.protocol.transport import (
    AddressBook,
    Identity,
    PeerRejected,
    Resolver,
    TransportError,
    format_peer_address,
    parse_host_port,
    parse_peer_address,
)

from .conftest import serving, trio_test


def test_host_port_forms():
    assert parse_host_port("127.0.0.1:4433") == ("127.0.0.1", 4433)
    assert parse_host_port("[::1]:4433") == ("::1", 4433)
    assert parse_host_port("gpu.local:1") == ("gpu.local", 1)
    for bad in ["nohost", "::1:4433", "h:0", "h:70000", "[::1]4433", "h:x"]:
        with pytest.raises(ValueError):
            parse_host_port(bad)


def test_peer_address_round_trip():
    pid = Identity.generate().peer_id
    for addr in [("127.0.0.1", 9), ("::1", 4433)]:
        assert parse_peer_address(format_peer_address(pid, addr)) == (pid, addr)
    assert parse_peer_address(str(pid)) == (pid, None)


def test_address_book_file(tmp_path, monkeypatch):
    a, b = Identity.generate().peer_id, Identity.generate().peer_id
    path = tmp_path / "addresses.toml"
    path.write_text(
        f'[[peer]]\nid = "{a}"\nname = "gpu"\naddresses = ["10.0.0.5:4433", "[fd00::5]:4433"]\n'
        f'\n[[peer]]\nid = "{b}"\naddresses = []\n'
    )
    monkeypatch.setenv("BURN_REMOTE_ADDRESS_BOOK", str(path))
    book = AddressBook.load()
    assert book.lookup("gpu").peer == a
    assert book.lookup(a).addresses == (("10.0.0.5", 4433), ("fd00::5", 4433))
    assert book.lookup(b).addresses == ()
    assert AddressBook.load(tmp_path / "missing.toml").entries == []
    path.write_text('[[peer]]\nid = "nope"\n')
    with pytest.raises(TransportError, match="peer #1"):
        AddressBook.load(path)


@trio_test
async def test_resolver_order_and_hooks():
    a = Identity.generate().peer_id
    calls = []

    async def relay(peer):
        calls.append(peer)
        return [("192.0.2.1", 7)]

    empty = Resolver(AddressBook(), hooks=[relay])
    assert await empty.resolve(format_peer_address(a, ("127.0.0.1", 5))) == (
        a,
        [("127.0.0.1", 5)],
    )
    assert calls == []  # a literal needs no lookup
    assert await empty.resolve(str(a)) == (a, [("192.0.2.1", 7)])
    with pytest.raises(TransportError, match="no address known"):
        await Resolver(AddressBook()).resolve(a)
    with pytest.raises(TransportError, match="neither a peer id"):
        await Resolver(AddressBook()).resolve("who")


@trio_test
async def test_dial_tries_addresses_in_turn():
    async def handler(conn):
        s = await conn.accept_stream()
        await s.send_frame(b"hi")

    async with serving(handler) as (srv, cli):
        dead = ("127.0.0.1", 9)  # discard port: nothing answers QUIC there

        async def hook(peer):
            return [dead, srv.local_address]

        cli._config = type(cli._config)(handshake_timeout=0.5)
        conn = await cli.dial(srv.peer_id, Resolver(AddressBook(), hooks=[hook]))
        s = await conn.open_stream()
        await s.send_frame(b"x")
        assert await s.receive_frame() == b"hi"
        literal = format_peer_address(Identity.generate().peer_id, srv.local_address)
        with pytest.raises(PeerRejected):
            await cli.dial(literal, Resolver(AddressBook()))
