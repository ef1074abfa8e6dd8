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


_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [_add_id]


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
