"""aioquic's performance overrides (``_quic_fast``) and stock mode: the import-time check
finds a changed private surface and falls back, with a warning, to stock aioquic, as the
environment variable asks for too. (``make test`` runs this suite and the security suite
once more with ``BURN_REMOTE_AIOQUIC_STOCK=1``.)"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from aioquic.quic.connection import QuicConnection
from aioquic.quic.stream import QuicStreamSender
from burn_remote.protocol.transport import _quic_fast


def test_this_aioquic_fits_the_overrides() -> None:
    assert _quic_fast.surface_problems() == []


def test_a_changed_signature_or_a_missing_attribute_is_found(monkeypatch) -> None:
    monkeypatch.setattr(QuicConnection, "_write_stream_frame", lambda self, builder, space: 0)
    monkeypatch.delattr(QuicStreamSender, "get_frame")
    problems = _quic_fast.surface_problems()
    assert any("_write_stream_frame" in p and "max_offset" in p for p in problems), problems
    assert any("QuicStreamSender.get_frame is gone" in p for p in problems), problems


def test_a_mismatch_means_stock_aioquic_and_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.delenv(_quic_fast.STOCK_ENV, raising=False)
    monkeypatch.setattr(_quic_fast, "surface_problems", lambda: ["QuicConnection._x is gone"])
    with caplog.at_level(logging.WARNING, logger="burn_remote.transport"):
        fast, reason = _quic_fast._decide()
    assert not fast and "QuicConnection._x is gone" in reason
    assert "running stock aioquic" in caplog.text


@pytest.mark.parametrize("value, fast", [("1", False), ("0", True)])
def test_the_environment_chooses_stock_mode(value: str, fast: bool) -> None:
    code = (
        "from burn_remote.protocol.transport import _quic, _quic_fast;"
        "print(_quic_fast.FAST, _quic.AioquicConnection.__name__,"
        " _quic.handshake_datagram_size(65000))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"BURN_REMOTE_AIOQUIC_STOCK": value, "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if fast:
        assert out == ["True", "_FastPeerQuicConnection", "1350"]
    else:
        assert out == ["False", "PeerQuicConnection", str(_quic_fast.STOCK_DATAGRAM_SIZE)]
