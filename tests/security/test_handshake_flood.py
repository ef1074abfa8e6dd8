"""Unauthenticated handshake floods: Initials beyond a per-source rate are dropped before any
TLS work (the flooding socket gets answers to at most the rate's worth of them), and with
many handshakes half open a new client must first answer a QUIC Retry (proving its
address). An authorised client keeps connecting throughout; its connect times are printed,
not asserted (tests assert behaviour)."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
from aioquic.buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header
from burn_remote import RemoteDevice
from burn_remote.protocol.transport import EndpointConfig
from burn_remote.protocol.transport._auth import SecretSink
from burn_remote.protocol.transport._endpoint import HANDSHAKE_BURST, HANDSHAKE_RATE
from burn_remote.protocol.transport._quic import client_connection


def _initials(peer, server, count: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    """First datagrams of ``count`` fresh handshakes (distinct connection ids)."""
    host = server.address.rsplit(":", 1)[0]
    out = []
    for _ in range(count):
        quic = client_connection(peer.identity, EndpointConfig(), host, SecretSink())
        quic.connect((host, 1), now=time.monotonic())
        out.append(quic.datagrams_to_send(time.monotonic())[0][0])
    return out


def _connect_time(server, key) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    dev = RemoteDevice(server.target, key=key)
    assert dev.tensor(np.ones(2, np.float32)).sum().item() == 2.0
    took = time.perf_counter() - t0
    dev.close()
    return took


def _flood(datagrams: list[bytes], addr: tuple, sockets: int, stop: threading.Event) -> None:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(sockets)]
    try:
        k = 0
        while not stop.is_set() and k < len(datagrams):
            socks[k % sockets].sendto(datagrams[k], addr)
            k += 1
    finally:
        for s in socks:
            s.close()


FLOOD = """
import socket, sys, time
from aioquic.buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header
data = open(sys.argv[3], "rb").read()
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("flooding", flush=True)
t0 = time.monotonic()
k = 0
while k < len(data):
    n = int.from_bytes(data[k : k + 2], "big")
    sock.sendto(data[k + 2 : k + 2 + n], (sys.argv[1], int(sys.argv[2])))
    k += 2 + n
sock.settimeout(0.2)
answered, quiet_since = set(), time.monotonic()
while time.monotonic() - quiet_since < 1.0:
    try:
        reply = sock.recv(65536)
    except TimeoutError:
        continue
    quiet_since = time.monotonic()
    header = pull_quic_header(Buffer(data=reply), host_cid_length=8)
    if header.packet_type != QuicPacketType.RETRY:
        answered.add(header.destination_cid)
print(len(answered), time.monotonic() - t0, flush=True)
"""
"""The attacker: its own process (never a thread of the test, whose interpreter lock the
measuring client needs), one socket, the datagrams of a file as fast as it can; then it
counts the handshakes the server answered with TLS work (an Initial back, not a Retry) until
the server has been silent for a second, and prints that count and the seconds it took."""
ROUNDS = 5
"""Connects measured without and with a flood, alternately: a load that comes and goes on
the shared machine hits both sides alike (measured one block before the other, a busy
minute during the flood made this test fail with no fault of the server's)."""


def test_initial_flood_from_one_socket_does_not_delay_a_client(secure, peers, guard_of, tmp_path):
    server = secure()
    guard = guard_of(server, peers.victim)
    host, port = server.address.rsplit(":", 1)
    file = tmp_path / "initials"
    with open(file, "wb") as f:
        for d in _initials(peers.attacker, server, 1100):  # the issue's ~1 100 Initials
            f.write(len(d).to_bytes(2, "big") + d)
    quiet, flooded = [], []
    for _ in range(ROUNDS):
        quiet.append(_connect_time(server, peers.admin.key))
        attacker = subprocess.Popen(
            [sys.executable, "-c", FLOOD, host, port, str(file)], stdout=subprocess.PIPE
        )
        assert attacker.stdout is not None and attacker.stdout.readline() == b"flooding\n"
        flooded.append(_connect_time(server, peers.admin.key))
        answered, seconds = attacker.stdout.readline().split()
        assert attacker.wait(timeout=60) == 0
        # TLS work for the burst and the rate over the whole window, of 1 100 Initials
        allowed = HANDSHAKE_BURST + HANDSHAKE_RATE * float(seconds) + 1
        assert int(answered) <= allowed, (answered, seconds)
    before, during = statistics.median(quiet), statistics.median(flooded)
    print(f"\nconnect {before * 1e3:.0f} ms without, {during * 1e3:.0f} ms during the flood")
    guard.check()


def test_many_half_open_handshakes_make_new_clients_answer_a_retry(
    server_engine, secure, peers, guard_of
):
    server = secure()
    guard = guard_of(server, peers.victim)
    host, port = server.address.rsplit(":", 1)
    addr = (host, int(port))
    # 80 sockets x 3 Initials: within each source's burst, 240 handshakes left half open
    _flood(_initials(peers.attacker, server, 240), addr, 80, threading.Event())
    time.sleep(0.5)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.settimeout(5)
    try:
        probe.sendto(_initials(peers.attacker, server, 1)[0], addr)
        reply, _ = probe.recvfrom(65536)
    finally:
        probe.close()
    header = pull_quic_header(Buffer(data=reply), host_cid_length=8)
    assert header.packet_type == QuicPacketType.RETRY and header.token
    # an authorised client answers the Retry and gets in; the victim's session goes on
    assert _connect_time(server, peers.admin.key) < 10
    guard.check()
