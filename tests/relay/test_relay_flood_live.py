"""A real relay while one host hammers it with 10,000 fake ids from 200 source ports: the
host is held to its share of the table, and a real peer from another address registers,
publishes its record and finds it, all over real UDP sockets on loopback."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest
import trio
from burn_remote.protocol.relay import AddressRecord, RelayClient
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.relay._wire import parse_hostport
from burn_remote.protocol.transport import Identity
from remote.conftest import Server

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

FAKE_IDS = 10_000
PORTS = 200
ATTACKER = "127.0.0.2"
"""Another loopback address than the real peer's 127.0.0.1 (the relay sees both)."""
WAIT = 0.0005
"""Seconds the attacker waits for answers between two HELLOs (its loop is bounded)."""


class Hammer:
    """HELLO for a fresh id on each socket in turn, AUTH for every CHALLENGE that comes
    back; counts the relay's answers."""

    def __init__(self, relay: tuple[str, int]) -> None:
        self.socks = []
        for _ in range(PORTS):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ATTACKER, 0))
            s.connect(relay)
            s.setblocking(False)
            self.socks.append(s)
        self.keys = [Identity.generate() for _ in range(FAKE_IDS)]
        self.pending: dict[socket.socket, Identity] = {}
        self.registered = 0
        self.refusals: list[bytes] = []
        self.hellos = 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for i, key in enumerate(self.keys):
                sock = self.socks[i % PORTS]
                try:
                    sock.send(bytes([w.HELLO]) + key.peer_id.raw)
                except BlockingIOError:
                    continue
                self.pending[sock] = key
                self.hellos += 1
                self._answer(WAIT)
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                self._answer(0.05)
        finally:
            self.done.set()

    def _answer(self, wait: float) -> None:
        ready, _, _ = select.select(self.socks, [], [], wait)
        for sock in ready:
            try:
                data = sock.recv(2048)
            except OSError:
                continue
            if data[0] == w.CHALLENGE and sock in self.pending:
                key = self.pending.pop(sock)
                sig = key.private_key.sign(w.auth_message(data[1:33], data[33:65]))
                try:
                    sock.send(bytes([w.AUTH]) + key.peer_id.raw + sig)
                except BlockingIOError:
                    pass
            elif data[0] == w.OK:
                self.registered += 1
            elif data[0] == w.ERR:
                self.refusals.append(data[1:])

    def close(self) -> None:
        for s in self.socks:
            s.close()


def test_a_real_peer_registers_and_publishes_while_one_host_hammers(relay: Server) -> None:
    address = parse_hostport(relay.address)
    hammer = Hammer(address)
    attack = threading.Thread(target=hammer.run, daemon=True)
    attack.start()
    me = Identity.generate()
    try:
        time.sleep(0.5)  # the attack is under way

        async def main() -> AddressRecord | None:
            async with RelayClient.open(me, address, direct=False) as client:
                await client.publish(AddressRecord.create(me, ["127.0.0.1:9"], relay.address))
                return await client.lookup(me.peer_id)

        found = trio.run(main)
        assert found is not None and found.addresses == ("127.0.0.1:9",)
        assert not hammer.done.is_set(), "the attack ended before the real peer was done"
        attack.join(120)
    finally:
        hammer.close()
    assert hammer.hellos > 5_000  # it did hammer
    assert any(b"too many peers registered from 127.0.0.2" in r for r in hammer.refusals)
