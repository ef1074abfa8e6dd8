"""The engine seam (``_engine``): the drivers use nothing of a QUIC connection beyond the
declared interfaces, every member of which is public, and each adapter offers all of its
interface (mypy holds them to it statically through ``_engine._conforms``; this checks the
same at run time, with real instances)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from burn_remote.protocol.transport import EndpointConfig, Identity
from burn_remote.protocol.transport._auth import SecretSink
from burn_remote.protocol.transport._engine import (
    ClientEngine,
    EndpointEngine,
    QuicEngine,
    ReceiveLedger,
)
from burn_remote.protocol.transport._quic import client_connection

ROOT = Path(__file__).resolve().parents[2] / "protocol" / "transport"
DRIVERS = ("_connection.py", "_endpoint.py", "_blocking.py", "_streams.py")


def members(*protocols: type) -> set[str]:
    names: set[str] = set()
    for proto in protocols:
        for klass in proto.__mro__:
            if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
                continue
            names |= {n for n in vars(klass) if not n.startswith("_")}
            names |= set(getattr(klass, "__annotations__", {}))
    return names


INTERFACE = members(ClientEngine, EndpointEngine)


def engine_uses(tree: ast.AST) -> set[str]:
    """Attributes read or called on an engine: ``quic.X``, ``self._quic.X``, ``conn._quic.X``."""
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        named = isinstance(base, ast.Name) and base.id == "quic"
        if named or (isinstance(base, ast.Attribute) and base.attr == "_quic"):
            used.add(node.attr)
    return used


def test_every_member_of_the_interface_is_public() -> None:
    assert INTERFACE and all(not name.startswith("_") for name in INTERFACE)
    assert {"ledger", "close_pending", "handshake_confirmed", "connect"} <= INTERFACE


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_drivers_use_only_the_interface(driver: str) -> None:
    used = engine_uses(ast.parse((ROOT / driver).read_text()))
    assert used - INTERFACE == set(), f"{driver} reaches past the engine interface"


def test_the_driver_state_is_the_drivers_ledger_not_the_engines() -> None:
    """``app_consumed`` and friends live in the driver's ``ReceiveLedger``, which the engine
    only reads: no engine attribute of that kind is left."""
    ledger = ReceiveLedger()
    quic = client_connection(
        Identity.generate(), EndpointConfig(), "127.0.0.1", SecretSink(), ledger
    )
    assert quic.ledger is ledger
    for gone in ("app_consumed", "app_buffered", "frame_credit", "frame_credit_total"):
        assert not hasattr(quic, gone)
    ledger.set_credit(4, 100)
    ledger.buffered = 50
    ledger.read(4, 30)
    assert (ledger.consumed, ledger.buffered, ledger.frame_credit_total) == ({4: 30}, 20, 100)
    ledger.forget(4)
    assert (ledger.consumed, ledger.frame_credit, ledger.frame_credit_total) == ({}, {}, 0)


def test_each_adapter_offers_its_interface() -> None:
    aioquic = client_connection(Identity.generate(), EndpointConfig(), "127.0.0.1", SecretSink())
    assert isinstance(aioquic, ClientEngine) and isinstance(aioquic, EndpointEngine)
    pytest.importorskip("qh3")
    from burn_remote.protocol.transport._qh3 import qh3_client_connection
    from burn_remote.protocol.transport._qh3_server import qh3_server_connection

    qh3_client = qh3_client_connection(
        Identity.generate(), EndpointConfig(), "127.0.0.1", SecretSink()
    )
    assert isinstance(qh3_client, ClientEngine)
    qh3_server = qh3_server_connection(
        Identity.generate(),
        EndpointConfig(),
        1350,
        original_destination_connection_id=bytes(8),
        retry_source_connection_id=None,
        secrets=SecretSink(),
    )
    assert isinstance(qh3_server, EndpointEngine) and isinstance(qh3_server, QuicEngine)
