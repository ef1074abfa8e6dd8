"""Remote vs local on loopback, in one run: digits-MLP and small-transformer step time (loss
read every 10 steps, parameters kept on the device), messages and bytes per step,
graph replay vs re-sending the graph every step, and one item() round trip (a resident
read) and one execute + read (`x.sum().item()`) beside a bare 64-byte echo over the same QUIC
transport (aioquic driven by trio) and over stock aioquic.

Run: .venv/bin/python bench/remote.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from burn_remote import Device, RemoteDevice, nn, optim  # noqa: E402
from burn_remote import functional as F  # noqa: E402
from burn_remote.server.testing import start_server  # noqa: E402

READ_EVERY = 10
"""The loops read the loss every this many steps, keeping parameters on the device."""


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def mlp_model(dev):
    nn.seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    x, y = _digits()

    def loss_at(k: int):
        i = (k * 64) % (len(x) - 64)
        return F.cross_entropy(model(dev.tensor(x[i : i + 64])), dev.tensor(y[i : i + 64]))

    return model, loss_at


def transformer_model(dev):
    """A small GPT (2 layers, d_model 64, 4 heads, context 32) on random tokens, batch 8."""
    nn.seed(0)
    config = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=64, context=32)
    model = nn.GPT(config, device=dev)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (64, 33))

    def loss_at(k: int):
        rows = tokens[(k * 8) % 56 : (k * 8) % 56 + 8]
        return model.loss(dev.tensor(rows[:, :-1]), dev.tensor(rows[:, 1:]))

    return model, loss_at


def train_loop(
    dev, build, steps: int, resend_graph: bool = False, cpu_of: tuple = ()
) -> tuple[float, dict, dict]:
    """Seconds per step (after 5 warm-up steps) and stats before/after the timed part; with
    `cpu_of` (pids), the stats also hold ``cpu``: CPU seconds per timed step of each."""
    model, loss_at = build(dev)
    opt = optim.AdamW(model.parameters(), lr=1e-2)

    def step(k: int) -> None:
        loss = loss_at(k)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if resend_graph:
            dev._rt.proto.known.clear()
        if k % READ_EVERY == READ_EVERY - 1:
            loss.item()
        else:
            dev.flush()

    for k in range(5):
        step(k)
    dev.sync()
    before = dict(dev.stats())
    cpu = [cpu_seconds(p) for p in cpu_of]
    t = time.perf_counter()
    for k in range(steps):
        step(k)
    dev.sync()
    dt = (time.perf_counter() - t) / steps
    after = dict(dev.stats())
    after["cpu"] = [(cpu_seconds(p) - c) / steps for p, c in zip(cpu_of, cpu)]
    return dt, before, after


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU time (user + system) of a process so far, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(
    name: str, build, remote_dev, steps: int, server_pid: int, rounds: int = 3
) -> tuple[float, dict, dict]:
    """Local and remote loops interleaved, medians of `rounds`: this machine is noisy. Also
    where the remote loop's CPU goes: this process (recording and QUIC), the server."""
    local, remote, cpu, stats = [], [], [], None
    for _ in range(rounds):
        local.append(train_loop(Device.cpu(), build, steps)[0])
        pids = ("self", server_pid)
        dt, b, a = train_loop(remote_dev, build, steps, cpu_of=pids)
        cpu.append(a["cpu"])
        remote.append(dt)
        stats = (b, a)
    lo, re = statistics.median(local), statistics.median(remote)
    mine, server = (statistics.median(c[k] for c in cpu) * 1e6 for k in range(2))
    print(
        f"{name} step (loss read every {READ_EVERY}): local {lo * 1e6:.0f} us, "
        f"remote {re * 1e6:.0f} us, remote/local {re / lo:.2f}; remote CPU per step: "
        f"user's process {mine:.0f} us (recording and QUIC), server {server:.0f} us "
        f"({os.cpu_count()} CPUs)"
    )
    return re, stats[0], stats[1]


WARM_UP = 50
"""Untimed round trips before each latency loop (item and both echoes alike): after a pause,
the first hundred or so round trips on this VM run ~20 % slower (CPU placement and caches)."""


def item_round_trip(dev, n: int) -> float:
    t = dev.tensor(np.ones(4, np.float32)).sum()
    for _ in range(WARM_UP):
        t.item()
    start = time.perf_counter()
    for _ in range(n):
        t.item()
    return (time.perf_counter() - start) / n


def execute_read_round_trip(dev, n: int) -> float:
    """Seconds per ``x.sum().item()`` on a resident ``x``: one frame with an ExecuteGraph
    of a cached one-op graph and a Read, and its reply (issue 35's round trip)."""
    x = dev.tensor(np.ones(4, np.float32))
    for _ in range(WARM_UP):
        x.sum().item()
    start = time.perf_counter()
    for _ in range(n):
        x.sum().item()
    return (time.perf_counter() - start) / n


def transport_echo(n: int) -> float:
    """Seconds per 64-byte echo round trip over the bare transport (no session, no engine)."""
    import trio
    from burn_remote.protocol.transport import Endpoint, Identity

    home = Path(tempfile.mkdtemp())
    srv_id = Identity.load_or_create(home / "s")
    cli_id = Identity.load_or_create(home / "c")
    ready = threading.Event()
    addr: list = []
    stop = threading.Event()

    async def echo(conn) -> None:
        s = await conn.accept_stream()
        while (f := await s.receive_frame()) is not None:
            await s.send_frame(f)

    async def server() -> None:
        async with Endpoint.open(srv_id, allow_any=True) as ep:
            addr.append(ep.local_address)
            ready.set()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ep.serve, echo)
                while not stop.is_set():
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    th = threading.Thread(target=trio.run, args=(server,), daemon=True)
    th.start()
    ready.wait(30)
    result: list[float] = []

    async def client() -> None:
        async with Endpoint.open(cli_id) as ep:
            conn = await ep.connect(srv_id.peer_id, addr[0])
            s = await conn.open_stream()
            payload = b"x" * 64
            for _ in range(WARM_UP):
                await s.send_frame(payload)
                await s.receive_frame()
            t = time.perf_counter()
            for _ in range(n):
                await s.send_frame(payload)
                await s.receive_frame()
            result.append((time.perf_counter() - t) / n)
            await s.close()
            await conn.close()

    trio.run(client)
    stop.set()
    th.join(10)
    return result[0]


def aioquic_echo(n: int) -> float:
    """Seconds per 64-byte echo round trip over stock aioquic: its own asyncio API, default
    settings, server in a thread of this process (what "a bare aioquic echo" means). The
    echo itself is bench/transport.py's, which measures every stock engine the same way."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from transport import stock_echo

    return stock_echo("aioquic", n, warm_up=WARM_UP)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="burn-remote-bench-")
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = home
    server = start_server(os.path.join(home, "server"))
    peer, addr = server.peer_id, server.address
    try:
        dev = RemoteDevice(f"{peer}@{addr}")
        dev.sync()  # connected before anything is timed
        remote, b, a = compare("digits MLP", mlp_model, dev, args.steps, server.proc.pid, rounds=5)
        compare(
            "small transformer", transformer_model, dev, max(args.steps // 4, 20), server.proc.pid
        )
        n = args.steps
        print(
            f"per step: {(a['messages_sent'] - b['messages_sent']) / n:.2f} messages sent, "
            f"{(a['bytes_sent'] - b['bytes_sent']) / n:.0f} bytes sent "
            f"({(a['data_bytes_sent'] - b['data_bytes_sent']) / n:.0f} of them batch data), "
            f"{(a['messages_received'] - b['messages_received']) / n:.2f} messages and "
            f"{(a['bytes_received'] - b['bytes_received']) / n:.0f} bytes received"
        )
        dev2 = RemoteDevice(f"{peer}@{addr}", key=Path(home) / "second-key")
        resend, b2, a2 = train_loop(dev2, mlp_model, args.steps, resend_graph=True)
        print(
            f"graph replay: {remote * 1e6:.0f} us and {(a['bytes_sent'] - b['bytes_sent']) / n:.0f} "
            f"B/step; re-sending the graph every step: {resend * 1e6:.0f} us and "
            f"{(a2['bytes_sent'] - b2['bytes_sent']) / n:.0f} B/step"
        )
        trips, executes, echoes, stock = [], [], [], []
        for _ in range(5):  # interleaved, medians: this machine is noisy
            trips.append(item_round_trip(dev, 200))
            executes.append(execute_read_round_trip(dev, 200))
            echoes.append(transport_echo(200))
            stock.append(aioquic_echo(200))
        rt, ex, echo, bare = (statistics.median(x) for x in (trips, executes, echoes, stock))
        print(
            f"item() round trip {rt * 1e6:.0f} us; 64-byte echo over stock aioquic (asyncio "
            f"API) {bare * 1e6:.0f} us, ratio {rt / bare:.2f}; over our transport (trio driver, "
            f"delayed ACKs) {echo * 1e6:.0f} us, ratio {rt / echo:.2f} "
            f"(medians of 5 interleaved runs)"
        )
        print(
            f"execute + read (x.sum().item()) {ex * 1e6:.0f} us: {ex / bare:.2f}x the stock "
            f"aioquic echo, {ex / echo:.2f}x our transport's (target <= 1.2x)"
        )
        dev.close()
        dev2.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
