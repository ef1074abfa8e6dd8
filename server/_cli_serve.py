"""``burn-remote serve``: its flags (``add_serve``) and the start-up that turns them into a
running daemon (``cmd_serve``: key, addresses, policy, limits, job store, then the loop)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from ._cli_args import (
    DEFAULT_SERVE_LISTEN,
    SERVER_QUIC_ENGINES,
    authorized_peers_file,
    byte_size,
    device_kind,
    host_port,
    http_bind,
    node_key_path,
    port_or_off,
    positive_int,
    read_http_token,
)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon: sessions over QUIC on one engine device until SIGINT/SIGTERM. Every
    start-up failure (key, address, authorised-peers file, data dir, busy port) is one line
    on stderr and exit status 1."""
    from burn_remote.protocol.addressing import parse_host_port
    from burn_remote.protocol.extensions import format_extensions, load_entry_point_extensions
    from burn_remote.protocol.transport import (
        AuthorizedPeers,
        Identity,
        KeyFileError,
        TransportError,
    )
    from burn_remote.server._daemon import ServeOptions, run
    from burn_remote.server._files import DataDirError, make_private
    from burn_remote.server._logging import configure
    from burn_remote.server._peers import PeerDirectory
    from burn_remote.server._state import Limits, ServerState
    from burn_remote.server.jobs import StoreError

    def fail(exc: object) -> int:
        print(f"burn-remote serve: {exc}", file=sys.stderr)
        return 1

    configure(args.log_level, args.log_format)
    if args.threads is not None:  # before the engine's backend exists: it reads it once
        from burn_remote.engine.backends.cpu_threads import THREADS_ENV

        os.environ[THREADS_ENV] = str(args.threads)
    key = node_key_path(args.key, args.data_dir)
    if args.quic_engine not in SERVER_QUIC_ENGINES:  # from $BURN_REMOTE_QUIC_ENGINE
        return fail(
            f"QUIC engine {args.quic_engine!r} (from $BURN_REMOTE_QUIC_ENGINE): expected one "
            f"of {', '.join(SERVER_QUIC_ENGINES)}"
        )
    if args.quic_engine == "qh3" and importlib.util.find_spec("qh3") is None:
        return fail("--quic-engine qh3 needs the qh3 package (pip install 'burn-remote[qh3]')")
    try:
        bind = host_port("--listen", args.listen, parse_host_port)
        http = http_bind(args.http)
        http_token = read_http_token(args.http_token_file) if http else None
        if args.data_dir:  # before anything is written there: keys, job store, artifacts
            make_private(args.data_dir)
        if not args.allow_any:
            args.authorized_peers = authorized_peers_file(args.authorized_peers)
        policy = AuthorizedPeers(args.authorized_peers, allow_any=args.allow_any)
    except (ValueError, DataDirError, TransportError) as exc:
        return fail(exc)
    broken: list = []
    extensions = load_entry_point_extensions(errors=broken)  # a broken one is skipped, loudly
    for err in broken:
        print(f"burn-remote serve: extension not loaded: {err}", file=sys.stderr)
    print(f"extensions: {format_extensions(extensions)}", flush=True)
    try:
        identity = Identity.load_or_create(key)
        print(f"key file: {key}", flush=True)
        limits = Limits(
            memory_limit=args.memory_limit,
            session_memory=args.session_memory or args.memory_limit,
            max_sessions=args.max_sessions,
            max_tensors=args.max_tensors,
            max_graphs=args.max_graphs,
            max_frame=args.max_frame,
            plan_cache=args.plan_cache,
            max_peer_sessions=args.max_peer_sessions,
            peer_memory=args.peer_memory,
            max_peer_jobs=args.max_peer_jobs,
            peer_disk=args.peer_disk,
            disk_limit=args.disk_limit,
        )
        state = ServerState(args.device, limits, str(identity.peer_id))
        state.peers = PeerDirectory.for_server(
            args.peer, args.address_book, args.data_dir, args.relay
        )
        if args.data_dir:  # the job store lives in the data directory (server/jobs)
            from burn_remote.server.jobs import JobService

            state.jobs = JobService(args.data_dir, state, args.job_path, key_path=key)
    except (KeyFileError, ValueError, RuntimeError, OSError, StoreError, TransportError) as exc:
        return fail(exc)
    opts = ServeOptions(
        state=state,
        identity=identity,
        bind=bind,
        authorized_peers=policy,
        allow_any=args.allow_any,
        idle_timeout=args.idle_timeout,
        relay=args.relay,
        advertise=args.advertise,
        resume_grace=args.resume_grace,
        http=http,
        http_token=http_token,
        data_dir=args.data_dir,
        ring_port=args.ring_port,
        ring_advertise=args.ring_advertise,
        ring_seal_loopback=args.ring_seal_loopback,
        ring_loopback_tcp=args.ring_loopback_tcp,
        quic_engine=args.quic_engine,
    )
    if args.ring_advertise:
        try:
            host_port("--ring-advertise", args.ring_advertise, parse_host_port)
        except ValueError as exc:
            return fail(exc)
    try:
        return run(opts, args.device)
    except OSError as exc:  # the --http port is taken
        return fail(exc)
    finally:
        if state.jobs is not None:
            state.jobs.close()


def add_serve(sub: argparse._SubParsersAction) -> None:
    from burn_remote.protocol.messages import MAX_FRAME

    p = sub.add_parser(
        "serve",
        help="run the compute daemon",
        description="Serve remote sessions on one device. Prints the peer id and addresses.",
    )
    p.add_argument(
        "--device",
        default="cpu",
        type=device_kind,
        help="cpu, cuda[:N] or opencl[:N] (default cpu)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="threads of the CPU engine: BLAS and its fused kernels share them (sets "
        "$BURN_REMOTE_THREADS; default that variable, else every core this process may use)",
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_SERVE_LISTEN,
        metavar="HOST:PORT",
        help=f"UDP address to serve QUIC on (default {DEFAULT_SERVE_LISTEN}: this machine "
        "only, on a port that stays the same across restarts; 0.0.0.0:PORT for other "
        "machines, [v6]:port for IPv6, port 0 picks a free one)",
    )
    p.add_argument(
        "--quic-engine",
        choices=SERVER_QUIC_ENGINES,
        default=os.environ.get("BURN_REMOTE_QUIC_ENGINE") or "aioquic",
        help="QUIC implementation of the connections served: aioquic (pure Python, the "
        "default) or qh3 (compiled core, less CPU per round trip; the qh3 extra); default "
        "$BURN_REMOTE_QUIC_ENGINE, else aioquic. Clients may use either",
    )
    p.add_argument("--key", metavar="FILE", help="key file (default: DATA_DIR/key or the node key)")
    p.add_argument(
        "--authorized-peers",
        metavar="FILE",
        help="peer ids admitted, one a line (`role=admin` after an id makes it an admin); "
        "default $BURN_REMOTE_AUTHORIZED_PEERS or ~/.config/burn-remote/authorized_peers; "
        "it must exist",
    )
    p.add_argument("--allow-any", action="store_true", help="admit any authenticated peer")
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="server state directory: the key, and the job store (jobs are off without it)",
    )
    gib = 2**30
    p.add_argument(
        "--memory-limit",
        type=byte_size,
        default=32 * gib,
        metavar="SIZE",
        help="bytes all sessions and jobs together may hold (1G, 512MiB, 1.5GB or bytes; "
        "default 32GiB)",
    )
    p.add_argument(
        "--session-memory",
        type=byte_size,
        default=0,
        metavar="SIZE",
        help="bytes one session (or one job) may hold (default: the memory limit)",
    )
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions (64)")
    p.add_argument(
        "--max-peer-sessions", type=int, default=16, help="concurrent sessions of one peer (16)"
    )
    p.add_argument(
        "--peer-memory",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="bytes all sessions of one peer may hold (default: 3/4 of --memory-limit when "
        "several peers may connect, all of it when one is authorised; 0: no cap of its own)",
    )
    p.add_argument(
        "--max-peer-jobs", type=int, default=16, help="jobs one peer may have queued or running"
    )
    p.add_argument(
        "--peer-disk",
        type=byte_size,
        default=16 * gib,
        metavar="SIZE",
        help="bytes of artifacts and uploads one peer may keep in the data dir (16GiB)",
    )
    p.add_argument(
        "--disk-limit",
        type=byte_size,
        default=0,
        metavar="SIZE",
        help="bytes the whole data dir may hold before uploads and new jobs are refused "
        "(default 0: no limit but the disk's; 5%% of it, at most 1GiB, is always kept free "
        "for jobs already accepted)",
    )
    p.add_argument(
        "--max-tensors", type=int, default=100_000, help="tensors one session may hold (100000)"
    )
    p.add_argument(
        "--max-graphs", type=int, default=4096, help="graphs one session may register (4096)"
    )
    p.add_argument(
        "--max-frame",
        type=byte_size,
        default=MAX_FRAME,
        metavar="SIZE",
        help="largest frame accepted on any stream (default 64MiB)",
    )
    p.add_argument("--plan-cache", type=int, default=256, help="compiled graphs kept (LRU, 256)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="drop a connection silent this long (keep-alives every third of it; default 30)",
    )
    p.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve /healthz and Prometheus /metrics over HTTP here (off by default; a bare "
        "PORT binds 127.0.0.1, port 0 picks one, printed as `http:`). Bounded: 32 connections, "
        "8 per address, 10 s each. Another host (0.0.0.0) is reachable beyond this machine: "
        "give it a token",
    )
    p.add_argument(
        "--http-token-file",
        metavar="FILE",
        help="the --http port wants `Authorization: Bearer TOKEN` (TOKEN: the file's first "
        "line) on every path but /healthz; default: $BURN_REMOTE_HTTP_TOKEN, else no token",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="least severe log events shown on stderr (default info)",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text or one JSON object each (default text); UTC timestamps",
    )
    p.add_argument(
        "--job-path",
        action="append",
        default=[],
        metavar="DIR",
        help="directory whose files job specs may name as server:<path> (repeatable)",
    )
    p.add_argument(
        "--relay",
        metavar="HOST:PORT",
        help="publish a signed address record here and accept "
        "clients relayed through it (see `burn-remote relay`)",
    )
    p.add_argument(
        "--advertise",
        action="append",
        metavar="HOST:PORT",
        help="address published in the record, exactly (repeatable; default: the --listen "
        "address unless it is a wildcard, plus the address the relay sees our QUIC socket at: "
        "behind a NAT, its public mapping)",
    )
    p.add_argument(
        "--ring-port",
        type=port_or_off,
        default=0,
        metavar="PORT|off",
        help="TCP port of the ring all-reduce's data plane, on the --listen host (default 0: "
        "a free one, told to ring neighbours over their authenticated QUIC link; off: ring "
        "data goes over the QUIC links, slower; open it in firewalls as you open --listen)",
    )
    p.add_argument(
        "--ring-seal-loopback",
        action="store_true",
        help="encrypt ring data between servers on this same host too (by default such "
        "links are authenticated with their one-time key but carry plain bytes: they never "
        "leave the host's kernel; links to other hosts are always AES-256-GCM)",
    )
    p.add_argument(
        "--ring-loopback-tcp",
        action="store_true",
        help="move ring data to and from servers on this same host over loopback TCP (by "
        "default such links go through a shared-memory buffer the two servers map, when "
        "both can: less CPU per byte; TCP then carries only byte counts)",
    )
    p.add_argument(
        "--ring-advertise",
        default="",
        metavar="HOST:PORT",
        help="address ring neighbours dial for the data plane instead of the --listen host "
        "and --ring-port (a port mapping or proxy in front of this server)",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="PEER@HOST:PORT",
        help="another server this one may dial for a server-to-server move (repeatable); "
        "clients name only peer ids, never addresses",
    )
    p.add_argument(
        "--address-book",
        metavar="FILE",
        help="more servers this one may dial, in the address-book format ([[peer]] id, "
        "addresses), re-read when it changes (default DATA_DIR/addresses.toml, else the "
        "node's own address book); peers not found there are looked up on --relay",
    )
    p.add_argument(
        "--resume-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a session outlives a dead connection, waiting for its client to resume",
    )
    p.set_defaults(func=cmd_serve)


__all__ = ["add_serve", "cmd_serve"]
