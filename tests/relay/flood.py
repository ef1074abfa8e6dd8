"""A peer that floods a relay, as its own process so that it does not share a GIL with the
client under test. It registers a flooder and a sink, prints ``FLOODING``, sends to the sink
as fast as it can until stdin closes, then prints one JSON line: what it sent, what reached
the sink, and the seconds from the first send to the last arrival.

Usage: python flood.py RELAY_HOST:PORT
"""

from __future__ import annotations

import json
import sys
import time

import trio
from burn_remote.protocol.relay import RelayClient
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.relay._wire import parse_hostport
from burn_remote.protocol.transport import Identity, PeerId

PAYLOAD = 8192
OFFERED = 48 << 20
"""Bytes per second the flooder offers: many times the test's limit, yet not so much that it
takes a whole core of a shared CI machine."""


class Sink(RelayClient):
    received = 0
    last = 0.0

    async def _deliver(self, src: PeerId, payload: bytes) -> None:
        self.received += len(payload)
        self.last = time.monotonic()


async def main(relay: tuple[str, int]) -> None:
    flooder, sink_id = Identity.generate(), Identity.generate()
    async with (
        Sink.open(sink_id, relay) as sink,
        RelayClient.open(flooder, relay) as client,
    ):
        print(f"FLOODING {flooder.peer_id}", flush=True)
        datagram = bytes([w.SEND]) + sink_id.peer_id.raw + bytes(PAYLOAD)
        sent, first = 0, time.monotonic()
        async with trio.open_nursery() as nursery:
            stop = trio.Event()

            async def wait_stdin() -> None:
                await trio.to_thread.run_sync(sys.stdin.read)
                stop.set()

            nursery.start_soon(wait_stdin)
            while not stop.is_set():
                for _ in range(16):
                    try:
                        await client._sock.send(datagram)
                        sent += PAYLOAD
                    except OSError:  # ENOBUFS: the kernel's queue is full
                        pass
                await trio.sleep(max(0.0, first + sent / OFFERED - time.monotonic()))
        await trio.sleep(1.0)  # what the relay still holds arrives
        out = {"sent": sent, "received": sink.received, "seconds": sink.last - first}
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    trio.run(main, parse_hostport(sys.argv[1]))
