"""Where a node keeps its files, in one place so the CLI, the docs and the tests agree.

The directory is ``$BURN_REMOTE_HOME`` when set, else ``$XDG_CONFIG_HOME/burn-remote``, else
``~/.config/burn-remote``. It holds ``key`` (the Ed25519 secret key), ``authorized_peers``
and ``addresses.toml``. Each file also has its own environment override, so a test or a
container can point at a file without moving the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "BURN_REMOTE_HOME"
KEY_ENV = "BURN_REMOTE_KEY"
ADDRESS_BOOK_ENV = "BURN_REMOTE_ADDRESS_BOOK"
AUTHORIZED_PEERS_ENV = "BURN_REMOTE_AUTHORIZED_PEERS"


def config_home() -> Path:
    """The node's configuration directory (not created here)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "burn-remote"


def _file(env: str, name: str) -> Path:
    value = os.environ.get(env)
    return Path(value).expanduser() if value else config_home() / name


def default_key_path() -> Path:
    """``$BURN_REMOTE_KEY``, else ``<config_home>/key``."""
    return _file(KEY_ENV, "key")


def default_address_book_path() -> Path:
    """``$BURN_REMOTE_ADDRESS_BOOK``, else ``<config_home>/addresses.toml``."""
    return _file(ADDRESS_BOOK_ENV, "addresses.toml")


def default_authorized_peers_path() -> Path:
    """``$BURN_REMOTE_AUTHORIZED_PEERS``, else ``<config_home>/authorized_peers``."""
    return _file(AUTHORIZED_PEERS_ENV, "authorized_peers")
