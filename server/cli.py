"""The ``burn-remote`` command: a thin dispatcher, one function per subcommand.

To add a subcommand, write ``_add_<name>(subparsers)`` that registers its arguments and sets
``func`` to a ``cmd_<name>(args) -> int`` function, then list it in ``_REGISTRARS``. Heavy
imports (trio, aioquic, cryptography, engines) stay inside the ``cmd_*`` functions so that
``burn-remote --help`` is instant. The two daemons have modules of their own (``_cli_serve``,
``_cli_relay``), as have ``jobs`` (``jobs/_cli``) and ``generate``; the defaults and argparse
types they share are in ``_cli_args``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ._cli_args import (  # noqa: F401  (this module's names too: tests import them from here)
    DEFAULT_SERVE_LISTEN,
    DEFAULT_SERVE_PORT,
    SERVER_QUIC_ENGINES,
    node_key_path,
)
from ._cli_relay import add_relay as _add_relay
from ._cli_serve import add_serve as _add_serve


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


def _add_jobs(sub: argparse._SubParsersAction) -> None:
    from burn_remote.server.jobs._cli import add_jobs

    add_jobs(sub, TARGET_HELP)


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

    from ._status import engine_lines

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
    lines += engine_lines(info.get("engine"))  # a server from before fair shares: none
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
