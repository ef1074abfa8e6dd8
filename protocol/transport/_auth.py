"""Peer authentication above TLS: each end proves its Ed25519 key on a stream of its own.

Why not inside TLS: neither QUIC engine offers a public way to check a peer's key during the
handshake (aioquic verifies certificates only against a CA store, and has no public way for
a server to ask for a client certificate; qh3's TLS server never asks for one). The checks
once lived in overrides of both engines' TLS classes, which a minor release could break or
open. Here TLS gives confidentiality and a secret unique to the connection; the keys are
proven with what both engines offer publicly.

**The channel binding.** Both engines write the TLS traffic secrets to the configuration's
``secrets_log_file`` (the NSS key-log lines a packet analyser reads). ``SecretSink`` is that
file for one connection: it keeps ``SERVER_TRAFFIC_SECRET_0``, which both ends derive from
the whole handshake through the server's Finished (both randoms and the ECDHE secret), and
which the server knows as soon as it has written its flight. The binding is
``sha256(BINDING_LABEL || secret)``: equal on both ends of one connection, different on any
other (a relay in the middle runs two handshakes and gets two), and it reveals nothing of
the secret.

**The proofs.** Each end sends, on its first unidirectional stream (client: stream 2,
server: stream 3), one frame (4-byte big-endian length, 96) of ``public key (32) ||
Ed25519 signature (64)``. The client ends its stream with its proof; the server ends its
own once the client's proof checked out and the client was admitted, which is how the
client learns it was (``connect`` returns then, or raises the server's refusal). The signed bytes are ``PROOF_CONTEXT ||
role || signer key || binding`` for the server (role ``S``) and ``PROOF_CONTEXT || role ||
signer key || server key || binding`` for the client (role ``C``). The server sends its
proof as soon as it has the binding (aioquic: with its first flight, as 0.5-RTT data;
qh3: when the handshake completes); the client sends its own, and then its application
data, once the server's proof checked out against the peer id it dialled. The server hands a connection to its handler only once the
client's proof checked out and ``authorize`` admitted the client's key.

A failed check closes the connection with the application error ``AUTH_REFUSED`` and a
reason; ``PeerRejected`` on the other end carries it.
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._identity import Identity, PeerId

Authorize = Callable[[PeerId], str | None]
"""Server policy: return ``None`` to admit a client, or the reason it is refused."""

PROOF_CONTEXT = b"burn-remote peer proof v1\0"
"""Prefix of every signed proof: no other signature of a node key (relay records, disco
messages, certificates) starts with it, so a proof cannot be taken for one of them."""
BINDING_LABEL = b"burn-remote channel binding v1\0"
"""Prefix hashed with the TLS secret into the channel binding."""
BINDING_SECRET = "SERVER_TRAFFIC_SECRET_0"
"""The key-log label of the secret the binding is derived from (both ends log it)."""
CLIENT_AUTH_STREAM = 2
"""The client's first unidirectional stream carries its proof."""
SERVER_AUTH_STREAM = 3
"""The server's first unidirectional stream carries its proof."""
PROOF_SIZE = 96
"""A proof's payload: the signer's 32-byte public key and a 64-byte Ed25519 signature."""
AUTH_REFUSED = 0x5A
"""QUIC application error code of a connection closed because a proof failed or the peer
is not admitted (the reason phrase says which)."""
VERSION_REFUSED = 0x5B
"""QUIC application error code of a connection closed because the client offered only an
older transport (ALPN) of this protocol."""
PREAUTH_BYTES = 1024 * 1024
"""Application bytes a server buffers from a client before the client's proof checked
out; more closes the connection (a stranger cannot make it hold a window's worth)."""

_FRAME = struct.Struct(">I")


class AuthFailure(Exception):
    """A proof did not check out; the message is the reason sent to the peer."""


class SecretSink(io.TextIOBase):
    """The ``secrets_log_file`` of one connection: keeps the secret the binding is made of
    and drops every other line (nothing is written anywhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.secret: bytes | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == BINDING_SECRET and self.secret is None:
                self.secret = bytes.fromhex(words[2])
        return len(text)

    def flush(self) -> None:
        pass


def channel_binding(secret: bytes) -> bytes:
    """The 32 bytes both ends of one connection sign (see the module doc)."""
    return hashlib.sha256(BINDING_LABEL + secret).digest()


def signed_bytes(role: bytes, signer: PeerId, server: PeerId | None, binding: bytes) -> bytes:
    """What a proof signs: the server's names itself, the client's also the server."""
    parts = [PROOF_CONTEXT, role, signer.raw]
    if role == b"C":
        assert server is not None
        parts.append(server.raw)
    parts.append(binding)
    return b"".join(parts)


def make_proof(identity: Identity, role: bytes, server: PeerId | None, binding: bytes) -> bytes:
    """A proof frame (length prefix included) for ``identity`` in ``role``."""
    signature = identity.private_key.sign(signed_bytes(role, identity.peer_id, server, binding))
    payload = identity.peer_id.raw + signature
    return _FRAME.pack(len(payload)) + payload


def check_proof(payload: bytes, role: bytes, server: PeerId | None, binding: bytes) -> PeerId:
    """The peer id a proof payload proves, or ``AuthFailure`` saying why it does not."""
    if len(payload) != PROOF_SIZE:
        raise AuthFailure(f"malformed key proof: {len(payload)} bytes, expected {PROOF_SIZE}")
    signer = PeerId(payload[:32])
    try:
        key = Ed25519PublicKey.from_public_bytes(signer.raw)
        key.verify(payload[32:], signed_bytes(role, signer, server, binding))
    except (InvalidSignature, ValueError):
        if role == b"S":
            raise AuthFailure(
                f"the server's key proof for {signer} does not verify for this connection"
            ) from None
        raise AuthFailure(
            f"the client's key proof for {signer} does not verify for this connection to "
            f"{server} (signed for another connection or another server)"
        ) from None
    return signer


class PeerAuth:
    """One connection's authentication, sans I/O: the driver feeds it the peer's auth
    stream and sends what it says; ``peer_id`` is set once the peer's proof checked out."""

    def __init__(
        self,
        identity: Identity,
        *,
        is_client: bool,
        expected_peer: PeerId | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self.identity = identity
        self.is_client = is_client
        self.expected_peer = expected_peer
        self.authorize = authorize
        self.sink = SecretSink()
        self.our_stream = CLIENT_AUTH_STREAM if is_client else SERVER_AUTH_STREAM
        self.peer_stream = SERVER_AUTH_STREAM if is_client else CLIENT_AUTH_STREAM
        self.peer_id: PeerId | None = None
        self._sent = False
        self._admitted = False
        self._peer_ended = False
        self._received = bytearray()

    @property
    def binding(self) -> bytes | None:
        secret = self.sink.secret
        return None if secret is None else channel_binding(secret)

    def proof_due(self) -> bytes | None:
        """Our proof frame once the binding is known (once; None otherwise). A client sends
        its own only after the server's checked out: it never signs for an impostor, and a
        wrong dial is reported as such, not as the server's refusal of a proof naming
        another server. A client ends its stream with the proof; a server ends its own
        once it admitted the client (``admit_due``)."""
        if self._sent or (self.is_client and self.peer_id is None):
            return None
        binding = self.binding
        if binding is None:
            return None
        self._sent = True
        if self.is_client:
            assert self.expected_peer is not None
            return make_proof(self.identity, b"C", self.expected_peer, binding)
        return make_proof(self.identity, b"S", None, binding)

    def admit_due(self) -> bool:
        """Server: True once, when the client's proof checked out and it was admitted; the
        driver then ends the server's auth stream, which tells the client so."""
        if self.is_client or self.peer_id is None or self._admitted:
            return False
        self._admitted = True
        return True

    @property
    def done(self) -> bool:
        """The peer is proven and admitted: a server has the client's proof and admitted it;
        a client has the server's proof and the end of its stream (it was admitted)."""
        return self.peer_id is not None and (self._peer_ended or not self.is_client)

    def feed(self, data: bytes, end: bool) -> None:
        """Bytes of the peer's auth stream; raises ``AuthFailure`` on a bad proof."""
        self._received += data
        if len(self._received) > 4 + PROOF_SIZE:
            raise AuthFailure(f"key proof longer than {4 + PROOF_SIZE} bytes")
        if len(self._received) == 4 + PROOF_SIZE and self.peer_id is None:
            self._check(bytes(self._received))
        if end:
            if self.peer_id is None:
                raise AuthFailure("the auth stream ended without a whole key proof")
            self._peer_ended = True

    def _check(self, frame: bytes) -> None:
        if _FRAME.unpack_from(frame)[0] != PROOF_SIZE:
            raise AuthFailure("malformed key proof frame")
        binding = self.binding
        if binding is None:  # (the peer cannot send before the handshake has keys)
            raise AuthFailure("key proof before the handshake completed")
        payload = frame[4:]
        if self.is_client:
            peer = check_proof(payload, b"S", None, binding)
            if peer != self.expected_peer:
                raise AuthFailure(
                    f"server proved peer id {peer}, but {self.expected_peer} was dialled"
                )
        else:
            peer = check_proof(payload, b"C", self.identity.peer_id, binding)
            reason = self.authorize(peer) if self.authorize is not None else None
            if reason is not None:
                raise AuthFailure(reason)
        self.peer_id = peer
