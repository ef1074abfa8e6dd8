"""A UDP proxy that misbehaves on purpose: drops, delays, duplicates, reorders, cuts.

Why our own: tests must show that training over a bad link gives the same numbers as over a
clean one, and that a session survives a cut. ``tc netem`` needs root and a real interface;
this runs anywhere, is seeded (the same seed gives the same fault pattern for the same
traffic), and can be switched while running (``cut(seconds)``).

One client-facing socket; each client address gets its own upstream socket towards the
server, so replies find their way back. Faults apply in both directions. Everything held
(delayed or reordered datagrams) sits in one bounded heap: past ``max_queue`` datagrams, new
ones are dropped, as a router would.

Run standalone::

    python -m burn_remote.protocol.transport.faultproxy --listen 127.0.0.1:9000 \\
        --upstream 127.0.0.1:7000 --drop 0.1 --reorder 0.2 --seed 1
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import socket
import sys
import threading
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from types import TracebackType

import trio

from ..addressing import Address, SocketAddress, parse_host_port

_MAX_DATAGRAM = 65535


@dataclass(frozen=True)
class Faults:
    """What the proxy does to each datagram (each direction separately)."""

    drop: float = 0.0
    """Probability a datagram is lost."""

    delay: float = 0.0
    """Seconds every datagram is held before it is forwarded."""

    jitter: float = 0.0
    """Extra uniform random delay in [0, jitter) seconds."""

    duplicate: float = 0.0
    """Probability a datagram is sent twice."""

    reorder: float = 0.0
    """Probability a datagram is held back ``reorder_delay`` so later ones overtake it."""

    reorder_delay: float = 0.02
    """How long a reordered datagram is held (seconds)."""

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]")
        if min(self.delay, self.jitter, self.reorder_delay) < 0:
            raise ValueError("delays must be >= 0")


@dataclass
class ProxyStats:
    """Counters, for reports and tests (read them; do not rely on exact values)."""

    received: int = 0
    forwarded: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    overflowed: int = 0
    cut: int = 0
    bytes_forwarded: int = 0


@dataclass
class _Flow:
    client: SocketAddress
    upstream: socket.socket
    last_seen: float = 0.0


@dataclass(order=True)
class _Held:
    at: float
    seq: int
    data: bytes = field(compare=False)
    sock: socket.socket = field(compare=False)
    dest: SocketAddress = field(compare=False)


class FaultProxy:
    """Forward UDP between clients of ``listen`` and ``upstream``, applying :class:`Faults`.

    Use ``async with FaultProxy.open(...) as proxy`` under trio, or :meth:`start_thread`
    from synchronous code (tests driving a RemoteDevice).
    """

    def __init__(
        self,
        sock: socket.socket,
        upstream: tuple[str, int],
        faults: Faults,
        seed: int,
        max_queue: int,
        max_flows: int,
    ) -> None:
        self._sock = sock
        self.upstream = upstream
        self.faults = faults
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._max_queue = max_queue
        self._max_flows = max_flows
        self._flows: dict[SocketAddress, _Flow] = {}
        self._by_upstream: dict[socket.socket, _Flow] = {}
        self._held: list[_Held] = []
        self._seq = itertools.count()
        self._cut_until = 0.0
        self._cut_request: float | None = None
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    @classmethod
    def open(
        cls,
        upstream: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        faults: Faults | None = None,
        *,
        seed: int = 0,
        max_queue: int = 4096,
        max_flows: int = 64,
    ) -> _ProxyContext:
        """Bind ``listen`` and forward to ``upstream`` while the ``async with`` block runs."""
        return _ProxyContext(cls, upstream, listen, faults or Faults(), seed, max_queue, max_flows)

    @property
    def address(self) -> tuple[str, int]:
        """The client-facing (host, port)."""
        return self._sock.getsockname()[:2]

    def set_faults(self, faults: Faults) -> None:
        """Change the faults from now on (thread-safe: one attribute store)."""
        self.faults = faults

    def cut(self, seconds: float) -> None:
        """Drop everything, both ways, for ``seconds`` from now. Thread-safe."""
        self._cut_request = seconds
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._apply_cut)
            except trio.RunFinishedError:
                pass

    def _apply_cut(self) -> None:
        if self._cut_request is not None:
            self._cut_until = trio.current_time() + self._cut_request
            self._cut_request = None

    # -- running -----------------------------------------------------------------------------

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._release_loop)
            nursery.start_soon(self._read_loop, self._sock, None)
            task_status.started()

    async def _read_loop(self, sock: socket.socket, flow: _Flow | None) -> None:
        while True:
            await trio.lowlevel.wait_readable(sock)
            for _ in range(256):
                try:
                    data, addr = sock.recvfrom(_MAX_DATAGRAM)
                except BlockingIOError:
                    break
                except OSError:
                    continue
                now = trio.current_time()
                if flow is None:  # from a client: towards upstream
                    f = self._flow_for(addr, now)
                    if f is None:
                        continue
                    self._admit(data, f.upstream, self.upstream, now)
                else:  # from upstream: back to the client
                    flow.last_seen = now
                    self._admit(data, self._sock, flow.client, now)

    def _flow_for(self, client: SocketAddress, now: float) -> _Flow | None:
        flow = self._flows.get(client)
        if flow is None:
            if len(self._flows) >= self._max_flows:
                self.stats.overflowed += 1
                return None
            family = socket.AF_INET6 if ":" in self.upstream[0] else socket.AF_INET
            up = socket.socket(family, socket.SOCK_DGRAM)
            up.setblocking(False)
            up.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            flow = _Flow(client, up)
            self._flows[client] = flow
            self._by_upstream[up] = flow
            assert self._nursery is not None
            self._nursery.start_soon(self._read_loop, up, flow)
        flow.last_seen = now
        return flow

    def _admit(self, data: bytes, sock: socket.socket, dest: SocketAddress, now: float) -> None:
        """Decide this datagram's fate: drop it, or hold it until its send time (maybe twice)."""
        st, fx, rng = self.stats, self.faults, self._rng
        st.received += 1
        if now < self._cut_until:
            st.cut += 1
            return
        if rng.random() < fx.drop:
            st.dropped += 1
            return
        copies = 1
        if rng.random() < fx.duplicate:
            copies = 2
            st.duplicated += 1
        for _ in range(copies):
            at = now + fx.delay + (rng.random() * fx.jitter if fx.jitter else 0.0)
            if rng.random() < fx.reorder:
                at += fx.reorder_delay
                st.reordered += 1
            if at <= now and not self._held:
                self._send(sock, data, dest)
                continue
            if len(self._held) >= self._max_queue:
                st.overflowed += 1
                continue
            heapq.heappush(self._held, _Held(at, next(self._seq), data, sock, dest))
            self._wake.set()

    def _send(self, sock: socket.socket, data: bytes, dest: SocketAddress) -> None:
        try:
            sock.sendto(data, dest)
        except OSError:  # buffer full or unreachable: the network lost it
            self.stats.dropped += 1
            return
        self.stats.forwarded += 1
        self.stats.bytes_forwarded += len(data)

    async def _release_loop(self) -> None:
        while True:
            if not self._held:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            now = trio.current_time()
            while self._held and self._held[0].at <= now:
                h = heapq.heappop(self._held)
                if now < self._cut_until:
                    self.stats.cut += 1
                else:
                    self._send(h.sock, h.data, h.dest)
            if self._held:
                with trio.move_on_at(self._held[0].at):
                    await self._wake.wait()
                    self._wake = trio.Event()

    def _close(self) -> None:
        for flow in self._flows.values():
            flow.upstream.close()
        self._flows.clear()

    # -- synchronous use ---------------------------------------------------------------------

    @classmethod
    def start_thread(
        cls,
        upstream: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        faults: Faults | None = None,
        **kwargs: int,
    ) -> ProxyThread:
        """Run a proxy on a daemon thread (its own trio loop); stop with ``.stop()``."""
        return ProxyThread(cls, upstream, listen, faults or Faults(), kwargs)


class _ProxyContext:
    def __init__(
        self,
        cls: type[FaultProxy],
        upstream: Address,
        listen: Address,
        faults: Faults,
        seed: int,
        max_queue: int,
        flows: int,
    ) -> None:
        self._args = (cls, upstream, listen, faults, seed, max_queue, flows)
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None

    async def __aenter__(self) -> FaultProxy:
        cls, upstream, listen, faults, seed, max_queue, flows = self._args
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(listen)
        self._proxy = cls(sock, upstream, faults, seed, max_queue, flows)
        nursery_cm = self._nursery_cm = trio.open_nursery()
        nursery = await nursery_cm.__aenter__()
        await nursery.start(self._proxy._run)
        self._nursery = nursery
        return self._proxy

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._nursery_cm is None:
            raise RuntimeError("the fault proxy's context was left without being entered")
        self._nursery.cancel_scope.cancel()
        try:
            return await self._nursery_cm.__aexit__(exc_type, exc, tb)
        finally:
            self._proxy._close()
            self._proxy._sock.close()


class ProxyThread:
    """A :class:`FaultProxy` on its own thread, for synchronous tests."""

    def __init__(
        self,
        cls: type[FaultProxy],
        upstream: Address,
        listen: Address,
        faults: Faults,
        kwargs: dict[str, int],
    ) -> None:
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self.proxy: FaultProxy | None = None
        self._error: BaseException | None = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with cls.open(upstream, listen, faults, **kwargs) as proxy:
                self.proxy = proxy
                self._ready.set()
                await self._stop.wait()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # reported by the constructor or stop()
                self._error = exc
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self.proxy is None:
            raise RuntimeError(f"fault proxy did not start: {self._error!r}")

    @property
    def address(self) -> tuple[str, int]:
        assert self.proxy is not None
        return self.proxy.address

    @property
    def stats(self) -> ProxyStats:
        assert self.proxy is not None
        return replace(self.proxy.stats)

    def cut(self, seconds: float) -> None:
        assert self.proxy is not None
        self.proxy.cut(seconds)

    def set_faults(self, faults: Faults) -> None:
        assert self.proxy is not None
        self.proxy.set_faults(faults)

    def stop(self) -> None:
        """Stop forwarding and join the thread."""
        if self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(10)


def _hostport(text: str) -> tuple[str, int]:
    return parse_host_port(text, listen=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a proxy until interrupted; prints the address it listens on."""
    p = argparse.ArgumentParser(prog="python -m burn_remote.protocol.transport.faultproxy")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT")
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--jitter", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--duplicate", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-queue", type=int, default=4096)
    args = p.parse_args(argv)
    faults = Faults(args.drop, args.delay, args.jitter, args.duplicate, args.reorder)

    async def run() -> None:
        async with FaultProxy.open(
            _hostport(args.upstream),
            _hostport(args.listen),
            faults,
            seed=args.seed,
            max_queue=args.max_queue,
        ) as proxy:
            host, port = proxy.address
            print(f"faultproxy listening on {host}:{port} -> {args.upstream}", flush=True)
            await trio.sleep_forever()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass
    return 0


__all__ = ["FaultProxy", "Faults", "ProxyStats", "ProxyThread", "main"]

if __name__ == "__main__":
    sys.exit(main())
