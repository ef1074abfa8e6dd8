"""Peer-to-peer QUIC transport: Ed25519 identities, mutual TLS, a trio driver, frame streams.

Public names are re-exported here from private modules; see README.md beside this file.
"""

from ._authorized import AuthorizedPeers, load_authorized_peers, parse_authorized_peers
from ._config import (
    ALPN,
    DEFAULT_DATAGRAM_SIZE,
    LOOPBACK_DATAGRAM_SIZE,
    MAX_FRAME_SIZE,
    EndpointConfig,
)
from ._connection import Connection
from ._endpoint import Endpoint
from ._errors import FrameTooLarge, KeyFileError, PeerRejected, TransportError
from ._identity import PEER_ID_LENGTH, Identity, PeerId
from ._paths import default_address_book_path, default_authorized_peers_path, default_key_path
from ._resolver import Resolver, add_resolver, remove_resolver, resolve_peer
from ._streams import FRAME_PREFIX_SIZE, FrameStream

__all__ = [
    "ALPN",
    "DEFAULT_DATAGRAM_SIZE",
    "FRAME_PREFIX_SIZE",
    "LOOPBACK_DATAGRAM_SIZE",
    "MAX_FRAME_SIZE",
    "PEER_ID_LENGTH",
    "AuthorizedPeers",
    "Connection",
    "Endpoint",
    "EndpointConfig",
    "FrameStream",
    "FrameTooLarge",
    "Identity",
    "KeyFileError",
    "PeerId",
    "PeerRejected",
    "Resolver",
    "TransportError",
    "add_resolver",
    "default_address_book_path",
    "default_authorized_peers_path",
    "default_key_path",
    "load_authorized_peers",
    "parse_authorized_peers",
    "remove_resolver",
    "resolve_peer",
]
