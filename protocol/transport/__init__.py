"""Peer-to-peer QUIC transport: Ed25519 identities, mutual TLS, a trio driver, frame streams.

Public names are re-exported here from private modules; see README.md beside this file. The
trio driver (`Connection`, `Endpoint`, `FrameStream`) loads on first use (see __getattr__):
a client's `BlockingConnection` runs on threads and never loads trio.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from ._addressing import (
    AddressBook,
    BookEntry,
    Resolver,
    ResolverHook,
    format_peer_address,
    parse_host_port,
    parse_peer_address,
)
from ._authorized import AuthorizedPeers, load_authorized_peers, parse_authorized_peers
from ._blocking import BlockingConnection
from ._config import (
    ALPN,
    DEFAULT_DATAGRAM_SIZE,
    LOOPBACK_DATAGRAM_SIZE,
    MAX_FRAME_SIZE,
    EndpointConfig,
)
from ._errors import FrameTooLarge, KeyFileError, PeerGone, PeerRejected, TransportError
from ._identity import PEER_ID_LENGTH, Identity, PeerId
from ._paths import default_address_book_path, default_authorized_peers_path, default_key_path
from ._resolver import PeerLookup, add_resolver, ask_resolvers, remove_resolver

_LAZY = {
    "Connection": "._connection",
    "Endpoint": "._endpoint",
    "FrameStream": "._streams",
    "FRAME_PREFIX_SIZE": "._streams",
}
"""The trio driver's public names, loaded on first use."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


if TYPE_CHECKING:  # for type checkers: the names as if imported eagerly
    from ._connection import Connection  # noqa: F401
    from ._endpoint import Endpoint  # noqa: F401
    from ._streams import FRAME_PREFIX_SIZE, FrameStream  # noqa: F401

__all__ = [
    "ALPN",
    "DEFAULT_DATAGRAM_SIZE",
    "FRAME_PREFIX_SIZE",
    "LOOPBACK_DATAGRAM_SIZE",
    "MAX_FRAME_SIZE",
    "PEER_ID_LENGTH",
    "AddressBook",
    "AuthorizedPeers",
    "BlockingConnection",
    "BookEntry",
    "Connection",
    "Endpoint",
    "EndpointConfig",
    "FrameStream",
    "FrameTooLarge",
    "Identity",
    "KeyFileError",
    "PeerId",
    "PeerLookup",
    "PeerGone",
    "PeerRejected",
    "Resolver",
    "ResolverHook",
    "TransportError",
    "add_resolver",
    "ask_resolvers",
    "default_address_book_path",
    "format_peer_address",
    "default_authorized_peers_path",
    "default_key_path",
    "load_authorized_peers",
    "parse_authorized_peers",
    "parse_host_port",
    "parse_peer_address",
    "remove_resolver",
]
