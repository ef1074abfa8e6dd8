"""Exceptions of the transport, kept apart so every module can raise them without cycles."""

from __future__ import annotations


class TransportError(Exception):
    """The transport failed; ``str(exc)`` is a reason a person can act on."""


class PeerRejected(TransportError):
    """Authentication failed: the peer presented the wrong key, or one side refused the other.

    Raised by :meth:`Endpoint.connect` when the server's key is not the dialled peer id, when
    the server refuses this client (not authorised, no certificate), and on the server side
    the rejected connection simply never reaches the handler.
    """


class PeerGone(TransportError):
    """Nothing listens at the peer's address any more (its host answered "port unreachable"):
    the server process is gone, not just slow or cut off."""


class FrameTooLarge(TransportError):
    """A frame is larger than the configured maximum (on either side of the stream)."""


class KeyFileError(TransportError):
    """The identity key file is missing, malformed, or readable by group/other."""
