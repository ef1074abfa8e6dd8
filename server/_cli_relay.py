"""``burn-remote relay``: its flags (``add_relay``, with the relay's rate limits) and its
start (``cmd_relay``)."""

from __future__ import annotations

import argparse
import sys

from ._cli_args import DEFAULT_RELAY_LISTEN, host_port, http_bind, node_key_path, read_http_token


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
        bind = host_port("--listen", args.listen, parse_host_port)
        http = http_bind(args.http)
        http_token = read_http_token(args.http_token_file) if http else None
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


def _rate(text: str) -> float:
    """A per-second limit from the command line: a number >= 0 (0 turns the limit off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: no limit): {text}")
    return value


def add_relay(sub: argparse._SubParsersAction) -> None:
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


__all__ = ["add_relay", "cmd_relay"]
