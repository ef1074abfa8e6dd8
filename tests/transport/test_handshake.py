"""Mutual authentication over real UDP sockets on loopback."""

from __future__ import annotations

import os
import socket
import ssl

import pytest
import trio
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from burn_remote.protocol.transport import (
    ALPN,
    Endpoint,
    EndpointConfig,
    Identity,
    PeerRejected,
    TransportError,
)

from .conftest import has_ipv6_loopback, serving, trio_test

# Tests that take ``server_engine`` run once with an aioquic server and once with a qh3 one
# (``_qh3_server``): the same checks, the same alerts and reasons on the wire.


async def echo(conn):
    s = await conn.accept_stream()
    while (frame := await s.receive_frame()) is not None:
        await s.send_frame(frame)
    await s.close()


@trio_test
async def test_handshake_with_right_keys(server_engine):
    seen = []

    async def handler(conn):
        seen.append(conn.peer_id)
        await echo(conn)

    async with serving(handler) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        assert conn.peer_id == srv.peer_id
        s = await conn.open_stream()
        await s.send_frame(b"hello")
        assert await s.receive_frame() == b"hello"
        await s.close()
        assert await s.receive_frame() is None
        assert seen == [cli.peer_id]
        await conn.close("done")


@trio_test
async def test_dialling_wrong_peer_id_fails_clearly(server_engine):
    async def handler(conn):  # pragma: no cover - must never run
        raise AssertionError("handler ran for a client that dialled someone else")

    async with serving(handler) as (srv, cli):
        impostor = Identity.generate().peer_id
        with pytest.raises(PeerRejected) as info:
            await cli.connect(impostor, srv.local_address)
        text = str(info.value)
        assert str(srv.peer_id) in text and str(impostor) in text and "dialled" in text


@trio_test
async def test_unauthorised_client_refused_with_reason(server_engine):
    ran = []

    async def handler(conn):
        ran.append(conn)

    async with serving(handler, authorized_peers=set()) as (srv, cli):
        with pytest.raises(PeerRejected) as info:
            await cli.connect(srv.peer_id, srv.local_address)
        assert "not in this server's authorized peers" in str(info.value)
        assert str(cli.peer_id) in str(info.value)
    assert ran == []


@trio_test
async def test_open_mode_admits_anyone(server_engine):
    async with serving(echo, authorized_peers=None, allow_any=True) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        assert conn.peer_id == srv.peer_id


@trio_test
async def test_authorized_peers_file_is_reread(tmp_path, server_engine):
    path = tmp_path / "authorized_peers"
    path.write_text("# nobody yet\n")
    async with serving(echo, authorized_peers=path) as (srv, cli):
        with pytest.raises(PeerRejected):
            await cli.connect(srv.peer_id, srv.local_address)
        path.write_text(f"# the laptop\n{cli.peer_id} laptop\n")
        os.utime(path, (1, 1))  # a different mtime even within the same clock tick
        conn = await cli.connect(srv.peer_id, srv.local_address)
        assert conn.peer_id == srv.peer_id


async def _raw_aioquic_client(addr, configuration):
    """Drive a stock aioquic client (no burn-remote code) until the connection ends."""
    quic = QuicConnection(configuration=configuration)
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    quic.connect(addr, now=trio.current_time())
    with trio.fail_after(10):
        while True:
            for data, dest in quic.datagrams_to_send(now=trio.current_time()):
                await sock.sendto(data, dest)
            while (event := quic.next_event()) is not None:
                if isinstance(event, events.ConnectionTerminated):
                    sock.close()
                    return event
            timer = quic.get_timer()
            with trio.move_on_at(timer if timer is not None else trio.current_time() + 1):
                data, src = await sock.recvfrom(65536)
                quic.receive_datagram(data, src, now=trio.current_time())
                continue
            quic.handle_timer(now=trio.current_time())


@trio_test
async def test_unsupported_version_gets_version_negotiation():
    async with serving(echo) as (srv, _cli):
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
        packet = bytes([0xC0]) + (0x1A2A3A4A).to_bytes(4, "big") + b"\x08" + b"D" * 8
        packet += b"\x08" + b"S" * 8
        await sock.sendto(packet.ljust(1200, b"\0"), srv.local_address)
        with trio.fail_after(5):
            reply, _ = await sock.recvfrom(2048)
        sock.close()
    assert reply[1:5] == b"\0\0\0\0"  # version 0: a Version Negotiation packet
    assert (1).to_bytes(4, "big") in reply[5:]


@trio_test
async def test_handshake_times_out_against_silent_port():
    silent = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await silent.bind(("127.0.0.1", 0))
    config = EndpointConfig(handshake_timeout=0.5)
    async with Endpoint.open(Identity.generate(), config=config) as cli:
        with pytest.raises(TransportError, match="no handshake"):
            await cli.connect(Identity.generate().peer_id, silent.getsockname())
    silent.close()


@trio_test
async def test_graceful_close_reason_reaches_the_peer(server_engine):
    reasons = []

    async def handler(conn):
        try:
            await conn.accept_stream()
        except TransportError as exc:
            reasons.append(str(exc))

    async with serving(handler) as (srv, cli):
        conn = await cli.connect(str(srv.peer_id), srv.local_address)  # text form works too
        await conn.close("client is done")
        with trio.fail_after(10):
            while not reasons:
                await trio.sleep(0.01)
    assert "client is done" in reasons[0]


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
@trio_test
async def test_ipv6_loopback(server_engine):
    server_id, client_id = Identity.generate(), Identity.generate()
    config = EndpointConfig(quic_engine=server_engine)
    async with (
        Endpoint.open(
            server_id, ("::1", 0), config=config, authorized_peers={client_id.peer_id}
        ) as srv,
        Endpoint.open(client_id, ("::1", 0)) as cli,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(srv.serve, echo)
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        await s.send_frame(b"v6")
        assert await s.receive_frame() == b"v6"
        nursery.cancel_scope.cancel()


def _stock_client_config(identity: Identity | None, key: Identity | None = None, alpn=ALPN):
    """A stock aioquic client's settings: ``identity``'s certificate signed for with
    ``key``'s private key (a mismatch when they differ), or no certificate at all."""
    config = QuicConfiguration(is_client=True, alpn_protocols=[alpn], verify_mode=ssl.CERT_NONE)
    if identity is not None:
        config.certificate = identity.certificate()
        config.private_key = (key or identity).private_key
    return config


@trio_test
async def test_a_wrong_alpn_is_refused_at_once(server_engine):
    async with serving(echo, allow_any=True) as (srv, _cli):
        config = _stock_client_config(Identity.generate(), alpn="h3")
        event = await _raw_aioquic_client(srv.local_address, config)
    # TLS no_application_protocol (aioquic); qh3's unmodified TLS says handshake_failure
    assert event.error_code == 0x100 + (120 if server_engine == "aioquic" else 40)
