"""The client side of the multi-node suite, run as its own process (in the client's network
namespace, or in the compose test runner). Prints one JSON line with what it observed.

Usage: python client_job.py RELAY DIRECT_PEER RELAYED_PEER [WILDCARD_PEER]

WILDCARD_PEER, when given, is a server listening on the wildcard address that the client
reaches only through the relay.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MARKER = b"PLAINTEXT-TENSOR"


def main() -> None:
    relay, direct_peer, relayed_peer, *more = sys.argv[1:]
    os.environ["BURN_REMOTE_RELAY"] = relay
    from burn_remote import Device, RemoteDevice
    from remote.mlp import train

    out: dict = {}
    one = RemoteDevice(direct_peer)  # resolved by the relay; the direct path works
    out["direct_address"] = list(one.address)
    two = RemoteDevice(relayed_peer)  # resolved by the relay; no direct route: tunnelled
    out["relayed_address"] = list(two.address)
    want = train(Device.cpu(), 3)
    got_one, got_two = train(one, 3), train(two, 3)
    out["direct_equal"] = got_one["losses"] == want["losses"]
    out["relayed_equal"] = got_two["losses"] == want["losses"] and all(
        a.tobytes() == b.tobytes() for a, b in zip(got_two["weights"], want["weights"])
    )
    pattern = np.frombuffer(MARKER * 4096, dtype=np.uint8)
    out["marker_roundtrip"] = two.tensor(pattern).numpy().tobytes() == pattern.tobytes()
    # Server-to-server move: one's tensor goes to two, fetched by two's server from one's.
    src = one.tensor(np.arange(1000, dtype=np.float32))
    moved = src.to(two)
    out["moved_sum"] = float(moved.sum().item())
    # ...and back: the source is reachable from the client only through the relay, so one's
    # server finds two's through its own relay association (directly when its record allows).
    try:
        back = two.tensor(np.arange(1000, dtype=np.float32) * 2).to(one)
        out["moved_from_relayed_sum"] = float(back.sum().item())
    except Exception as exc:  # reported to the test, which decides (see test_netns.py)
        out["moved_from_relayed_error"] = f"{type(exc).__name__}: {exc}"
    ring_check(out, [one, two, *(RemoteDevice(p) for p in more)])
    two.close()
    if more:
        three = RemoteDevice(more[0])
        out["wildcard_address"] = list(three.address)
        got = train(three, 3)
        out["wildcard_equal"] = got["losses"] == want["losses"] and all(
            a.tobytes() == b.tobytes() for a, b in zip(got["weights"], want["weights"])
        )
        # A source one's server has no route to: it tunnels through the relay.
        back = three.tensor(np.arange(1000, dtype=np.float32) * 3).to(one)
        out["moved_from_relay_only_sum"] = float(back.sum().item())
        three.close()
    one.close()
    print("RESULT " + json.dumps(out), flush=True)


def ring_check(out: dict, devices: list) -> None:
    """The servers all-reduce among themselves over their own links (resolved through the
    relay where they have no route to each other): every rank gets NumPy's sum."""
    from burn_remote import collective as C

    try:
        with C.Group(devices) as group:
            xs = [np.arange(100_003, dtype=np.float32) * (k + 1) for k in range(len(devices))]
            outs = [C.all_reduce(d.tensor(x), group, "sum") for d, x in zip(devices, xs)]
            got = [o.numpy() for o in outs]
        want = np.sum(xs, axis=0)
        out["ring_ranks"] = len(devices)
        out["ring_equal"] = all(np.allclose(g, want, rtol=1e-6) for g in got) and all(
            g.tobytes() == got[0].tobytes() for g in got
        )
    except Exception as exc:  # reported to the test, which decides (see test_netns.py)
        out["ring_error"] = f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    main()
