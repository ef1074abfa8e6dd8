"""Upload throughput through the relay vs after the move to the hole-punched direct path,
in one run, between two real NATs (network namespaces made here; needs root, ``ip`` and nft
or iptables; wrap in ``flock /tmp/burn-netns.lock``).

The client (behind NAT A) dials the server (behind NAT B) by peer id. The direct path is cut
at first, so the session runs relayed and the client measures uploads; then the cut is
removed, the session moves to the direct path (within the punch retry interval) and the same
uploads are measured again. The relay runs without its per-peer bandwidth limit here (by
default it holds each peer to 32 MiB/s), so the figures compare paths, not the limit. It
also prints how many bytes reached the relay during each phase: after the move, the relay no
longer carries the session.

Run: flock /tmp/burn-netns.lock .venv/bin/python bench/holepunch.py [--mib 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "multinode"))

MOVE_WAIT = 30.0
"""Seconds the client waits for the session to reach the wanted path."""


def client(relay: str, peer: str, mib: int, repeats: int) -> None:
    """The side in NAT A: relayed uploads, wait for the go, direct uploads."""
    os.environ["BURN_REMOTE_RELAY"] = relay
    import numpy as np
    from burn_remote import RemoteDevice

    dev = RemoteDevice(peer)
    data = np.random.default_rng(0).standard_normal(mib * 2**18).astype(np.float32)

    def measure(label: str) -> float:
        dev.tensor(data[:1024]).numpy()  # connection open, caches warm
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            t = dev.tensor(data)
            dev.sync()
            rates.append(data.nbytes / 2**20 / (time.perf_counter() - t0))
            del t
        rate = statistics.median(rates)
        print(f"{label}: {rate:.1f} MiB/s upload (median of {repeats} x {mib} MiB; "
              f"path {dev.stats()['path']})", flush=True)  # fmt: skip
        return rate

    relayed = measure("relayed")
    print("HEAL", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    while not dev.stats()["path"].startswith("direct"):
        if time.monotonic() - start > MOVE_WAIT:
            sys.exit(f"no direct path after {MOVE_WAIT} s")
        time.sleep(0.05)
    print(f"moved to {dev.stats()['path']} {time.monotonic() - start:.2f} s after the cut "
          "was removed", flush=True)  # fmt: skip
    direct = measure("direct")
    print(f"direct / relayed upload throughput: {direct / relayed:.2f}x", flush=True)
    dev.close()


def _relay_bytes(ns: str) -> int:
    """Bytes the relay's interface has received so far (its kernel counter)."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "eth0"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=16, help="MiB per upload (default 16)")
    p.add_argument("--repeats", type=int, default=5, help="uploads per path (default 5)")
    p.add_argument("--client", nargs=2, metavar=("RELAY", "PEER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client(*args.client, args.mib, args.repeats)
        return
    from burn_remote.server.testing import start_daemon
    from natlab import NODES, RELAY, ROUTER_B, SERVER, build_two_nats, cut, heal, remove

    names = {n: f"brb{secrets.token_hex(3)}-{n}" for n in NODES}
    started = []
    try:
        build_two_nats(names)
        cut(names["ra"], ROUTER_B)
        tmp = Path(tempfile.mkdtemp(prefix="burn-holepunch-"))
        exec_in = lambda node: ("ip", "netns", "exec", names[node])  # noqa: E731
        started.append(start_daemon("relay", tmp / "relay", "--listen", f"{RELAY}:7400",
                                    "--peer-bandwidth", "0", prefix=exec_in("relay")))  # fmt: skip
        server = start_daemon("serve", tmp / "srv", "--device", "cpu", "--allow-any",
                              "--listen", f"{SERVER}:7000", "--relay", f"{RELAY}:7400",
                              prefix=exec_in("srv"))  # fmt: skip
        started.append(server)
        home = tmp / "home"
        home.mkdir(mode=0o700)
        env = {**os.environ, "BURN_REMOTE_HOME": str(home), "BURN_REMOTE_PROBE_TIMEOUT": "1"}
        proc = subprocess.Popen(
            [*exec_in("cli"), sys.executable, __file__, "--mib", str(args.mib),
             "--repeats", str(args.repeats), "--client", f"{RELAY}:7400", server.peer_id],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        before = _relay_bytes(names["relay"])
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.strip() == "HEAL":
                relayed_phase = _relay_bytes(names["relay"]) - before
                heal(names["ra"])
                before = _relay_bytes(names["relay"])
                proc.stdin.write("go\n")
                proc.stdin.flush()
        code = proc.wait()
        direct_phase = _relay_bytes(names["relay"]) - before
        print(f"the relay received {relayed_phase / 2**20:.1f} MiB during the relayed uploads, "
              f"{direct_phase / 2**20:.1f} MiB during the direct ones", flush=True)  # fmt: skip
        sys.exit(code)
    finally:
        for d in started:
            d.stop()
        remove(names)


if __name__ == "__main__":
    main()
