"""Key proofs above TLS (protocol/README.md section 1), attacked with a stock aioquic client.

The client here is aioquic with no burn-remote code: it reads the TLS secret from aioquic's
public key log and builds (or forges) proofs from the spec's constants alone, so these tests
check the wire format as well as the server. Each runs against both server engines."""

from __future__ import annotations

import hashlib
import io
import socket
import ssl
import struct
from collections.abc import Callable

import pytest
import trio
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from burn_remote.protocol.transport import ALPN, EndpointConfig, Identity, TransportError, _endpoint

from .conftest import serving, trio_test

CONTEXT = b"burn-remote peer proof v1\0"
LABEL = b"burn-remote channel binding v1\0"
AUTH_REFUSED = 0x5A
VERSION_REFUSED = 0x5B
CLIENT_STREAM, SERVER_STREAM = 2, 3


class KeyLog(io.TextIOBase):
    """aioquic's ``secrets_log_file``: the NSS key-log lines, kept by label."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[str, bytes] = {}

    def write(self, text: str) -> int:
        for line in text.splitlines():
            label, _random, secret = line.split()
            self.secrets[label] = bytes.fromhex(secret)
        return len(text)


def binding_of(log: KeyLog) -> bytes:
    return hashlib.sha256(LABEL + log.secrets["SERVER_TRAFFIC_SECRET_0"]).digest()


def client_proof(me: Identity, server: bytes, binding: bytes, signer: Identity | None = None):
    """The client's proof frame, as the spec lays it out (``signer`` forges it)."""
    signed = CONTEXT + b"C" + me.peer_id.raw + server + binding
    payload = me.peer_id.raw + (signer or me).private_key.sign(signed)
    return struct.pack(">I", len(payload)) + payload


def server_proof_verifies(frame: bytes, server: Identity, binding: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    if len(frame) != 100 or frame[:4] != struct.pack(">I", 96) or frame[4:36] != server.peer_id.raw:
        return False
    try:
        key = server.private_key.public_key()
        key.verify(frame[36:], CONTEXT + b"S" + server.peer_id.raw + binding)
    except InvalidSignature:
        return False
    return True


Act = Callable[[QuicConnection, bytes, bytes], None]


async def raw_client(addr, act: Act | None, *, alpn: str = ALPN, timeout: float = 10.0):
    """Drive a stock aioquic client until the server ends its auth stream (returns
    ``"admitted"``) or the connection ends (returns the ConnectionTerminated). Once the
    server's proof is whole, ``act(quic, binding, server_proof)`` sends what the test
    wants; frames the server sends on stream 0 are collected in ``raw_client.frames``."""
    log = KeyLog()
    config = QuicConfiguration(
        is_client=True, alpn_protocols=[alpn], verify_mode=ssl.CERT_NONE, secrets_log_file=log
    )
    quic = QuicConnection(configuration=config)
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    quic.connect(addr, now=trio.current_time())
    proof, acted, control = b"", False, b""
    try:
        with trio.fail_after(timeout):
            while True:
                for data, dest in quic.datagrams_to_send(now=trio.current_time()):
                    await sock.sendto(data, dest)
                while (event := quic.next_event()) is not None:
                    if isinstance(event, events.ConnectionTerminated):
                        raw_client.frames = control  # type: ignore[attr-defined]
                        return event
                    if isinstance(event, events.StreamDataReceived):
                        if event.stream_id == SERVER_STREAM:
                            proof += event.data
                            if event.end_stream:
                                return "admitted"
                        elif event.stream_id == 0:
                            control += event.data
                    if isinstance(event, events.HandshakeCompleted) and alpn != ALPN:
                        acted = True  # an older client: no proof to wait for
                        if act is not None:
                            act(quic, b"", b"")
                if not acted and len(proof) >= 100 and act is not None:
                    acted = True
                    act(quic, binding_of(log), proof[:100])
                    continue
                timer = quic.get_timer()
                with trio.move_on_at(timer if timer is not None else trio.current_time() + 1):
                    data, src = await sock.recvfrom(65536)
                    quic.receive_datagram(data, src, now=trio.current_time())
                    continue
                quic.handle_timer(now=trio.current_time())
    finally:
        sock.close()


def _handler(ran: list):
    async def handler(conn):
        ran.append(conn.peer_id)
        await trio.sleep(0.5)

    return handler


@trio_test
async def test_a_proof_built_from_the_spec_is_admitted_and_the_servers_verifies(server_engine):
    client, ran, seen = Identity.generate(), [], []
    async with serving(_handler(ran), authorized_peers={client.peer_id}) as (srv, _cli):

        def act(quic, binding, server_proof):
            seen.append(server_proof_verifies(server_proof, srv.identity, binding))
            quic.send_stream_data(
                CLIENT_STREAM, client_proof(client, srv.peer_id.raw, binding), end_stream=True
            )

        assert await raw_client(srv.local_address, act) == "admitted"
        with trio.fail_after(5):
            while not ran:
                await trio.sleep(0.01)
    assert seen == [True]
    assert ran == [client.peer_id]


@trio_test
async def test_a_proof_for_an_authorised_key_signed_by_another_is_refused(server_engine):
    stolen, own, ran = Identity.generate(), Identity.generate(), []
    async with serving(_handler(ran), authorized_peers={stolen.peer_id}) as (srv, _cli):

        def act(quic, binding, _proof):
            frame = client_proof(stolen, srv.peer_id.raw, binding, signer=own)
            quic.send_stream_data(CLIENT_STREAM, frame, end_stream=True)

        closed = await raw_client(srv.local_address, act)
    assert closed.error_code == AUTH_REFUSED
    assert "does not verify" in closed.reason_phrase and str(stolen.peer_id) in closed.reason_phrase
    assert ran == []


@trio_test
async def test_a_proof_replayed_from_an_earlier_connection_is_refused(server_engine):
    client, ran, captured = Identity.generate(), [], []
    async with serving(_handler(ran), authorized_peers={client.peer_id}) as (srv, _cli):

        def honest(quic, binding, _proof):
            captured.append(client_proof(client, srv.peer_id.raw, binding))
            quic.send_stream_data(CLIENT_STREAM, captured[0], end_stream=True)

        def replay(quic, _binding, _proof):
            quic.send_stream_data(CLIENT_STREAM, captured[0], end_stream=True)

        assert await raw_client(srv.local_address, honest) == "admitted"
        closed = await raw_client(srv.local_address, replay)
    assert closed.error_code == AUTH_REFUSED and "does not verify" in closed.reason_phrase


@trio_test
async def test_a_proof_made_for_another_server_is_refused(server_engine):
    """A server the client talks to cannot pass the client's proof on to another: the
    proof names the server it was made for (and its connection's binding)."""
    client, elsewhere = Identity.generate(), Identity.generate()
    async with serving(_handler([]), authorized_peers={client.peer_id}) as (srv, _cli):

        def act(quic, binding, _proof):
            frame = client_proof(client, elsewhere.peer_id.raw, binding)
            quic.send_stream_data(CLIENT_STREAM, frame, end_stream=True)

        closed = await raw_client(srv.local_address, act)
    assert closed.error_code == AUTH_REFUSED and "another server" in closed.reason_phrase


@trio_test
async def test_a_client_that_never_proves_its_key_is_closed_at_the_deadline(server_engine):
    ran = []
    config = EndpointConfig(handshake_timeout=1.0)
    async with serving(_handler(ran), server_config=config, allow_any=True) as (srv, _cli):
        closed = await raw_client(srv.local_address, None)
    assert closed.error_code == AUTH_REFUSED and "no key proof within 1 s" in closed.reason_phrase
    assert ran == []


@trio_test
async def test_a_stranger_cannot_make_the_server_buffer_before_its_proof(server_engine):
    ran = []
    async with serving(_handler(ran), allow_any=True) as (srv, _cli):

        def act(quic, _binding, _proof):
            sid = quic.get_next_available_stream_id()
            quic.send_stream_data(sid, bytes(2 * 1024 * 1024))

        closed = await raw_client(srv.local_address, act)
    assert closed.error_code == AUTH_REFUSED
    assert "bytes sent before the key proof" in closed.reason_phrase
    assert ran == []


@trio_test
async def test_connections_not_yet_proven_are_capped(server_engine, monkeypatch):
    """Beyond ``MAX_UNAUTHENTICATED`` connections whose client has not proven its key, new
    handshakes are not even started; an honest client gets in once they are gone."""
    monkeypatch.setattr(_endpoint, "MAX_UNAUTHENTICATED", 2)
    config, patient = EndpointConfig(handshake_timeout=3.0), EndpointConfig(handshake_timeout=1.0)
    async with serving(_handler([]), server_config=config, client_config=patient) as (srv, cli):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(raw_client, srv.local_address, None)
            with trio.fail_after(5):
                while len(srv.connections) < 2:
                    await trio.sleep(0.01)
            with pytest.raises(TransportError, match="no handshake"):
                with trio.fail_after(5):
                    await cli.connect(srv.peer_id, srv.local_address)
        with trio.fail_after(5):  # the silent two are gone at their deadline
            while srv.connections:
                await trio.sleep(0.05)
        conn = await cli.connect(srv.peer_id, srv.local_address)
        assert conn.peer_id == srv.peer_id


@trio_test
async def test_a_client_of_the_older_transport_gets_the_servers_refusal(server_engine):
    """burn-remote/1 clients proved keys inside TLS and never send a proof: the server
    answers their first frame with what ``refuse_legacy`` makes of it, then closes with
    VERSION_REFUSED and a reason naming both transports; the handler never runs."""
    ran = []

    def refuse(first: bytes) -> bytes:
        return b"old:" + first

    async with serving(_handler(ran), allow_any=True, refuse_legacy=refuse) as (srv, _cli):

        def act(quic, _binding, _proof):
            quic.send_stream_data(0, struct.pack(">I", 5) + b"hello")

        closed = await raw_client(srv.local_address, act, alpn="burn-remote/1")
    assert raw_client.frames == struct.pack(">I", 9) + b"old:hello"  # type: ignore[attr-defined]
    assert closed.error_code == VERSION_REFUSED
    assert "burn-remote/2" in closed.reason_phrase and "burn-remote/1" in closed.reason_phrase
    assert ran == []
