"""Finding a peer's UDP addresses: literals, the address book, and pluggable resolvers.

Lookup order (see :class:`Resolver`): an explicit ``peer@host:port`` literal; the local
address book; then each extra resolver hook in turn (the relay/discovery node of the
multi-node work plugs in here; local-network discovery would too).

Address book: TOML at ``$BURN_REMOTE_ADDRESS_BOOK``, else ``<config_home>/addresses.toml``
(``config_home`` is ``$BURN_REMOTE_HOME`` or ``~/.config/burn-remote``)::

    [[peer]]
    id = "<52-character peer id>"
    name = "gpu-box"                      # optional; lets you dial "gpu-box"
    addresses = ["10.0.0.5:4433", "[fd00::5]:4433"]

That is the only format (any other top-level key is refused with the fix); this is its only
reader, used by ``RemoteDevice("peer or name")``, ``--peer`` of every command and the
resolver. Addresses are parsed by ``protocol/addressing.py``, the one ``host:port`` parser.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..addressing import Address, format_host_port, parse_host_port, split_target
from ._errors import TransportError
from ._identity import PeerId
from ._paths import default_address_book_path

ResolverHook = Callable[[PeerId], Awaitable[Sequence[Address]]]
"""An extra lookup step: given a peer id, return addresses to try (may be empty)."""


def parse_peer_address(text: str) -> tuple[PeerId, Address | None]:
    """``peer`` or ``peer@host:port`` -> (peer id, address or ``None``)."""
    peer, addr = split_target(text)
    return PeerId.parse(peer), addr


def format_peer_address(peer: PeerId, addr: Address) -> str:
    """The ``peer@host:port`` literal that :func:`parse_peer_address` reads back."""
    return f"{peer}@{format_host_port(*addr)}"


@dataclass(frozen=True)
class BookEntry:
    """One ``[[peer]]`` table of the address book."""

    peer: PeerId
    """Whose addresses these are."""
    addresses: tuple[Address, ...]
    """Where to try, in order."""
    name: str | None = None
    """An optional short name that can be dialled instead of the peer id."""


@dataclass
class AddressBook:
    """The local address book (read once; call :meth:`load` again after editing)."""

    entries: list[BookEntry] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> AddressBook:
        """Read the TOML file; a missing file is an empty book, a malformed one an error."""
        p = Path(path) if path is not None else default_address_book_path()
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            return cls()
        except tomllib.TOMLDecodeError as exc:
            raise TransportError(f"address book {p}: {exc}") from None
        extra = sorted(set(data) - {"peer"})
        if extra or not isinstance(data.get("peer", []), list):
            raise TransportError(
                f"address book {p}: {', '.join(repr(k) for k in extra) or 'peer'} is not part "
                'of its format: write each peer as [[peer]] with id = "<peer id>", '
                'addresses = ["host:port", ...] and an optional name = "..."'
            )
        entries = []
        for i, item in enumerate(data.get("peer", [])):
            try:
                entries.append(
                    BookEntry(
                        peer=PeerId.parse(item["id"]),
                        addresses=tuple(parse_host_port(a) for a in item.get("addresses", [])),
                        name=item.get("name"),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise TransportError(f"address book {p}: peer #{i + 1}: {exc}") from None
        return cls(entries)

    def lookup(self, key: PeerId | str) -> BookEntry | None:
        """Find by peer id or by name."""
        for entry in self.entries:
            if entry.peer == key or (isinstance(key, str) and key in (entry.name, str(entry.peer))):
                return entry
        return None


class Resolver:
    """Turns what a user typed (``peer@host:port``, a peer id, a book name) into a peer id
    and the addresses to try, asking the address book and then each hook."""

    def __init__(self, book: AddressBook | None = None, hooks: Sequence[ResolverHook] = ()) -> None:
        self.book = book if book is not None else AddressBook.load()
        self.hooks = list(hooks)

    async def resolve(self, target: str | PeerId) -> tuple[PeerId, list[Address]]:
        """Raises ``TransportError`` when no step knows an address for the target."""
        if isinstance(target, str) and "@" in target:
            peer, addr = parse_peer_address(target)
            assert addr is not None
            return peer, [addr]
        entry = self.book.lookup(target)
        if entry is not None:
            peer = entry.peer
        elif isinstance(target, PeerId):
            peer = target
        else:
            try:
                peer = PeerId.parse(target)
            except ValueError:
                raise TransportError(f"{target!r} is neither a peer id nor a known name") from None
            entry = self.book.lookup(peer)
        addresses = list(entry.addresses) if entry is not None else []
        for hook in self.hooks:
            addresses.extend(a for a in await hook(peer) if a not in addresses)
        if not addresses:
            raise TransportError(
                f"no address known for peer {peer}: dial peer@host:port or add it to the "
                f"address book ({default_address_book_path()})"
            )
        return peer, addresses
