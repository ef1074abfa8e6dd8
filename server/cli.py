"""The ``burn-remote`` command: a thin dispatcher, one function per subcommand.

To add a subcommand, write ``_add_<name>(subparsers)`` that registers its arguments and sets
``func`` to a ``cmd_<name>(args) -> int`` function, then list it in ``_REGISTRARS``. Heavy
imports (trio, aioquic, cryptography, engines) stay inside the ``cmd_*`` functions so that
``burn-remote --help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def cmd_id(args: argparse.Namespace) -> int:
    """Create the key on first use, then print this node's peer id."""
    from burn_remote.protocol.transport import Identity, KeyFileError, default_key_path

    path = args.key or default_key_path()
    try:
        ident = Identity.load_or_create(path)
    except KeyFileError as exc:
        print(f"burn-remote id: {exc}", file=sys.stderr)
        return 1
    print(ident.peer_id)
    if args.verbose:
        print(f"key file: {path}", file=sys.stderr)
    return 0


def _add_id(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "id",
        help="create/show this node's key and print its peer id",
        description=(
            "Print this node's peer id (its Ed25519 public key in lowercase unpadded base32, "
            "52 characters). The key file is created with mode 0600 on first use; a key file "
            "readable by group or others is refused. Default key file: $BURN_REMOTE_KEY, else "
            "$BURN_REMOTE_HOME/key, else $XDG_CONFIG_HOME/burn-remote/key, else "
            "~/.config/burn-remote/key."
        ),
    )
    p.add_argument("--key", metavar="FILE", help="key file to use instead of the default")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the key path")
    p.set_defaults(func=cmd_id)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` (port 0: any free one) -> (host, port).

    Raises:
        ValueError: one line naming what is wrong (no port, a bad port, bare IPv6).
    """
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        raise ValueError(f"--listen {text!r}: no port; use HOST:PORT (port 0 picks a free one)")
    if host.count(":") and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"--listen {text!r}: write an IPv6 address in brackets, [::1]:PORT")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: the port must be a number from 0 to 65535")
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon: sessions over QUIC on one engine device until SIGINT/SIGTERM. Every
    start-up failure (key, address, authorised-peers file, data dir, busy port) is one line
    on stderr and exit status 1."""
    from pathlib import Path

    from burn_remote.protocol.extensions import format_extensions, load_entry_point_extensions
    from burn_remote.protocol.transport import (
        AuthorizedPeers,
        Identity,
        KeyFileError,
        TransportError,
        default_key_path,
    )
    from burn_remote.server._daemon import ServeOptions, run
    from burn_remote.server._files import DataDirError, make_private
    from burn_remote.server._state import Limits, ServerState
    from burn_remote.server.jobs import StoreError

    def fail(exc: object) -> int:
        print(f"burn-remote serve: {exc}", file=sys.stderr)
        return 1

    key = args.key or (Path(args.data_dir) / "key" if args.data_dir else default_key_path())
    try:
        bind = parse_listen(args.listen)
        if args.data_dir:  # before anything is written there: keys, job store, artifacts
            make_private(args.data_dir)
        if not args.allow_any and args.authorized_peers is None:
            from burn_remote.protocol.transport import default_authorized_peers_path

            args.authorized_peers = default_authorized_peers_path()
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
        limits = Limits(
            memory_limit=args.memory_limit,
            session_memory=args.session_memory or args.memory_limit,
            max_sessions=args.max_sessions,
            max_tensors=args.max_tensors,
            max_graphs=args.max_graphs,
            max_frame=args.max_frame,
            plan_cache=args.plan_cache,
        )
        state = ServerState(args.device, limits, str(identity.peer_id))
        if args.data_dir:  # the job store lives in the data directory (server/jobs)
            from burn_remote.server.jobs import JobService

            state.jobs = JobService(args.data_dir, state, args.job_path)
    except (KeyFileError, ValueError, RuntimeError, OSError, StoreError) as exc:
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
    )
    try:
        return run(opts, args.device)
    finally:
        if getattr(state, "jobs", None) is not None:
            state.jobs.close()


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from burn_remote.protocol.messages import MAX_FRAME

    p = sub.add_parser(
        "serve",
        help="run the compute daemon",
        description="Serve remote sessions on one device. Prints the peer id and addresses.",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda:N or opencl (default cpu)")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument("--key", metavar="FILE", help="key file (default: DATA_DIR/key or the node key)")
    p.add_argument("--authorized-peers", metavar="FILE", help="peer ids admitted (one a line)")
    p.add_argument("--allow-any", action="store_true", help="admit any authenticated peer")
    p.add_argument("--data-dir", metavar="DIR", help="server state directory (holds the key)")
    gib = 2**30
    p.add_argument("--memory-limit", type=int, default=32 * gib, metavar="BYTES")
    p.add_argument("--session-memory", type=int, default=0, metavar="BYTES")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--max-tensors", type=int, default=100_000)
    p.add_argument("--max-graphs", type=int, default=4096)
    p.add_argument("--max-frame", type=int, default=MAX_FRAME, metavar="BYTES")
    p.add_argument("--plan-cache", type=int, default=256, help="compiled graphs kept (LRU)")
    p.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS")
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
        help="address published in the record (repeatable; default: the --listen address)",
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

    add_jobs(sub)


def cmd_relay(args: argparse.Namespace) -> int:
    """Run the discovery and relay node until SIGINT/SIGTERM."""
    from pathlib import Path

    from burn_remote.protocol.relay._wire import parse_hostport
    from burn_remote.protocol.transport import Identity, KeyFileError, default_key_path
    from burn_remote.server._relay import run_relay

    key = args.key or (Path(args.data_dir) / "key" if args.data_dir else default_key_path())
    try:
        identity = Identity.load_or_create(key)
        bind = parse_hostport(args.listen)
    except (KeyFileError, ValueError) as exc:
        print(f"burn-remote relay: {exc}", file=sys.stderr)
        return 1
    return run_relay(identity, bind, capture=args.capture)


def _add_relay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "relay",
        help="run a discovery and relay node",
        description=(
            "Hold signed address records (refusing unsigned, stale and replayed ones) and "
            "forward end-to-end encrypted QUIC datagrams between peers that cannot reach "
            "each other directly. Peers prove their key by signing a challenge."
        ),
    )
    p.add_argument("--listen", default="127.0.0.1:7400", metavar="HOST:PORT")
    p.add_argument("--key", metavar="FILE", help="key file (default: DATA_DIR/key or the node key)")
    p.add_argument("--data-dir", metavar="DIR", help="relay state directory (holds the key)")
    p.add_argument("--capture", metavar="FILE", help="append every forwarded datagram (tests)")
    p.set_defaults(func=cmd_relay)


_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_id,
    _add_serve,
    _add_relay,
    _add_jobs,
]


def build_parser() -> argparse.ArgumentParser:
    """The full parser; separate from :func:`main` so tests can inspect it."""
    parser = argparse.ArgumentParser(
        prog="burn-remote", description="burn-remote node: identity, server, relay and jobs."
    )
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
