"""What the ``burn-remote`` subcommands share: default addresses, the node key rule, and
the argparse types of their flags (addresses, sizes, counts, devices).

Nothing heavy is imported here at module level, so ``burn-remote --help`` stays instant;
each type imports what it checks with when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
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


def port_or_off(text: str) -> int | None:
    if text.strip().lower() == "off":
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or off, got {text!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def host_port(flag: str, text: str, parse: Callable[..., tuple[str, int]]) -> tuple[str, int]:
    """A listening address (``:PORT`` means 127.0.0.1; port 0 picks a free one)."""
    try:
        return parse(text, listen=True)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def http_bind(text: str | None) -> tuple[str, int] | None:
    """``--http``: a bare PORT (or ``:PORT``) is 127.0.0.1, so the operator port is local
    unless a host is named."""
    if not text:
        return None
    from burn_remote.protocol.addressing import parse_host_port

    text = text.strip()
    return host_port("--http", f":{text}" if text.isdigit() else text, parse_host_port)


def read_http_token(path: str | None) -> str | None:
    from burn_remote.server._http import read_token

    return read_token(path)


def authorized_peers_file(given: str | None) -> str:
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


def byte_size(text: str) -> int:
    """argparse type for byte sizes: ``1G``, ``512MiB``, ``1.5GB`` or plain bytes."""
    from burn_remote.engine.memory import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def device_kind(text: str) -> str:
    """argparse type for ``--device``: a local device kind, checked by the one parser that
    `Device.resolve` and the engine's backend table use, so a typo is refused with the
    spellings before anything starts."""
    from burn_remote.engine.backend_base import parse_device

    try:
        parse_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_int(text: str) -> int:
    """A count from the command line: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


__all__ = [
    "DEFAULT_RELAY_LISTEN",
    "DEFAULT_SERVE_LISTEN",
    "DEFAULT_SERVE_PORT",
    "SERVER_QUIC_ENGINES",
    "authorized_peers_file",
    "byte_size",
    "device_kind",
    "host_port",
    "http_bind",
    "node_key_path",
    "port_or_off",
    "positive_int",
    "read_http_token",
]
