"""Which clients a server admits, and with which role: a set of peer ids, or an
``authorized_peers`` file.

File format (like SSH's ``authorized_keys``): one peer per line, ``#`` starts a comment, blank
lines are skipped::

    # peer id                                              name     role
    k2v3...q7a                                             alice
    m4xo...pz1                                             ops      role=admin

The first word is the peer id. A word ``role=<role>`` gives the peer a role: ``user`` (the
default: sees and touches only its own jobs, artifacts, uploads and sessions) or ``admin``
(also sees, fetches and cancels every peer's jobs and artifacts). Any other words (a name,
say) are ignored.

The file is re-read when its modification time changes, so adding a peer needs no restart. A
file that cannot be read or parsed while the server runs (a typo, a half-written line, a
directory in its place) keeps the last good list in force and logs why, once per change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ._errors import TransportError
from ._identity import PeerId

log = logging.getLogger("burn_remote.transport")

ROLES = ("user", "admin")
"""Roles a line may grant; ``user`` is the default."""


def parse_authorized_peers(text: str, source: str = "<text>") -> dict[PeerId, str]:
    """Parse the file format above into peer -> role; a bad line raises with its number."""
    peers: dict[PeerId, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            peer = PeerId.parse(words[0])
        except ValueError as exc:
            raise TransportError(f"{source}:{number}: {exc}") from None
        role = "user"
        for word in words[1:]:
            if word.startswith("role="):
                role = word.removeprefix("role=")
                if role not in ROLES:
                    raise TransportError(
                        f"{source}:{number}: unknown role {role!r} (roles: {', '.join(ROLES)})"
                    )
        peers[peer] = role
    return peers


def load_authorized_peers(path: str | os.PathLike[str]) -> dict[PeerId, str]:
    """Read and parse an authorized-peers file; any failure is one TransportError line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise TransportError(f"{p}: is a directory, not an authorized-peers file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TransportError(f"{p}: cannot read: {exc}") from None
    return parse_authorized_peers(text, str(p))


class AuthorizedPeers:
    """The server's admission policy (asked once per client handshake) and peer roles."""

    def __init__(
        self,
        peers: Iterable[PeerId] | Mapping[PeerId, str] | str | os.PathLike[str] | None,
        *,
        allow_any: bool = False,
    ) -> None:
        """Raises TransportError when a file given here cannot be parsed (at start-up a bad
        file is an error; later, a bad edit keeps the last good list)."""
        self.allow_any = allow_any
        self.owner: PeerId | None = None
        """The server's own peer id: always admitted, as ``admin`` (its operator runs
        ``burn-remote status --key DATA_DIR/key``), whatever the file says. Set by the server
        once its key is loaded; not counted in ``admitted()``."""
        self._path: Path | None = None
        self._stamp: tuple[float, int] | None = None
        self._peers: dict[PeerId, str] = {}
        self._guests: dict[PeerId, int] = {}
        """Peers admitted for device-group links only (``admit_guest``), with a count."""
        if isinstance(peers, str | os.PathLike):
            self._path = Path(peers)
            if self._path.exists():
                self._peers = load_authorized_peers(self._path)
                self._stamp = _stamp(self._path)
        elif isinstance(peers, Mapping):
            self._peers = dict(peers)
        elif peers is not None:
            self._peers = dict.fromkeys(peers, "user")

    def _reload(self) -> None:
        assert self._path is not None
        try:
            stamp = _stamp(self._path)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            stamp = (-1.0, hash(str(exc)))
        if stamp == self._stamp:
            return
        self._stamp = stamp
        if stamp is None:  # removed: nobody is admitted (as at start without the file)
            log.warning("%s was removed: no peer is admitted until it is back", self._path)
            self._peers = {}
            return
        try:
            self._peers = load_authorized_peers(self._path)
        except TransportError as exc:
            log.error("authorized peers not reloaded, the last good list stays: %s", exc)

    def check(self, peer: PeerId) -> str | None:
        """``None`` to admit ``peer``, else the reason sent to it."""
        if self.allow_any or peer == self.owner:
            return None
        if self._path is not None:
            self._reload()
        if peer in self._peers or peer in self._guests:
            return None
        return f"peer {peer} is not in this server's authorized peers"

    def admit_guest(self, peer: PeerId) -> None:
        """Admit ``peer``'s key proof although it is not authorised: a client that is
        made it a ring neighbour of a device group. The server lets such a connection do a
        group link and nothing else (``is_guest_only``). Counted: one per group."""
        self._guests[peer] = self._guests.get(peer, 0) + 1

    def release_guest(self, peer: PeerId) -> None:
        n = self._guests.get(peer, 0) - 1
        if n > 0:
            self._guests[peer] = n
        else:
            self._guests.pop(peer, None)

    def is_guest_only(self, peer: PeerId | None) -> bool:
        """Admitted only as a group neighbour (not authorised, not open mode)."""
        if peer is None or self.allow_any or peer == self.owner or peer not in self._guests:
            return False
        if self._path is not None:
            self._reload()
        return peer not in self._peers

    def admitted(self) -> int | None:
        """How many peers are admitted now; None under ``allow_any`` (any number)."""
        if self.allow_any:
            return None
        if self._path is not None:
            self._reload()
        return len(self._peers)

    def role(self, peer: PeerId | str) -> str:
        """The peer's role: ``admin`` where the file says so and for the server's own key,
        else ``user``."""
        if self._path is not None:
            self._reload()
        try:
            key = PeerId.parse(peer) if isinstance(peer, str) else peer
        except ValueError:
            return "user"
        if key == self.owner:
            return "admin"
        return self._peers.get(key, "user")


def _stamp(path: Path) -> tuple[float, int]:
    """What tells a changed file: modification time and size (an edit within one mtime
    tick usually changes the size)."""
    st = path.stat()
    return (st.st_mtime, st.st_size)
