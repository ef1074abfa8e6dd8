"""The one ``host:port`` parser and printer (every flag, target and record uses these).

Forms: ``host:port`` and ``[v6-address]:port``; an address to listen on may also be
``:port`` (127.0.0.1) and use port 0 (any free port). A bare IPv6 address without brackets is refused: its last colon
cannot be told from the port's. A target is ``PEER@HOST:PORT`` or just ``PEER`` (a peer id
or an address-book name; see ``transport/_addressing.py`` for the book).
"""

from __future__ import annotations

Address = tuple[str, int]
"""A peer's (host, port), as flags, records and the address book name it."""
SocketAddress = tuple[str, int] | tuple[str, int, int, int]
"""An address as a UDP socket names it: (host, port), and for IPv6 also flowinfo and scope id
(what ``recvfrom`` returns; ``addr[:2]`` is its :data:`Address`)."""


def parse_host_port(text: str, *, listen: bool = False) -> Address:
    """``host:port`` or ``[v6]:port`` -> (host, port). ``listen``: an address to bind, where
    ``:port`` means 127.0.0.1 and port 0 picks a free port.

    Raises:
        ValueError: the text names what is wrong and the forms accepted.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":") or not host:
            raise ValueError(f"bad address {text!r}: expected [V6-ADDRESS]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"bad address {text!r}: no port; use HOST:PORT or [V6]:PORT")
        if ":" in host:
            raise ValueError(f"bad address {text!r}: write an IPv6 address in brackets, [::1]:PORT")
        if not (host or listen):
            raise ValueError(f"bad address {text!r}: no host; use HOST:PORT")
    lowest = 0 if listen else 1
    if not port_text.isdigit() or not lowest <= int(port_text) <= 65535:
        raise ValueError(f"bad address {text!r}: the port must be a number from {lowest} to 65535")
    return host or "127.0.0.1", int(port_text)


def format_host_port(host: str, port: int) -> str:
    """The text :func:`parse_host_port` reads back (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_target(text: str) -> tuple[str, Address | None]:
    """``PEER@HOST:PORT`` -> (``PEER``, address); ``PEER`` -> (``PEER``, None)."""
    peer, sep, addr = text.strip().partition("@")
    if not peer:
        raise ValueError(f"bad target {text!r}: expected PEER@HOST:PORT or PEER")
    return peer, (parse_host_port(addr) if sep else None)


__all__ = ["Address", "SocketAddress", "format_host_port", "parse_host_port", "split_target"]
