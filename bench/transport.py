"""Transport benchmark: bulk rates and round trips, burn-remote beside plain baselines.

Prints, in one run (separate server and client processes, as on two machines):
- bulk upload MB/s over the transport at the loopback datagram size and at 1452-byte
  datagrams, beside asyncio TLS over TCP, and handshake latency; the 1452-byte upload again
  through the project's FaultProxy dropping 1 % and 10 % of datagrams (``--loss``), beside
  the same without loss;
- a large tensor's upload and read-back rates through a `RemoteDevice` and a real
  `burn-remote serve` (chunked bulk transfers), and their ratio to the transport's own rate,
  for each client QUIC engine installed (aioquic; qh3 with the `qh3` extra), against an
  aioquic server;
- the `item()` round trip per client engine (medians of interleaved runs), on a fresh
  connection (one that has carried only a few small round trips: a congestion window and
  pacer at their initial state) and on a warm one (after the bulk transfers above), beside
  a 64-byte echo over the transport and over a plain asyncio TCP socket, and beside the same
  round trip without the two round-trip fast paths (a server with
  ``BURN_REMOTE_INLINE_FRAMES=0``, a client waiting through its reader thread:
  ``_remote_link.DIRECT_WAIT`` off; warm), with the CPU both processes spend per trip;
- the `item()` round trip per server engine x client engine (`burn-remote serve
  --quic-engine`), fresh and warm, with the client's and the server's CPU per trip apart;
- a 64-byte echo over each stock QUIC engine's own asyncio API, side by side (the same
  engine at both ends: what each QUIC library itself costs per round trip).

Usage::

    .venv/bin/python bench/transport.py [--mib 256] [--frame-kib 1024] [--handshakes 20]
        [--tensor-mib 256] [--trips 300] [--loss 0.01 0.1] [--lossy-mib 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import ssl
import statistics
import sys
import tempfile
import time

MiB = 1024 * 1024


# -- burn-remote QUIC ------------------------------------------------------------------------


def _quic_server(conn, datagram_size: int | None) -> None:
    import trio
    from burn_remote.protocol.transport import Endpoint, EndpointConfig, Identity

    async def handler(c):
        while True:
            try:
                s = await c.accept_stream()
            except Exception:
                return
            n = 0
            while (frame := await s.receive_frame()) is not None:
                n += len(frame)
            await s.send_frame(n.to_bytes(8, "big"))
            await s.close()

    async def main():
        ident = Identity.generate()
        config = EndpointConfig(max_datagram_size=datagram_size)
        async with Endpoint.open(ident, config=config, allow_any=True) as ep:
            conn.send((str(ident.peer_id), ep.local_address))
            await ep.serve(handler)

    trio.run(main)


def bench_quic(
    total: int, frame: int, datagram_size: int | None, handshakes: int, drop: float = 0.0
) -> dict:
    """Upload ``total`` bytes to a server process; ``drop``: through a FaultProxy (a thread
    of this process) that loses that share of datagrams each way."""
    import trio
    from burn_remote.protocol.transport import Endpoint, EndpointConfig, Identity
    from burn_remote.protocol.transport.faultproxy import FaultProxy, Faults

    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_quic_server, args=(child, datagram_size), daemon=True
    )
    proc.start()
    peer, addr = parent.recv()
    result: dict = {}
    proxy = None
    if drop:
        host, port = addr
        proxy = FaultProxy.start_thread((host, port), faults=Faults(drop=drop), seed=1)
        addr = proxy.address

    async def main():
        config = EndpointConfig(max_datagram_size=datagram_size)
        async with Endpoint.open(Identity.generate(), config=config) as ep:
            times = []
            for _ in range(handshakes):
                t0 = time.perf_counter()
                c = await ep.connect(peer, addr)
                times.append(time.perf_counter() - t0)
                await c.close()
            result["handshake_ms"] = statistics.median(times) * 1000
            c = await ep.connect(peer, addr)
            payload = memoryview(os.urandom(frame))
            s = await c.open_stream()
            t0 = time.perf_counter()
            for _ in range(total // frame):
                await s.send_frame(payload)
            await s.close()
            reply = await s.receive_frame()
            dt = time.perf_counter() - t0
            assert int.from_bytes(reply, "big") == total // frame * frame
            result["mb_s"] = total / dt / 1e6
            await c.close()

    try:
        trio.run(main)
    finally:
        if proxy is not None:
            proxy.stop()
        proc.kill()
        proc.join()
    return result


# -- asyncio TLS over TCP --------------------------------------------------------------------


def _write_cert(tmp: str) -> tuple[str, str]:
    from burn_remote.protocol.transport import Identity
    from cryptography.hazmat.primitives import serialization

    ident = Identity.generate()
    cert = os.path.join(tmp, "cert.pem")
    key = os.path.join(tmp, "key.pem")
    with open(cert, "wb") as f:
        f.write(ident.certificate().public_bytes(serialization.Encoding.PEM))
    with open(key, "wb") as f:
        f.write(
            ident.private_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert, key


def _tls_server(conn, cert: str, key: str) -> None:
    async def handle(reader, writer):
        n = 0
        while size := int.from_bytes(await reader.readexactly(4), "big"):
            n += len(await reader.readexactly(size))
        writer.write(n.to_bytes(8, "big"))
        await writer.drain()
        writer.close()

    async def main():
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        conn.send(server.sockets[0].getsockname()[:2])
        await server.serve_forever()

    asyncio.run(main())


def bench_tls(total: int, frame: int, handshakes: int) -> dict:
    tmp = tempfile.mkdtemp()
    cert, key = _write_cert(tmp)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_tls_server, args=(child, cert, key), daemon=True)
    proc.start()
    host, port = parent.recv()
    result: dict = {}

    async def main():
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        times = []
        for _ in range(handshakes):
            t0 = time.perf_counter()
            _r, w = await asyncio.open_connection(host, port, ssl=ctx)
            times.append(time.perf_counter() - t0)
            w.write(bytes(4))
            w.close()
        result["handshake_ms"] = statistics.median(times) * 1000
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
        payload = os.urandom(frame)
        t0 = time.perf_counter()
        for _ in range(total // frame):
            writer.write(len(payload).to_bytes(4, "big"))
            writer.write(payload)
            await writer.drain()
        writer.write(bytes(4))  # a zero-length frame ends the upload
        reply = await reader.readexactly(8)
        dt = time.perf_counter() - t0
        assert int.from_bytes(reply, "big") >= total
        result["mb_s"] = total / dt / 1e6
        writer.close()

    try:
        asyncio.run(main())
    finally:
        proc.kill()
        proc.join()
    return result


# -- through a RemoteDevice -------------------------------------------------------------------


def engines() -> list[str]:
    """The client QUIC engines installed here: aioquic always, qh3 with the `qh3` extra."""
    import importlib.util

    return ["aioquic"] + (["qh3"] if importlib.util.find_spec("qh3") is not None else [])


def remote_device(target: str, engine: str, key=None):  # type: ignore[no-untyped-def]
    """A RemoteDevice whose connection runs on ``engine`` (what BURN_REMOTE_QUIC_ENGINE sets
    for a whole process), connected; another ``key`` file (created if missing) gives a new
    session on a new connection."""
    from burn_remote import RemoteDevice, _remote_link
    from burn_remote.protocol.transport._quic import PeerQuicConnection

    _remote_link.QUIC_ENGINE = engine
    dev = RemoteDevice(target, key=key)
    dev.sync()
    quic = dev._rec.runtime.link._conn._quic  # noqa: SLF001 - what it runs on
    runs = type(quic).__name__
    aioquic = isinstance(quic, PeerQuicConnection)  # (with or without its fast paths)
    if aioquic != (engine == "aioquic"):  # an earlier device for this target and key
        raise RuntimeError(f"the {engine} device runs {runs}: give it a key of its own")
    return dev


def bench_remote(tensor_mib: int, trips: int, repeats: int = 3) -> dict:
    """Per client engine: upload and read-back MB/s of one large tensor, and item(); beside
    the 64-byte echoes over the bare transport and plain TCP. Engines interleaved, medians."""
    from pathlib import Path

    import numpy as np
    from burn_remote import _remote_link
    from burn_remote.server.testing import start_server

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from remote import transport_echo

    home = tempfile.mkdtemp(prefix="burn-remote-bench-")
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = home
    server = start_server(Path(home) / "server")
    slow = start_server(  # the same server without answering on its receive loop
        Path(home) / "slow", env=dict(os.environ, BURN_REMOTE_INLINE_FRAMES="0")
    )
    names = engines()
    ups: dict[str, list[float]] = {e: [] for e in names}
    downs: dict[str, list[float]] = {e: [] for e in names}
    items: dict[str, list[tuple[float, float]]] = {e: [] for e in names}
    items_fresh: dict[str, list[tuple[float, float]]] = {e: [] for e in names}
    items_slow: dict[str, list[tuple[float, float]]] = {e: [] for e in names}
    echoes, tcp = [], []
    try:
        # a key per engine: RemoteDevice hands out one device per target and key, so
        # without it every engine's figures would be the first engine's connection
        devs = {e: remote_device(server.target, e, Path(home) / f"{e}.key") for e in names}
        slow_devs = {e: remote_device(slow.target, e, Path(home) / f"{e}.key") for e in names}
        x = np.random.default_rng(0).standard_normal(tensor_mib * MiB // 4).astype(np.float32)
        for _ in range(repeats):
            for engine, dev in devs.items():
                t0 = time.perf_counter()
                t = dev.tensor(x)
                dev.sync()
                t1 = time.perf_counter()
                back = t.numpy()
                t2 = time.perf_counter()
                assert back.shape == x.shape
                ups[engine].append(x.nbytes / (t1 - t0) / 1e6)
                downs[engine].append(x.nbytes / (t2 - t1) / 1e6)
                del t, back
        for dev in slow_devs.values():  # warm like the others: compare like with like
            dev.tensor(x).sum().item()
        for run in range(5):  # interleaved, medians: a shared machine is noisy
            for engine in names:
                key = Path(home) / f"fresh-{engine}-{run}.key"  # a new connection each run
                fresh = remote_device(server.target, engine, key)
                items_fresh[engine].append(item_trips(fresh, trips, server.proc.pid))
                fresh.close()
                items[engine].append(item_trips(devs[engine], trips, server.proc.pid))
                _remote_link.DIRECT_WAIT = False
                try:
                    items_slow[engine].append(item_trips(slow_devs[engine], trips, slow.proc.pid))
                finally:
                    _remote_link.DIRECT_WAIT = True
            echoes.append(transport_echo(trips))
            tcp.append(tcp_echo(trips))
        for dev in [*devs.values(), *slow_devs.values()]:
            dev.close()
    finally:
        server.stop()
        slow.stop()
    med = statistics.median
    return {
        "upload_mb_s": {e: med(v) for e, v in ups.items()},
        "read_mb_s": {e: med(v) for e, v in downs.items()},
        "item_us": {e: med(w for w, _ in v) * 1e6 for e, v in items.items()},
        "item_cpu_us": {e: med(c for _, c in v) / trips * 1e6 for e, v in items.items()},
        "item_fresh_us": {e: med(w for w, _ in v) * 1e6 for e, v in items_fresh.items()},
        "item_fresh_cpu_us": {
            e: med(c for _, c in v) / trips * 1e6 for e, v in items_fresh.items()
        },
        "item_slow_us": {e: med(w for w, _ in v) * 1e6 for e, v in items_slow.items()},
        "item_slow_cpu_us": {e: med(c for _, c in v) / trips * 1e6 for e, v in items_slow.items()},
        "echo_us": med(echoes) * 1e6,
        "tcp_us": med(tcp) * 1e6,
    }


def bench_item_servers(trips: int, rounds: int = 5) -> dict:
    """``item()`` per (server engine, client engine): a ``burn-remote serve --quic-engine``
    for each server engine installed, a warm device per client engine on each (three 4 MiB
    uploads first: a grown congestion window) and a fresh one per run (its own key: a new
    session on a new connection); runs interleaved, medians. Per trip: wall, this process's
    CPU and the server's CPU (schedstat), apart."""
    from pathlib import Path

    import numpy as np
    from burn_remote.server.testing import start_server

    home = Path(tempfile.mkdtemp(prefix="burn-remote-bench-"))
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = str(home)
    servers = {e: start_server(home / f"server-{e}", "--quic-engine", e) for e in engines()}
    pairs = [(s, c) for s in servers for c in engines()]
    got: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {
        (kind, s, c): [] for kind in ("warm", "fresh") for s, c in pairs
    }
    try:
        warm = {}
        x = np.ones(MiB, np.float32)
        for s, c in pairs:
            dev = remote_device(servers[s].target, c, home / f"warm-{s}-{c}.key")
            for _ in range(3):
                dev.tensor(x).sum().item()
            warm[s, c] = dev
        for run in range(rounds):
            for s, c in pairs:
                pid = servers[s].proc.pid
                fresh = remote_device(servers[s].target, c, home / f"fresh-{s}-{c}-{run}.key")
                got["fresh", s, c].append(_item_split(fresh, trips, pid))
                fresh.close()
                got["warm", s, c].append(_item_split(warm[s, c], trips, pid))
        for dev in warm.values():
            dev.close()
    finally:
        for server in servers.values():
            server.stop()
    med = statistics.median
    return {k: tuple(med(r[i] for r in v) * 1e6 for i in range(3)) for k, v in got.items()}


def _item_split(dev, trips: int, server_pid: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """Seconds per ``item()`` trip: wall, this process's CPU, the server's CPU."""
    import numpy as np

    t = dev.tensor(np.ones(4, np.float32)).sum()
    for _ in range(50):
        t.item()
    mine, theirs = _cpu_seconds(os.getpid()), _cpu_seconds(server_pid)
    start = time.perf_counter()
    for _ in range(trips):
        t.item()
    wall = time.perf_counter() - start
    mine, theirs = _cpu_seconds(os.getpid()) - mine, _cpu_seconds(server_pid) - theirs
    return wall / trips, mine / trips, theirs / trips


def _cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process so far (``schedstat``: nanoseconds, where
    ``/proc/PID/stat`` counts 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total / 1e9


def item_trips(dev, trips: int, server_pid: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(seconds per ``item()`` round trip, CPU seconds of this process and the server for all
    ``trips``), after a warm-up."""
    import numpy as np

    t = dev.tensor(np.ones(4, np.float32)).sum()
    for _ in range(50):
        t.item()
    cpu = _cpu_seconds(os.getpid()) + _cpu_seconds(server_pid)
    start = time.perf_counter()
    for _ in range(trips):
        t.item()
    wall = (time.perf_counter() - start) / trips
    return wall, _cpu_seconds(os.getpid()) + _cpu_seconds(server_pid) - cpu


def tcp_echo(n: int, warm_up: int = 50) -> float:
    """Seconds per 64-byte round trip over a plain asyncio TCP socket (no TLS): the floor."""

    async def main() -> float:
        async def handle(reader, writer):
            while data := await reader.read(64):
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        reader, writer = await asyncio.open_connection(host, port)
        payload = b"x" * 64
        for i in range(warm_up + n):
            if i == warm_up:
                t0 = time.perf_counter()
            writer.write(payload)
            await writer.drain()
            await reader.readexactly(64)
        dt = (time.perf_counter() - t0) / n
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.01)  # the handler sees the end and returns
        server.close()
        await server.wait_closed()
        return dt

    return asyncio.run(main())


def stock_echo(engine: str, n: int, warm_up: int = 50) -> float:
    """Seconds per 64-byte echo over a stock QUIC engine's asyncio API ("aioquic" or "qh3"),
    server in a thread of this process, P-256 certificate, default settings."""
    import datetime
    import importlib
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    api = importlib.import_module(f"{engine}.asyncio")
    Config = importlib.import_module(f"{engine}.quic.configuration").QuicConfiguration
    tmp = tempfile.mkdtemp()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "echo")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    ready, addr, stop = threading.Event(), [], []

    def handler(reader, writer) -> None:
        async def loop() -> None:
            while data := await reader.read(64):
                writer.write(data)

        asyncio.ensure_future(loop())

    async def server() -> None:
        config = Config(alpn_protocols=["echo"], is_client=False)
        config.load_cert_chain(cert_path, key_path)
        srv = await api.serve("127.0.0.1", 0, configuration=config, stream_handler=handler)
        addr.append(srv._transport.get_extra_info("sockname")[:2])
        done = asyncio.Event()
        stop.append((asyncio.get_running_loop(), done))
        ready.set()
        await done.wait()
        srv.close()

    thread = threading.Thread(target=asyncio.run, args=(server(),), daemon=True)
    thread.start()
    ready.wait(30)

    async def client() -> float:
        config = Config(alpn_protocols=["echo"], verify_mode=ssl.CERT_NONE)
        async with api.connect(*addr[0], configuration=config) as conn:
            reader, writer = await conn.create_stream()
            payload = b"x" * 64
            for i in range(warm_up + n):
                if i == warm_up:
                    t0 = time.perf_counter()
                writer.write(payload)
                await reader.readexactly(64)
            return (time.perf_counter() - t0) / n

    try:
        return asyncio.run(client())
    finally:
        loop, done = stop[0]
        loop.call_soon_threadsafe(done.set)
        thread.join(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="upload size in MiB")
    ap.add_argument("--frame-kib", type=int, default=1024, help="frame size in KiB")
    ap.add_argument("--handshakes", type=int, default=20, help="handshakes to time")
    ap.add_argument("--tensor-mib", type=int, default=256, help="tensor size for RemoteDevice")
    ap.add_argument("--trips", type=int, default=300, help="round trips per latency run")
    ap.add_argument(
        "--loss", type=float, nargs="*", default=[0.01, 0.1], help="datagram loss rates"
    )
    ap.add_argument("--lossy-mib", type=int, default=8, help="upload size through loss")
    args = ap.parse_args(argv)
    total, frame = args.mib * MiB, args.frame_kib * 1024

    from burn_remote.protocol.transport import LOOPBACK_DATAGRAM_SIZE

    print(f"upload {args.mib} MiB in {args.frame_kib} KiB frames, loopback, {os.cpu_count()} CPUs")
    tls = bench_tls(total, frame, args.handshakes)
    print(f"  asyncio TLS/TCP baseline   : {tls['mb_s']:8.1f} MB/s")
    big = bench_quic(total, frame, None, args.handshakes)
    print(
        f"  QUIC {LOOPBACK_DATAGRAM_SIZE}-byte datagrams : {big['mb_s']:8.1f} MB/s"
        f"   ratio to TLS/TCP {big['mb_s'] / tls['mb_s']:.2f}x"
    )
    small = bench_quic(total, frame, 1452, 3)
    print(
        f"  QUIC 1452-byte datagrams   : {small['mb_s']:8.1f} MB/s"
        f"   ratio to TLS/TCP {small['mb_s'] / tls['mb_s']:.2f}x"
    )
    if args.loss:
        lossy = args.lossy_mib * MiB
        clean = bench_quic(lossy, frame, 1452, 1)["mb_s"]
        rates = [f"0 %: {clean:.1f} MB/s"]
        for drop in args.loss:
            mb_s = bench_quic(lossy, frame, 1452, 1, drop)["mb_s"]
            rates.append(f"{drop:.0%}: {mb_s:.1f} MB/s ({mb_s / clean:.2f}x)")
        print(f"  QUIC 1452-byte datagrams, {args.lossy_mib} MiB through loss: {', '.join(rates)}")
    print(
        f"  handshake (median of {args.handshakes}): QUIC {big['handshake_ms']:.2f} ms,"
        f" TLS/TCP {tls['handshake_ms']:.2f} ms"
    )
    r = bench_remote(args.tensor_mib, args.trips)
    print(
        f"RemoteDevice, one {args.tensor_mib} MiB float32 tensor (median of 3), per client engine:"
    )
    for engine in r["upload_mb_s"]:
        up, down = r["upload_mb_s"][engine], r["read_mb_s"][engine]
        print(
            f"  {engine:8} upload {up:7.1f} MB/s ({up / big['mb_s']:.2f}x the transport's bulk "
            f"rate), read {down:7.1f} MB/s ({down / big['mb_s']:.2f}x)"
        )
    print(
        f"round trips (medians of 5 interleaved runs of {args.trips}): "
        + "; ".join(
            f"item() on {e} {r['item_fresh_us'][e]:.0f} us fresh, {v:.0f} us warm"
            for e, v in r["item_us"].items()
        )
        + f"; 64-byte echo over the transport {r['echo_us']:.0f} us; over plain asyncio TCP "
        f"{r['tcp_us']:.0f} us"
    )
    for e in r["item_us"]:
        fast, slow = r["item_us"][e], r["item_slow_us"][e]
        cpu, slow_cpu = r["item_cpu_us"][e], r["item_slow_cpu_us"][e]
        fresh, fresh_cpu = r["item_fresh_us"][e], r["item_fresh_cpu_us"][e]
        print(
            f"  item() on {e}: fresh connection {fresh:.0f} us, client+server CPU "
            f"{fresh_cpu:.0f} us per trip; warm {fast:.0f} us, CPU {cpu:.0f} us; warm without "
            f"the fast paths {slow:.0f} us, CPU {slow_cpu:.0f} us "
            f"(ratio {fast / slow:.2f}x wall, {cpu / slow_cpu:.2f}x CPU)"
        )
    split = bench_item_servers(args.trips)
    print(
        f"item() per server engine x client engine (medians of 5 interleaved runs of "
        f"{args.trips}; wall / client CPU / server CPU per trip, us; load "
        f"{os.getloadavg()[0]:.2f}):"
    )
    for (kind, s, c), (wall, mine, theirs) in split.items():
        print(f"  {kind:5} server {s:7} client {c:7}: {wall:5.0f} / {mine:4.0f} / {theirs:4.0f}")
    runs: dict[str, list[float]] = {e: [] for e in engines()}
    for _ in range(5):  # interleaved, medians
        for engine in runs:
            runs[engine].append(stock_echo(engine, args.trips))
    shown = ", ".join(f"{e} {statistics.median(v) * 1e6:.0f} us" for e, v in runs.items())
    print(f"64-byte echo over each stock QUIC engine's asyncio API (medians of 5): {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
