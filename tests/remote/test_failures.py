"""What a client sees when things go wrong, and how soon: calls after close() fail at once; a
killed server is reported well within the idle timeout, saying what happened; after a
restart, one clear error, and a fresh RemoteDevice(target) connects again.

The bounds are generous (the failures they guard against took 150 s and 300 s)."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from burn_remote import RemoteDevice, RemoteError
from burn_remote.server.testing import start_server

LOWEST_FIXED_PORT = 10_000
"""Ports below this are left alone (services the machine may run)."""


def _restartable_port() -> int:
    """A free UDP port a server can bind, be stopped, and bind again.

    Not one from ``bind(0)``: those come from the kernel's ephemeral range, which every other
    socket binding port 0 on the machine (other test runs) draws from, and one took the port
    in the seconds between our two servers (the restart then failed: "address in use").
    Below that range only explicit binds take a port; a random pick avoids a twin test."""
    low = LOWEST_FIXED_PORT
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default range starts here; elsewhere, the same idea
    for _ in range(100):
        port = random.randrange(LOWEST_FIXED_PORT, max(low, LOWEST_FIXED_PORT + 1000))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free UDP port below the ephemeral range")


def _timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as info:
        fn()
    return time.monotonic() - t0, str(info.value)


def test_calls_after_close_fail_at_once(server) -> None:  # type: ignore[no-untyped-def]
    dev = RemoteDevice(server.target)
    x = dev.tensor(np.ones(4, np.float32))
    assert x.sum().item() == 4.0
    dev.close()
    took, text = _timed(lambda: x.sum().item())
    assert took < 2.0 and "closed" in text
    took, text = _timed(lambda: dev.tensor(np.ones(2, np.float32)).numpy())
    assert took < 2.0 and "closed" in text
    again = RemoteDevice(server.target)  # the same target: a fresh, working device
    assert again is not dev
    assert again.tensor(np.ones(3, np.float32)).sum().item() == 3.0
    again.close()


def test_a_killed_server_is_reported_within_the_idle_timeout(tmp_path: Path) -> None:
    server = start_server(tmp_path / "s", "--idle-timeout", "10")
    try:
        dev = RemoteDevice(server.target)
        x = dev.tensor(np.ones(4, np.float32))
        assert x.sum().item() == 4.0
        server.proc.kill()
        server.proc.wait()
        took, text = _timed(lambda: (x * 2).sum().item())
    finally:
        server.stop()
    assert took < 10.0, f"reported after {took:.1f} s: {text}"
    assert "is gone" in text and "nothing listens there" in text, text
    assert server.address.split(":")[-1] in text
    assert "within 3 s" not in text


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_after_a_restart_one_clear_error_then_a_fresh_device_works(tmp_path: Path, how) -> None:
    """The client notices the loss when the server says goodbye (SIGTERM) or when its host
    refuses a packet (SIGKILL); it tries to resume and finds nothing there, or (if the new
    server is up by then) a server that no longer has the session. Either way: one clear
    error, then a fresh device for the same target works."""
    port = _restartable_port()
    data = tmp_path / "s"
    args = ("--idle-timeout", "2", "--listen", f"127.0.0.1:{port}")
    first = start_server(data, *args)
    try:
        dev = RemoteDevice(first.target)
        x = dev.tensor(np.ones(4, np.float32))
        assert x.sum().item() == 4.0
        if how == "sigkill":
            first.proc.kill()
    finally:
        first.stop()
    second = start_server(data, *args)  # same key and port: the same target
    try:
        assert second.target == first.target
        took, text = _timed(lambda: (x * 2).sum().item())
        assert took < 30.0, f"reported after {took:.1f} s"
        gone = "is gone" in text and "nothing listens there" in text
        expired = "no longer has this session" in text and "restarted" in text
        assert gone or expired, text
        assert text.count("session expired") <= 1, text
        took2, text2 = _timed(lambda: (x * 3).sum().item())  # the same error, at once
        assert took2 < 2.0 and text2 == text
        fresh = RemoteDevice(first.target)
        assert fresh is not dev
        assert fresh.tensor(np.ones(3, np.float32)).sum().item() == 3.0
        fresh.close()
    finally:
        second.stop()
