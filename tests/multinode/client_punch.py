"""The client of the hole-punching suite, run in its namespace behind its NAT: dial the
server (behind another NAT) by peer id through the relay, train, and report which path the
session used at each step.

Usage: python client_punch.py RELAY PEER STEPS CUT_AT
With CUT_AT > 0 the client prints ``CUT`` after that step and waits for a line on stdin (the
test then cuts the direct path) before it trains on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MOVE_WAIT = 15.0
"""Seconds the client waits for the direct path before the first step (it reports how long
the move took, or that it did not happen)."""


def _wait_for(dev, prefix: str, seconds: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if dev.stats()["path"].startswith(prefix):
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def main() -> None:
    relay, peer, steps, cut_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.environ["BURN_REMOTE_RELAY"] = relay
    import numpy as np
    from burn_remote import Device, RemoteDevice
    from remote.mlp import train

    if os.environ.get("NAT_DEBUG"):
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.monotonic()
    dev = RemoteDevice(peer)
    out: dict = {"dialled": list(dev.address), "paths": []}

    def on_step(step: int, _nbytes: int) -> None:
        if step == 0:
            out["first_path"] = dev.stats()["path"]
            took = _wait_for(dev, "direct", MOVE_WAIT)
            out["move_s"] = None if took is None else time.monotonic() - started
        out["paths"].append(dev.stats()["path"])
        if cut_at and step == cut_at:
            print("CUT", flush=True)
            if os.environ.get("NAT_DEBUG"):
                print(time.strftime("%H:%M:%S"), "cut requested", file=sys.stderr, flush=True)
            sys.stdin.readline()
            out["cut_at"] = time.monotonic()
        if cut_at and step == cut_at + 1:  # this step's traffic met the cut path
            out["stalled_s"] = time.monotonic() - out.pop("cut_at")

    got = train(dev, steps, on_step=on_step)
    out["final_path"] = dev.stats()["path"]
    want = train(Device.cpu(), steps)
    out["losses_equal"] = got["losses"] == want["losses"]
    out["weights_equal"] = all(
        np.array_equal(a, b) for a, b in zip(got["weights"], want["weights"])
    )
    dev.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
