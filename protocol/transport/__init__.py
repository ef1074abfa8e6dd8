"""Peer-to-peer QUIC transport: Ed25519 identities, mutual TLS, a trio driver, frame streams.

Public names are re-exported here from private modules; see README.md beside this file.
"""

from ._errors import FrameTooLarge, KeyFileError, PeerRejected, TransportError
from ._identity import PEER_ID_LENGTH, Identity, PeerId
from ._paths import default_address_book_path, default_authorized_peers_path, default_key_path

__all__ = [
    "PEER_ID_LENGTH",
    "FrameTooLarge",
    "Identity",
    "KeyFileError",
    "PeerId",
    "PeerRejected",
    "TransportError",
    "default_address_book_path",
    "default_authorized_peers_path",
    "default_key_path",
]
