"""Which clients a server admits: a set of peer ids, or an ``authorized_peers`` file.

File format (like SSH's ``authorized_keys``): one peer id per line; ``#`` starts a comment;
text after the peer id on the same line (a name, say) is ignored; blank lines are skipped.
The file is re-read when its modification time changes, so adding a peer needs no restart.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ._errors import TransportError
from ._identity import PeerId


def parse_authorized_peers(text: str, source: str = "<text>") -> set[PeerId]:
    """Parse the file format above; a bad line raises with its line number."""
    peers: set[PeerId] = set()
    for number, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        try:
            peers.add(PeerId.parse(body.split()[0]))
        except ValueError as exc:
            raise TransportError(f"{source}:{number}: {exc}") from None
    return peers


def load_authorized_peers(path: str | os.PathLike[str]) -> set[PeerId]:
    p = Path(path)
    return parse_authorized_peers(p.read_text(), str(p))


class AuthorizedPeers:
    """The server's admission policy, asked once per client handshake."""

    def __init__(
        self,
        peers: Iterable[PeerId] | str | os.PathLike[str] | None,
        *,
        allow_any: bool = False,
    ) -> None:
        self.allow_any = allow_any
        self._path: Path | None = None
        self._mtime: float | None = None
        self._peers: frozenset[PeerId] = frozenset()
        if isinstance(peers, str | os.PathLike):
            self._path = Path(peers)
            self._reload()
        elif peers is not None:
            self._peers = frozenset(peers)

    def _reload(self) -> None:
        assert self._path is not None
        try:
            mtime = self._path.stat().st_mtime
        except FileNotFoundError:
            self._peers, self._mtime = frozenset(), None
            return
        if mtime != self._mtime:
            self._peers = frozenset(load_authorized_peers(self._path))
            self._mtime = mtime

    def check(self, peer: PeerId) -> str | None:
        """``None`` to admit ``peer``, else the reason sent to it."""
        if self.allow_any:
            return None
        if self._path is not None:
            self._reload()
        if peer in self._peers:
            return None
        return f"peer {peer} is not in this server's authorized peers"
