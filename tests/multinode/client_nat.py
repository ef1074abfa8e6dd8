"""The public client of the NAT suite, run in its own namespace: look the NATed server's
record up on the relay, then train on it (the relay is the path the client ends up on).

Usage: python client_nat.py RELAY PEER
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    relay, peer = sys.argv[1:]
    os.environ["BURN_REMOTE_RELAY"] = relay
    from burn_remote import Device, RemoteDevice
    from burn_remote.protocol.relay import RelayAgent
    from burn_remote.protocol.transport import PeerId
    from remote.mlp import train

    record = RelayAgent.get(relay).lookup(PeerId.parse(peer))  # verified signature
    out: dict = {"addresses": list(record.addresses) if record else None}
    dev = RemoteDevice(peer)
    out["dialled"] = list(dev.address)
    got, want = train(dev, 3), train(Device.cpu(), 3)
    out["losses_equal"] = got["losses"] == want["losses"]
    dev.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
