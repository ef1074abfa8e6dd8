"""Discovery and relaying: signed address records, and QUIC tunnelled through a relay node.

The relay node itself is ``burn-remote relay`` (``burn_remote.server._relay``); this package
is what peers need: records, the relay client, and the resolver ``RemoteDevice`` falls back
to when the address book has no entry.
"""

from ._agent import (
    RELAY_ENV,
    RelayAgent,
    configured_relay,
    is_relay_tunnel,
    resolve_peer,
    resolve_via_relay,
    serve_via_relay,
)
from ._client import RelayClient, RelayError
from ._observe import observe_address
from ._records import AddressRecord, RecordRefused, RecordStore

__all__ = [
    "RELAY_ENV",
    "AddressRecord",
    "RecordRefused",
    "RecordStore",
    "RelayAgent",
    "RelayClient",
    "RelayError",
    "configured_relay",
    "is_relay_tunnel",
    "observe_address",
    "resolve_peer",
    "resolve_via_relay",
    "serve_via_relay",
]
