"""Clients of the previous wire version (protocol 3, ALPN ``burn-remote/1``, keys proven
inside TLS) against a real server of this version: refused with ``Error(VERSION)`` naming
both versions, never admitted. The client is stock aioquic speaking version 3's first frame
as the version 3 reference client sent it (a sequenced Hello), and as a plain one."""

from __future__ import annotations

import socket
import ssl
import struct
import time

import msgpack
import pytest
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

VERSION_ERROR = 2
VERSION_REFUSED = 0x5B


def _legacy_session(address: str, first_frame: bytes) -> tuple[bytes, events.ConnectionTerminated]:
    """Connect as a version 3 client (no key proof), send ``first_frame`` on stream 0 and
    return what came back on it and how the connection ended."""
    host, port = address.rsplit(":", 1)
    addr = (host, int(port))
    config = QuicConfiguration(
        is_client=True, alpn_protocols=["burn-remote/1"], verify_mode=ssl.CERT_NONE
    )
    quic = QuicConnection(configuration=config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(0.05)
    quic.connect(addr, now=time.monotonic())
    got, sent, deadline = b"", False, time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            for data, to in quic.datagrams_to_send(now=time.monotonic()):
                sock.sendto(data, to)
            while (event := quic.next_event()) is not None:
                if isinstance(event, events.HandshakeCompleted) and not sent:
                    sent = True
                    quic.send_stream_data(0, struct.pack(">I", len(first_frame)) + first_frame)
                elif isinstance(event, events.StreamDataReceived) and event.stream_id == 0:
                    got += event.data
                elif isinstance(event, events.ConnectionTerminated):
                    return got, event
            try:
                data, src = sock.recvfrom(65536)
                quic.receive_datagram(data, src, now=time.monotonic())
            except TimeoutError:
                timer = quic.get_timer()
                if timer is not None and timer <= time.monotonic():
                    quic.handle_timer(now=time.monotonic())
    finally:
        sock.close()
    raise AssertionError("the server neither answered nor closed within 15 s")


def _error_of(frame: bytes) -> list:
    (size,) = struct.unpack_from(">I", frame)
    body = frame[4 : 4 + size]
    if body[:1] == b"\xc1":  # sequenced (protocol/README.md section 10)
        body = body[17:]
    (message,) = msgpack.unpackb(body, raw=False)
    return message


@pytest.mark.parametrize("sequenced", [True, False])
def test_a_version_3_client_gets_a_version_error_naming_both(
    server_engine, secure, sequenced
) -> None:
    server = secure()
    hello = msgpack.packb([[1, 3, b"", {}]], use_bin_type=True)  # Hello(version 3)
    first = (b"\xc1" + struct.pack(">QQ", 1, 0) + hello) if sequenced else hello
    got, closed = _legacy_session(server.address, first)
    if sequenced:
        assert got[4:5] == b"\xc1" and struct.unpack_from(">QQ", got, 5) == (1, 1)
    tag, code, message, node, request_id = _error_of(got)
    assert (tag, code, node, request_id) == (11, VERSION_ERROR, -1, 0)
    assert "protocol version 3" in message and "this server version 4" in message
    assert closed.error_code == VERSION_REFUSED and "burn-remote/2" in closed.reason_phrase
    assert "session opened" not in server.output()
