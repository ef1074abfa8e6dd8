"""Endpoint settings and the aioquic configuration derived from them.

Sizes are chosen for bulk tensors: a 64 KiB QUIC datagram on loopback (where the MTU is
64 KiB, so one datagram carries ~45 Ethernet-sized packets' worth of data and aioquic's
per-packet Python cost is paid ~45 times less often), a conservative 1350 bytes elsewhere
(fits IPv4/IPv6 Ethernet with room for tunnels; raise it on jumbo-frame networks), and
flow-control windows of tens of MB so a transfer of hundreds of MB never stalls on window
updates. Windows are granted as the application *reads*, never doubled on receipt, so a
peer cannot make us buffer more than ``connection_window`` bytes per connection.
"""

from __future__ import annotations

import importlib
import io
import ipaddress
import ssl
from dataclasses import dataclass

from aioquic.quic.configuration import QuicConfiguration

from ._errors import TransportError
from ._identity import Identity

ALPN = "burn-remote/2"
"""The application protocol both ends speak: QUIC streams of frames, each end's key proven
on its first unidirectional stream (``_auth``)."""

LEGACY_ALPNS = ("burn-remote/1",)
"""Older transports a server still accepts in the handshake, only to tell such a client that
it must upgrade (``Endpoint.serve``'s ``refuse_legacy``): burn-remote/1 proved keys inside
TLS, with client certificates."""

MAX_FRAME_SIZE = 64 * 1024 * 1024
"""Default largest frame payload (bytes); frames carry a 4-byte big-endian length prefix."""

FRAME_SIZE_LIMIT = 2**32 - 1
"""What the 4-byte prefix can express; ``max_frame_size`` may not exceed it."""

LOOPBACK_DATAGRAM_SIZE = 65000
"""QUIC datagram size used when the peer address is a loopback address."""

DEFAULT_DATAGRAM_SIZE = 1350
"""QUIC datagram size used on real networks unless configured otherwise."""

JUMBO_THRESHOLD = 1500
"""Above this datagram size, the handshake runs at ``DEFAULT_DATAGRAM_SIZE`` first."""

QUIC_ENGINES = ("aioquic", "qh3")
"""QUIC implementations a connection may run on (aioquic is the default)."""

MIN_DATAGRAM_SIZE = 1200
"""QUIC's floor: every path must carry this much (RFC 9000 section 14)."""


@dataclass(frozen=True)
class EndpointConfig:
    """Tunables of one endpoint; the defaults suit bulk tensor traffic."""

    max_datagram_size: int | None = None
    """Datagram size for every path; ``None`` picks loopback/elsewhere sizes per peer."""

    loopback_datagram_size: int = LOOPBACK_DATAGRAM_SIZE
    """Datagram size on loopback paths when ``max_datagram_size`` is ``None``."""

    default_datagram_size: int = DEFAULT_DATAGRAM_SIZE
    """Datagram size on other paths when ``max_datagram_size`` is ``None``."""

    stream_window: int = 16 * 1024 * 1024
    """Bytes a peer may send on one stream beyond what our application has read."""

    connection_window: int = 64 * 1024 * 1024
    """Bytes a peer may send on the whole connection beyond what our application has read."""

    send_buffer: int = 4 * 1024 * 1024
    """Unacknowledged bytes one stream may hold before ``send_frame`` waits (back-pressure)."""

    max_frame_size: int = MAX_FRAME_SIZE
    """Largest frame payload accepted or sent; larger ones raise ``FrameTooLarge``."""

    max_streams: int = 128
    """Concurrent bidirectional streams a peer may open towards us."""

    idle_timeout: float = 30.0
    """Seconds of silence after which a connection is dropped (the smaller of both ends')."""

    keepalive_interval: float | None = 10.0
    """Seconds between PINGs that keep an idle connection open; ``None`` disables them."""

    handshake_timeout: float = 10.0
    """Seconds ``connect`` waits for the handshake before giving up."""

    congestion_control: str = "cubic"
    """aioquic congestion controller: ``"reno"`` or ``"cubic"``."""

    socket_buffer: int = 8 * 1024 * 1024
    """SO_RCVBUF/SO_SNDBUF requested for the UDP socket (the kernel may clamp it)."""

    max_packets_in_flight: int = 1024
    """Cap on the congestion window, in datagrams. aioquic's window otherwise grows to
    thousands of small packets on a fast path, and its per-packet bookkeeping then costs
    more than the extra window gains (1452-byte datagrams on loopback: ~25 -> ~50 MB/s)."""

    quic_engine: str = "aioquic"
    """The QUIC implementation of client connections made with ``BlockingConnection`` and
    of the connections an ``Endpoint`` serves: ``"aioquic"``, or ``"qh3"`` (compiled,
    faster; the optional ``qh3`` extra; ``_qh3_server`` adds the client-certificate check
    its TLS server lacks). What an ``Endpoint`` dials runs aioquic either way."""

    udp_offload: bool = False
    """Use Linux UDP GSO/GRO (many datagrams per syscall). Off by default: on loopback it
    measured slower (the kernel segments in software); try it on NICs with offload."""

    def __post_init__(self) -> None:
        sizes = [self.loopback_datagram_size, self.default_datagram_size]
        if self.max_datagram_size is not None:
            sizes.append(self.max_datagram_size)
        for size in sizes:
            if not MIN_DATAGRAM_SIZE <= size <= 65507:
                raise ValueError(f"datagram size {size} is outside {MIN_DATAGRAM_SIZE}..65507")
        if not 0 < self.max_frame_size <= FRAME_SIZE_LIMIT:
            raise ValueError(f"max_frame_size must be in 1..{FRAME_SIZE_LIMIT}")
        if self.stream_window > self.connection_window:
            raise ValueError("stream_window may not exceed connection_window")
        if self.quic_engine not in QUIC_ENGINES:
            raise ValueError(
                f"quic_engine {self.quic_engine!r}: expected one of {', '.join(QUIC_ENGINES)}"
            )
        if self.send_buffer <= 0 or self.max_streams <= 0:
            raise ValueError("send_buffer and max_streams must be positive")

    def datagram_size_for(self, host: str) -> int:
        """The datagram size to use towards ``host`` (an IP address literal)."""
        if self.max_datagram_size is not None:
            return self.max_datagram_size
        try:
            loopback = ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            loopback = False
        return self.loopback_datagram_size if loopback else self.default_datagram_size


def quic_configuration(
    identity: Identity,
    *,
    is_client: bool,
    config: EndpointConfig,
    datagram_size: int,
    secrets: io.TextIOBase,
) -> QuicConfiguration:
    """aioquic settings for one connection: our certificate, ALPN, windows, sizes.

    Certificate checking by aioquic is switched off (``CERT_NONE``: there is no CA and no
    host name in a peer-to-peer network); each end proves its key above TLS instead, over a
    binding made of the secret aioquic writes to ``secrets`` (``_auth``).
    """
    return QuicConfiguration(
        alpn_protocols=[ALPN] if is_client else [ALPN, *LEGACY_ALPNS],
        is_client=is_client,
        certificate=identity.certificate(),
        private_key=identity.private_key,
        verify_mode=ssl.CERT_NONE,
        idle_timeout=config.idle_timeout,
        max_data=config.connection_window,
        max_stream_data=config.stream_window,
        max_datagram_size=datagram_size,
        congestion_control_algorithm=config.congestion_control,
        # (the stub asks for typing.TextIO; the key log only calls write() and flush())
        secrets_log_file=secrets,  # type: ignore[arg-type]
    )


def qh3_part(module: str):  # type: ignore[no-untyped-def]
    """Our qh3 module ``module`` (``_qh3``: client side, ``_qh3_server``), imported only when
    an engine setting asks for qh3; a missing qh3 package is one error naming the extra."""
    try:
        return importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:
        raise TransportError(
            f"quic_engine 'qh3' needs the qh3 package (pip install 'burn-remote[qh3]'): {exc}"
        ) from None
