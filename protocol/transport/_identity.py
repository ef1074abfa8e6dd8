"""Node identity: an Ed25519 key in a private file, and the peer id derived from it.

The peer id is the 32-byte raw Ed25519 public key written in RFC 4648 base32, lowercase,
without ``=`` padding: always 52 characters of ``a-z2-7``. It is case-insensitive on input
(parsing lower-cases and tolerates trailing padding), so what :func:`str` prints parses back
to the same id. Base32 was chosen over hex (shorter) and base58 (no extra alphabet to trust).
"""

from __future__ import annotations

import base64
import datetime
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from ._errors import KeyFileError, TransportError

PEER_ID_LENGTH = 52
"""Characters in the text form of a peer id (32 bytes in unpadded base32)."""

_B32_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz234567")


@dataclass(frozen=True, order=True)
class PeerId:
    """A node's public identity: its raw 32-byte Ed25519 public key."""

    raw: bytes
    """The 32-byte public key, as it appears in the node's certificate."""

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise ValueError(f"a peer id is 32 bytes, got {len(self.raw)}")

    @classmethod
    def parse(cls, text: str) -> PeerId:
        """Parse the text form that ``str(peer_id)`` prints (case and padding tolerated)."""
        t = text.strip().lower().rstrip("=")
        if len(t) != PEER_ID_LENGTH or not set(t) <= _B32_ALPHABET:
            raise ValueError(
                f"not a peer id: {text!r} (expected {PEER_ID_LENGTH} base32 characters a-z, 2-7)"
            )
        raw = base64.b32decode(t.upper() + "====")
        return cls(raw)

    @classmethod
    def from_public_key(cls, key: ed25519.Ed25519PublicKey) -> PeerId:
        return cls(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def __str__(self) -> str:
        return base64.b32encode(self.raw).decode("ascii").rstrip("=").lower()

    def __repr__(self) -> str:
        return f"PeerId({str(self)!r})"


def peer_id_of_certificate(cert: x509.Certificate) -> PeerId:
    """The peer id a certificate speaks for; only Ed25519 certificates are accepted."""
    key = cert.public_key()
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise TransportError(f"peer certificate key is {type(key).__name__}, not Ed25519")
    return PeerId.from_public_key(key)


class Identity:
    """A node's secret key; hands out its peer id and a self-signed TLS certificate."""

    def __init__(self, private_key: ed25519.Ed25519PrivateKey) -> None:
        self.private_key = private_key
        self.peer_id = PeerId.from_public_key(private_key.public_key())
        self._certificate: x509.Certificate | None = None

    @classmethod
    def generate(cls) -> Identity:
        """A fresh in-memory identity (tests, throw-away clients)."""
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Load a PEM (PKCS#8) key file, refusing one that group or others can read."""
        p = Path(path)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise KeyFileError(f"no key file at {p}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(
                f"key file {p} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be "
                f"accessible by group or others (run: chmod 600 {p})"
            )
        try:
            key = serialization.load_pem_private_key(p.read_bytes(), password=None)
        except TypeError:  # cryptography's way of saying "it is encrypted"
            raise KeyFileError(
                f"key file {p} is encrypted; burn-remote reads unencrypted PKCS#8 keys "
                "(protected by mode 0600)"
            ) from None
        except ValueError as exc:
            raise KeyFileError(f"key file {p} is not a PEM private key: {exc}") from None
        except OSError as exc:
            raise KeyFileError(f"key file {p} cannot be read: {exc}") from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise KeyFileError(f"key file {p} holds a {type(key).__name__}, not Ed25519")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key at ``path``, creating it (mode 0600, parent 0700) on first use."""
        p = Path(path)
        if p.exists():
            return cls.load(p)
        ident = cls.generate()
        try:
            ident.save(p)
        except FileExistsError:  # another thread or process created it first: use theirs
            return cls.load(p)
        return ident

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key; the file is created 0600 and never overwritten."""
        p = Path(path)
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # Written whole under a private name, then linked in place: a concurrent first use
        # (two devices connecting at once) never reads a half-written key. link() fails
        # if the key exists, so a key is never overwritten.
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            os.link(tmp, p)
        finally:
            tmp.unlink()

    def certificate(self) -> x509.Certificate:
        """A self-signed certificate of this key; the peer checks the key, not the name."""
        if self._certificate is None:
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(self.peer_id))])
            now = datetime.datetime.now(datetime.UTC)
            self._certificate = (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(self.private_key.public_key())
                .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=3650))
                .sign(self.private_key, None)
            )
        return self._certificate
