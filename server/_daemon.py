"""The QUIC glue of the server: one endpoint, one task group per connection, sessions driven
through their sans-I/O interface with engine work in worker threads.

A connection's first stream is its control stream. Its first frame says what the connection
is: ``Hello`` starts a client session; a lone ``Fetch`` is another server redeeming a
capability (server-to-server move), answered with ``Data`` and the bytes on that stream.
Every later stream a client opens is a bulk stream: one transfer (``protocol/bulk.py``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ..protocol.addressing import format_host_port
from ..protocol.transport import (
    AuthorizedPeers,
    Connection,
    Endpoint,
    EndpointConfig,
    Identity,
    TransportError,
)
from ._fetch import is_fetch, serve_fetch
from ._group_service import is_group_link
from ._resume import Parking, refuse_legacy, run_session
from ._session_pump import SessionPump
from ._state import ServerState

log = logging.getLogger("burn_remote.server")

SWITCH_INTERVAL = 0.0005
"""Seconds a Python thread may keep the interpreter lock while another waits for it
(CPython's default is 0.005). The network loop serves every session from one thread, and
each turn of it waits for the lock: behind a worker validating and compiling a large graph
(pure Python for seconds) that wait was up to 5 ms a turn, several times a round trip."""

GC_THRESHOLDS = (10_000, 10, 10)
"""The cyclic garbage collector's thresholds (CPython's first one is 700). Compiling a large
graph allocates hundreds of thousands of objects that live on; with the default, every few
thousand of them started a collection, dozens of them full ones that walk the whole heap
while every thread waits. ``bench/graph_gc.py`` (three 100 000-node graphs, 2 shared
cores): 36 full collections taking 7.7 s, a 1 ms sleep on another thread late by 5.8 ms
(median) and 281 ms (p99); with these 4 taking 1.1 s, late by 0.8 and 23 ms."""


@dataclass
class ServeOptions:
    """Everything ``burn-remote serve`` needs; the CLI only fills this in."""

    state: ServerState
    identity: Identity
    bind: tuple[str, int] = ("127.0.0.1", 0)
    authorized_peers: Any = None
    allow_any: bool = False
    idle_timeout: float = 30.0
    relay: str | None = None
    """``host:port`` of a relay to publish our record on and accept relayed clients from."""
    advertise: list[str] | None = None
    """Addresses for the record; default: the bound address."""
    resume_grace: float = 30.0
    """Seconds a session outlives its dead connection, waiting for its client to resume."""
    http: tuple[str, int] | None = None
    """Where to serve ``/healthz`` and ``/metrics`` (None: no operator port)."""
    http_token: str | None = None
    """The operator port's bearer token (``--http-token-file``, ``$BURN_REMOTE_HTTP_TOKEN``)."""
    data_dir: str | None = None
    """The data directory (shown in the banner)."""
    ring_port: int | None = 0
    """TCP port of the ring data plane on the --listen host (0: any free one; None: off,
    group links carry ring data on QUIC)."""
    ring_advertise: str = ""
    """``HOST:PORT`` ring neighbours dial for the data plane instead (port mapping)."""
    ring_seal_loopback: bool = False
    """Encrypt same-host ring data links too."""
    ring_loopback_tcp: bool = False
    """Same-host ring data links over loopback TCP rather than shared memory."""
    quic_engine: str = "aioquic"
    """QUIC implementation of the connections served (``EndpointConfig.quic_engine``)."""


async def serve(opts: ServeOptions, on_ready: Callable[[Endpoint], None] | None = None) -> None:
    """Serve until cancelled (SIGINT/SIGTERM in ``run``)."""
    policy = opts.authorized_peers
    if not isinstance(policy, AuthorizedPeers):
        policy = AuthorizedPeers(policy, allow_any=opts.allow_any)
    policy.owner = opts.identity.peer_id  # the server's own key is always admitted, as admin
    opts.state.authorized = policy  # jobs and artifacts ask it for the peer's role
    config = EndpointConfig(
        max_frame_size=opts.state.limits.max_frame,
        idle_timeout=opts.idle_timeout,
        keepalive_interval=max(0.2, opts.idle_timeout / 3),
        quic_engine=opts.quic_engine,
    )
    async with (
        Endpoint.open(
            opts.identity,
            bind=opts.bind,
            config=config,
            authorized_peers=policy,
        ) as ep,
        trio.open_nursery() as nursery,
    ):
        if opts.relay:
            from ._relay_glue import start_relay_agent

            await start_relay_agent(nursery, opts, ep)
        from ._group_service import GroupService

        opts.state.collectives = GroupService(
            opts.state,
            ep,
            nursery,
            opts.ring_port,
            opts.ring_advertise,
            opts.ring_seal_loopback,
            not opts.ring_loopback_tcp,
        )
        nursery.start_soon(_close_on_exit, opts.state.collectives.shutdown)
        parking = Parking(opts.resume_grace)
        opts.state.resume_grace = opts.resume_grace
        nursery.start_soon(parking.sweep_loop)
        nursery.start_soon(_heartbeat, opts.state)
        nursery.start_soon(_release_kept_memory, opts.state)
        if on_ready is not None:
            on_ready(ep)
        await ep.serve(
            lambda conn: _connection(opts.state, ep, conn, parking), refuse_legacy=refuse_legacy
        )


async def _close_on_exit(close: Callable[[], None]) -> None:
    try:
        await trio.sleep_forever()
    finally:
        close()


async def _heartbeat(state: ServerState) -> None:
    """Tick while the loop turns: a handler that blocked the loop would stop the ticks. Each
    tick also measures how late it woke (``loop_lag``): the loop's real delay, which the
    time since the last tick (0 to HEARTBEAT on an idle server) is not."""
    import time

    from ._status import HEARTBEAT

    while True:
        before = time.monotonic()
        state.heartbeat = before
        await trio.sleep(HEARTBEAT)
        state.loop_lag = max(0.0, time.monotonic() - before - HEARTBEAT)


TRIM_EVERY = 10.0
"""Seconds between checks of the free heap memory malloc keeps (``_release_kept_memory``)."""
KEEP_FREE_FLOOR = 64 * 2**20
"""Free heap memory a server always lets malloc keep, beside twice the largest plan arena
run in the last two checks (a step's intermediates, and the outputs of the step before,
freed while it runs)."""


async def _release_kept_memory(state: ServerState) -> None:
    """Keep a long-running server's RSS from climbing. The CPU engine has malloc keep freed
    memory for its next step (engine/backends/cpu_memory.py), but between many sessions the
    heaps also keep every hole that tensors of many sizes leave: in a 50-session soak their
    free memory grew from 69 to 297 MiB while the tensors held stayed at 330-470 MiB, and
    RSS grew 12 % in 8 minutes. Every TRIM_EVERY seconds what is free beyond what recent
    steps need goes back to the kernel, from a worker thread (the call takes ~17 ms for
    300 MiB)."""
    from ..engine.backends.cpu_memory import release_kept_above

    while True:
        await trio.sleep(TRIM_EVERY)
        keep = KEEP_FREE_FLOOR + 2 * state.take_arena_need()
        freed = await trio.to_thread.run_sync(release_kept_above, keep)
        if freed >= 2**20:  # (a trim of holes already released gives back next to nothing)
            log.debug(
                "released %d MiB of the heap malloc kept free (it keeps %d MiB)",
                freed >> 20,
                keep >> 20,
                extra={"event": "heap_trim"},
            )


async def _connection(
    state: ServerState, ep: Endpoint, conn: Connection, parking: Parking | None = None
) -> None:
    try:
        control = await conn.accept_stream()
        first = await control.receive_frame()
        if first is None:
            return
        control.stop_oversized = False  # an oversized control frame is answered (LIMIT)
        if is_group_link(first) and state.collectives is not None:
            await state.collectives.serve_link(conn, control, first)
            return
        policy = state.authorized
        if policy is not None and policy.is_guest_only(conn.peer_id):
            await conn.close("this peer is admitted for device-group links only")
            return
        if is_fetch(first):
            await serve_fetch(state, conn, control, first)
            return
        await run_session(state, ep, conn, control, first, SessionPump, parking or Parking(0))
        log.debug(
            "connection ended", extra={"event": "connection_ended", "peer": str(conn.peer_id)}
        )
    except* TransportError as group:  # the client went away, or the server is stopping
        log.info(
            "connection ended: %s",
            group.exceptions[0],
            extra={"event": "connection_lost", "peer": str(conn.peer_id)},
        )


def run(opts: ServeOptions, device: str) -> int:
    """Serve until SIGINT/SIGTERM; print the peer id and addresses once listening. An
    address that cannot be bound (busy, not local) is one line on stderr and status 1."""
    listening = False

    port_http = None
    if opts.http is not None:
        from ._http import OperatorPort, warn_if_open

        warn_if_open(opts.http, opts.http_token, "burn-remote serve")
        try:
            port_http = OperatorPort(opts.state, opts.http, token=opts.http_token)
        except OSError as exc:
            where = format_host_port(*opts.http)
            print(f"burn-remote serve: cannot serve --http on {where}: {exc}", file=sys.stderr)
            return 1

    def ready(ep: Endpoint) -> None:
        nonlocal listening
        listening = True
        host, port = ep.local_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        print(f"burn-remote serve: device {device}", flush=True)
        print(f"peer id: {ep.peer_id}", flush=True)
        print(f"listening on: {host}:{port}", flush=True)
        print(f"auth: {_auth_mode(opts)}", flush=True)
        print(f"quic engine: {opts.quic_engine}", flush=True)
        groups = opts.state.collectives
        if groups is not None and groups.listener is not None:
            rh, rp = groups.listener.address
            print(f"ring data: tcp {format_host_port(rh, rp)}", flush=True)
        else:
            print("ring data: quic (--ring-port off)", flush=True)
        jobs = "jobs on" if opts.state.jobs is not None else "jobs off"
        print(f"data dir: {opts.data_dir or '(none)'} ({jobs})", flush=True)
        if port_http is not None:
            h, p = port_http.address
            print(f"http: http://{format_host_port(h, p)} (/healthz, /metrics)", flush=True)
        print(f"connect with: RemoteDevice('{ep.peer_id}@{shown}:{port}')", flush=True)
        log.info(
            "serving on %s:%d",
            host,
            port,
            extra={"event": "server_started", "peer": str(ep.peer_id)},
        )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, opts, ready)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    print(
                        f"burn-remote serve: {signal.Signals(signum).name}, shutting down",
                        flush=True,
                    )
                    nursery.cancel_scope.cancel()
                    break

    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        trio.run(main)
    except BaseException as exc:
        bind_error = None if listening else _first_os_error(exc)
        if bind_error is None:
            raise
        host, port = opts.bind
        why = bind_error.strerror or str(bind_error)
        hint = " (another server there? give this one --listen HOST:PORT)" if port else ""
        print(f"burn-remote serve: cannot listen on {host}:{port}: {why}{hint}", file=sys.stderr)
        return 1
    finally:
        if port_http is not None:
            port_http.close()
    log.info("stopped", extra={"event": "server_stopped"})
    sys.stdout.flush()
    return 0


def _first_os_error(exc: BaseException) -> OSError | None:
    """The OSError inside ``exc`` (trio wraps a failed start in exception groups)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    return None


def _auth_mode(opts: ServeOptions) -> str:
    """The banner's one line on who is admitted."""
    peers = opts.authorized_peers
    if opts.allow_any or getattr(peers, "allow_any", False):
        return "open: any authenticated peer is admitted (--allow-any)"
    if isinstance(peers, AuthorizedPeers):
        peers = peers._path
    if isinstance(peers, str | os.PathLike):
        return f"authorized peers from {peers}"
    return "authorized peers given in-process"


__all__ = ["ServeOptions", "run", "serve"]
