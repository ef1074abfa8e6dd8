"""A client that trains across an outage of its server's network: run in the client's
namespace (or the compose runner). After step 1 it prints ``OUTAGE`` and waits for a line on
stdin (the test takes the server's network down and up meanwhile), then trains on and prints
one JSON line comparing the run with the same training on the local CPU.

Usage: python client_outage.py RELAY PEER STEPS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    relay, peer, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["BURN_REMOTE_RELAY"] = relay
    from burn_remote import Device, RemoteDevice
    from remote.mlp import train

    def pause(step: int, _: int) -> None:
        if step == 1:
            print("OUTAGE", flush=True)
            sys.stdin.readline()

    dev = RemoteDevice(peer)
    got = train(dev, steps, on_step=pause)
    stats = dev.stats()
    dev.close()
    want = train(Device.cpu(), steps)
    out = {
        "losses_equal": got["losses"] == want["losses"],
        "weights_equal": all(
            a.tobytes() == b.tobytes() for a, b in zip(got["weights"], want["weights"])
        ),
        "errors": stats["errors"],
    }
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
