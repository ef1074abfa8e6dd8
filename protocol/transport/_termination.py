"""Why a QUIC connection closed, as an exception whose text a person can act on: shared by
the trio driver (``_connection``) and the threaded client (``_blocking``), kept free of trio
so a client process never loads it."""

from __future__ import annotations

from aioquic import tls
from aioquic.quic import events

from ._auth import AUTH_REFUSED, VERSION_REFUSED
from ._errors import PeerRejected, TransportError

_AUTH_ALERTS = {
    tls.AlertDescription.bad_certificate,
    tls.AlertDescription.unsupported_certificate,
    tls.AlertDescription.access_denied,
    tls.AlertDescription.certificate_required,
}


def termination_error(event: events.ConnectionTerminated, where: str) -> TransportError:
    """Turn aioquic's close event into an exception whose text says what happened."""
    code = event.error_code
    reason = event.reason_phrase or "no reason given"
    if 0x100 <= code < 0x200:
        try:
            alert = tls.AlertDescription(code - 0x100)
        except ValueError:
            return TransportError(f"{where}: TLS alert {code - 0x100}: {reason}")
        cls = PeerRejected if alert in _AUTH_ALERTS else TransportError
        return cls(f"{where}: TLS {alert.name}: {reason}")
    if code in (AUTH_REFUSED, VERSION_REFUSED) and event.frame_type is None:
        return PeerRejected(f"{where}: refused: {reason}")
    if code == 0 and event.frame_type is None:
        return TransportError(f"{where}: closed: {reason}")
    return TransportError(f"{where}: closed (error 0x{code:x}): {reason}")
