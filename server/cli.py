"""The ``burn-remote`` command: a thin dispatcher, one function per subcommand.

To add a subcommand, write ``_add_<name>(subparsers)`` that registers its arguments and sets
``func`` to a ``cmd_<name>(args) -> int`` function, then list it in ``_REGISTRARS``. Heavy
imports (trio, aioquic, cryptography, engines) stay inside the ``cmd_*`` functions so that
``burn-remote --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

DEFAULT_SERVE_PORT = 7000
"""UDP port `serve` listens on without --listen: fixed, so that the address in a client's
address book still holds after a restart (port 0 would pick a new one each time)."""
DEFAULT_SERVE_LISTEN = f"127.0.0.1:{DEFAULT_SERVE_PORT}"
"""Loopback by default: reaching a server from another machine is a choice made with
``--listen 0.0.0.0:7000`` (and a firewall rule), not an accident."""
DEFAULT_RELAY_LISTEN = "127.0.0.1:7400"

SERVER_QUIC_ENGINES = ("aioquic", "qh3")
"""``serve --quic-engine`` choices: ``protocol.transport._config.QUIC_ENGINES``, written
out here so that ``--help`` imports no QUIC library (a test keeps them equal)."""


def node_key_path(key: str | None, data_dir: str | None) -> Path:
    """The key file a node uses: ``--key``, else ``DATA_DIR/key`` with ``--data-dir``, else
    the node key (``$BURN_REMOTE_KEY``, ``$BURN_REMOTE_HOME/key``...). One rule for ``serve``
    and ``id``, so that ``id`` with serve's flags prints the id ``serve`` will present."""
    from burn_remote.protocol.transport import default_key_path

    if key:
        return Path(key)
    if data_dir:
        return Path(data_dir) / "key"
    return Path(default_key_path())


def cmd_id(args: argparse.Namespace) -> int:
    """Create the key on first use, then print this node's peer id (stdout, alone, so that
    ``burn-remote id > authorized_peers`` works) and the key file it lives in (stderr)."""
    from burn_remote.protocol.transport import Identity, KeyFileError

    path = node_key_path(args.key, args.data_dir)
    try:
        ident = Identity.load_or_create(path)
    except KeyFileError as exc:
        print(f"burn-remote id: {exc}", file=sys.stderr)
        return 1
    print(ident.peer_id)
    print(f"key file: {path}", file=sys.stderr)
    return 0


def _add_id(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "id",
        help="create/show this node's key and print its peer id",
        description=(
            "Print this node's peer id (its Ed25519 public key in lowercase unpadded base32, "
            "52 characters) on stdout and its key file on stderr. The key file is created with "
            "mode 0600 on first use; a key file readable by group or others is refused. The "
            "key is chosen as `serve` chooses it: --key, else DATA_DIR/key with --data-dir, "
            "else $BURN_REMOTE_KEY, else $BURN_REMOTE_HOME/key, else "
            "$XDG_CONFIG_HOME/burn-remote/key, else ~/.config/burn-remote/key. So a server's "
            "id is `burn-remote id --data-dir DIR` with the DIR it serves from."
        ),
    )
    p.add_argument("--key", metavar="FILE", help="key file to use instead of the default")
    p.add_argument(
        "--data-dir", metavar="DIR", help="a server's data directory: its key is DIR/key"
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="(kept for scripts: the key path is always printed on stderr)",
    )
    p.set_defaults(func=cmd_id)


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
        bind = _host_port("--listen", args.listen, parse_host_port)
        http = _http_bind(args.http)
        http_token = _http_token(args.http_token_file) if http else None
        if args.data_dir:  # before anything is written there: keys, job store, artifacts
            make_private(args.data_dir)
        if not args.allow_any:
            args.authorized_peers = _authorized_peers_file(args.authorized_peers)
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
            _host_port("--ring-advertise", args.ring_advertise, parse_host_port)
        except ValueError as exc:
            return fail(exc)
    try:
        return run(opts, args.device)
    except OSError as exc:  # the --http port is taken
        return fail(exc)
    finally:
        if state.jobs is not None:
            state.jobs.close()


def _ring_port(text: str) -> int | None:
    if text.strip().lower() == "off":
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or off, got {text!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def _host_port(flag: str, text: str, parse: Callable[..., tuple[str, int]]) -> tuple[str, int]:
    """A listening address (``:PORT`` means 127.0.0.1; port 0 picks a free one)."""
    try:
        return parse(text, listen=True)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _http_bind(text: str | None) -> tuple[str, int] | None:
    """``--http``: a bare PORT (or ``:PORT``) is 127.0.0.1, so the operator port is local
    unless a host is named."""
    if not text:
        return None
    from burn_remote.protocol.addressing import parse_host_port

    text = text.strip()
    return _host_port("--http", f":{text}" if text.isdigit() else text, parse_host_port)


def _http_token(path: str | None) -> str | None:
    from burn_remote.server._http import read_token

    return read_token(path)


def _authorized_peers_file(given: str | None) -> str:
    """The authorised-peers file: it must exist (a server that admits no one is a mistake;
    ``--allow-any`` is the explicit open mode)."""
    from burn_remote.protocol.transport import default_authorized_peers_path

    path = Path(given) if given else default_authorized_peers_path()
    if not path.exists():  # anything else wrong with it is the policy's to say
        how = "--authorized-peers" if given else "the default authorized_peers file"
        raise ValueError(
            f"{how} {path} does not exist: create it (one peer id a line, see `burn-remote id`) "
            "or pass --allow-any to admit any authenticated peer"
        )
    return str(path)


def _size(text: str) -> int:
    """argparse type for byte sizes: ``1G``, ``512MiB``, ``1.5GB`` or plain bytes."""
    from burn_remote.engine.memory import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(text: str) -> str:
    """argparse type for ``--device``: a local device kind, checked by the one parser that
    `Device.resolve` and the engine's backend table use, so a typo is refused with the
    spellings before anything starts."""
    from burn_remote.engine.backend_base import parse_device

    try:
        parse_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from burn_remote.protocol.messages import MAX_FRAME

    p = sub.add_parser(
        "serve",
        help="run the compute daemon",
        description="Serve remote sessions on one device. Prints the peer id and addresses.",
    )
    p.add_argument(
        "--device", default="cpu", type=_device, help="cpu, cuda[:N] or opencl[:N] (default cpu)"
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
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
        type=_size,
        default=32 * gib,
        metavar="SIZE",
        help="bytes all sessions and jobs together may hold (1G, 512MiB, 1.5GB or bytes; "
        "default 32GiB)",
    )
    p.add_argument(
        "--session-memory",
        type=_size,
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
        type=_size,
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
        type=_size,
        default=16 * gib,
        metavar="SIZE",
        help="bytes of artifacts and uploads one peer may keep in the data dir (16GiB)",
    )
    p.add_argument(
        "--disk-limit",
        type=_size,
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
        type=_size,
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
        type=_ring_port,
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


def _add_jobs(sub: argparse._SubParsersAction) -> None:
    from burn_remote.server.jobs._cli import add_jobs

    add_jobs(sub, TARGET_HELP)


def cmd_relay(args: argparse.Namespace) -> int:
    """Run the discovery and relay node until SIGINT/SIGTERM."""
    from burn_remote.protocol.addressing import parse_host_port
    from burn_remote.protocol.transport import Identity, KeyFileError
    from burn_remote.server._logging import configure
    from burn_remote.server._relay import run_relay
    from burn_remote.server._relay_limits import MIB, RelayLimits

    configure("info", "text")
    key = node_key_path(args.key, args.data_dir)
    try:
        identity = Identity.load_or_create(key)
        bind = _host_port("--listen", args.listen, parse_host_port)
        http = _http_bind(args.http)
        http_token = _http_token(args.http_token_file) if http else None
    except (KeyFileError, ValueError) as exc:
        print(f"burn-remote relay: {exc}", file=sys.stderr)
        return 1
    limits = RelayLimits(
        args.peer_bandwidth * MIB,
        args.peer_datagrams,
        args.control_rate,
        args.host_bandwidth * MIB,
        args.host_datagrams,
    )
    return run_relay(
        identity, bind, capture=args.capture, http=http, http_token=http_token, limits=limits
    )


def _positive_int(text: str) -> int:
    """A count from the command line: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def _rate(text: str) -> float:
    """A per-second limit from the command line: a number >= 0 (0 turns the limit off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: no limit): {text}")
    return value


def _add_relay(sub: argparse._SubParsersAction) -> None:
    from burn_remote.server._relay_limits import MAX_PEERS_PER_HOST, MAX_PEERS_PER_NET

    p = sub.add_parser(
        "relay",
        help="run a discovery and relay node",
        description=(
            "Hold signed address records (refusing unsigned, stale and replayed ones) and "
            "forward end-to-end encrypted QUIC datagrams between peers that cannot reach "
            "each other directly. Peers prove their key by signing a challenge; only a "
            "registered peer publishes, its own record. Keys cost nothing, so one IP address "
            f"holds at most {MAX_PEERS_PER_HOST} registrations and as many records (a /24 or "
            f"/64: {MAX_PEERS_PER_NET}), and its peers share --host-bandwidth."
        ),
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_RELAY_LISTEN,
        metavar="HOST:PORT",
        help=f"UDP address to relay on (default {DEFAULT_RELAY_LISTEN})",
    )
    p.add_argument("--key", metavar="FILE", help="key file (default: DATA_DIR/key or the node key)")
    p.add_argument("--data-dir", metavar="DIR", help="relay state directory (holds the key)")
    p.add_argument("--capture", metavar="FILE", help="append every forwarded datagram (tests)")
    p.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve /healthz and Prometheus /metrics over HTTP here (off by default; a bare "
        "PORT binds 127.0.0.1; bounded as serve's)",
    )
    p.add_argument(
        "--http-token-file",
        metavar="FILE",
        help="as serve's: /metrics wants `Authorization: Bearer TOKEN` (default: "
        "$BURN_REMOTE_HTTP_TOKEN, else no token)",
    )
    from burn_remote.server._relay_limits import (
        CONTROL_RATE,
        HOST_BANDWIDTH,
        HOST_DATAGRAM_RATE,
        MIB,
        PEER_BANDWIDTH,
        PEER_DATAGRAM_RATE,
    )

    p.add_argument(
        "--peer-bandwidth",
        type=_rate,
        default=PEER_BANDWIDTH / MIB,
        metavar="MIB_S",
        help="MiB/s one peer may send through the relay; the rest is dropped and QUIC "
        "slows down (default %(default)g; 0: no limit)",
    )
    p.add_argument(
        "--peer-datagrams",
        type=_rate,
        default=PEER_DATAGRAM_RATE,
        metavar="N",
        help="datagrams/s one peer may send through the relay (default %(default)g; 0: none)",
    )
    p.add_argument(
        "--host-bandwidth",
        type=_rate,
        default=HOST_BANDWIDTH / MIB,
        metavar="MIB_S",
        help="MiB/s all peers registered from one IP address may send through the relay "
        "together (ids cost nothing to make; default %(default)g; 0: no limit)",
    )
    p.add_argument(
        "--host-datagrams",
        type=_rate,
        default=HOST_DATAGRAM_RATE,
        metavar="N",
        help="datagrams/s all peers from one IP address may send through the relay "
        "(default %(default)g; 0: none)",
    )
    p.add_argument(
        "--control-rate",
        type=_rate,
        default=CONTROL_RATE,
        metavar="N",
        help="control requests/s (hello, auth, publish, lookup, ping) one source address "
        "may send, bursts of 40 (default %(default)g; 0: no limit)",
    )
    p.set_defaults(func=cmd_relay)


def cmd_status(args: argparse.Namespace) -> int:
    """Print a server's status (admins, or the server's own key)."""
    import json

    from burn_remote import RemoteDevice, RemoteError
    from burn_remote._recorder import OpFailed

    try:
        dev = RemoteDevice(args.peer, key=args.key)
        info = dev.server_status()
        dev.close()
    except (OpFailed, RemoteError, OSError, ValueError) as exc:
        print(f"burn-remote status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(format_status(info))
    return 0


def format_status(info: dict) -> str:
    """The human form of a ServerStatus answer."""
    from burn_remote.engine.memory import fmt_bytes

    mem, cache, traffic = info["memory"], info["plan_cache"], info["traffic"]
    lines = [
        f"server {info['peer_id']} on {info['device']}, up {info['uptime_s']:.0f} s",
        f"memory: {fmt_bytes(mem['in_use'])} in use (peak {fmt_bytes(mem['peak'])}) of "
        f"{fmt_bytes(mem['limit'])}, {mem['tensors']} tensors",
    ]
    lines += [
        f"  pool {p['pool']}: {fmt_bytes(p['reserved'])} reserved, {fmt_bytes(p['in_use'])} in use"
        for p in mem["pools"]
    ]
    lines.append(
        f"plan cache: {cache['plans']}/{cache['capacity']} plans, {cache['compiled']} compiled, "
        f"{cache['replays']} replays"
    )
    lines.append(
        f"traffic: {traffic['messages']} messages, {traffic['steps']} steps, "
        f"{fmt_bytes(traffic['bytes_received'])} in, {fmt_bytes(traffic['bytes_sent'])} out"
    )
    lines.append(f"sessions: {len(info['sessions'])}")
    for s in info["sessions"]:
        lines.append(
            f"  {s['id']:>4}  {s['peer'][:12]}...  {s['tensors']} tensors  "
            f"{fmt_bytes(s['bytes'])}  {s['messages']} messages  idle {s['idle_s']:.0f} s"
        )
    jobs = info["jobs"]
    if jobs is None:
        lines.append("jobs: off (no --data-dir)")
    else:
        counts = ", ".join(f"{n} {state}" for state, n in jobs["by_state"].items() if n)
        lines.append(f"jobs: {counts or 'none'}")
        if jobs["storage_error"]:
            lines.append(f"  job runner waiting for storage: {jobs['storage_error']}")
    if info["errors"]:
        errs = ", ".join(f"{k} {n}" for k, n in sorted(info["errors"].items()))
        lines.append(f"errors: {errs}")
    return "\n".join(lines)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show a server's sessions, memory, plan cache and jobs (admins)",
        description=(
            "Ask a running server for its status. Only admins (role=admin in the server's "
            "authorized_peers file) and the server's own key may: run it on the server with "
            "--key DATA_DIR/key, or from an admin's machine."
        ),
    )
    p.add_argument("peer", metavar="PEER", help=TARGET_HELP)
    p.add_argument("--key", metavar="FILE", help="this client's key file")
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")
    p.set_defaults(func=cmd_status)


TARGET_HELP = (
    "the server: PEER@HOST:PORT, or a peer id or name from the address book "
    "($BURN_REMOTE_ADDRESS_BOOK, default ~/.config/burn-remote/addresses.toml)"
)

ENVIRONMENT = """\
environment variables:
  BURN_REMOTE_HOME              config directory (default ~/.config/burn-remote): key,
                                authorized_peers, addresses.toml
  BURN_REMOTE_KEY               this node's key file (default $BURN_REMOTE_HOME/key)
  BURN_REMOTE_AUTHORIZED_PEERS  serve: admitted peers file (default $BURN_REMOTE_HOME/...)
  BURN_REMOTE_ADDRESS_BOOK      address book (default $BURN_REMOTE_HOME/addresses.toml)
  BURN_REMOTE_RELAY             client: relay HOST:PORT to find peers not in the book
  BURN_REMOTE_IDLE_TIMEOUT      client: seconds of silence before a connection is lost (30)
  BURN_REMOTE_RESUME_TIMEOUT    client: seconds spent reconnecting to resume a session (30)
  BURN_REMOTE_WAIT_TIMEOUT      client: seconds a read waits for its reply (300)
  BURN_REMOTE_POOL              local CPU devices: 1 pools every tensor, 0 never
  BURN_REMOTE_FUSION            CUDA/OpenCL: 0 turns kernel fusion off
  BURN_REMOTE_PROBE_TIMEOUT     seconds a direct address gets before the relay is used (3)
See README.md, "Configuration", for the full list with every flag."""


def _add_generate(sub: argparse._SubParsersAction) -> None:
    from burn_remote._generate_cli import add_parser

    add_parser(sub, TARGET_HELP)


_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_id,
    _add_serve,
    _add_relay,
    _add_jobs,
    _add_status,
    _add_generate,
]


def build_parser() -> argparse.ArgumentParser:
    """The full parser; separate from :func:`main` so tests can inspect it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("burn-remote")
    except PackageNotFoundError:  # running from a source tree without an install
        ours = "unknown (not installed)"
    parser = argparse.ArgumentParser(
        prog="burn-remote",
        description="burn-remote node: identity, server, relay, jobs, status and generate.",
        epilog=ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"burn-remote {ours}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
