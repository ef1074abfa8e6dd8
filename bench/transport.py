"""Transport benchmark: bulk upload over burn-remote QUIC vs. Python's asyncio TLS over TCP.

Prints, in one run: upload MB/s at the loopback default datagram size and at 1452-byte
datagrams, the asyncio TLS-over-TCP baseline on loopback, their ratios, and handshake
latency. Server and client run in separate processes (as they would on two machines), for
both transports. Usage::

    .venv/bin/python bench/transport.py [--mib 256] [--frame-kib 1024] [--handshakes 20]
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


def bench_quic(total: int, frame: int, datagram_size: int | None, handshakes: int) -> dict:
    import trio
    from burn_remote.protocol.transport import Endpoint, EndpointConfig, Identity

    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_quic_server, args=(child, datagram_size), daemon=True
    )
    proc.start()
    peer, addr = parent.recv()
    result: dict = {}

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="upload size in MiB")
    ap.add_argument("--frame-kib", type=int, default=1024, help="frame size in KiB")
    ap.add_argument("--handshakes", type=int, default=20, help="handshakes to time")
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
    print(
        f"  handshake (median of {args.handshakes}): QUIC {big['handshake_ms']:.2f} ms,"
        f" TLS/TCP {tls['handshake_ms']:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
