"""The ring's TCP data plane without servers: real sockets on loopback, the listener's
handshake, the single-thread driver against NumPy's sums (odd sizes, every dtype, sealed and
plain records), and what a wrong key or a tampered record does."""

from __future__ import annotations

import logging
import os
import socket
import threading

import numpy as np
import pytest
from burn_remote.engine.collective import ring
from burn_remote.protocol import messages as m
from burn_remote.server import _ring_data as rd

GROUP = 0x5EED


class Ranks:
    """n ranks' data links: rank r dials rank r + 1's listener (as servers do)."""

    def __init__(self, n: int, plain_ok: bool = True) -> None:
        self.n = n
        self.keys = [os.urandom(32) for _ in range(n)]
        self.ins: dict[int, rd.DataIn] = {}
        arrived = threading.Condition()

        def lookup(r: int):
            def find(gid: int, rank: int):
                if gid != GROUP or rank != (r - 1) % n:
                    return "not this rank's predecessor"

                def deliver(inn: rd.DataIn) -> None:
                    with arrived:
                        self.ins[r] = inn
                        arrived.notify_all()

                return self.keys[r], deliver

            return find

        self.listeners = [rd.RingListener("127.0.0.1", 0, lookup(r), plain_ok) for r in range(n)]
        self.outs = [
            rd.dial(self.listeners[(r + 1) % n].address, GROUP, r, self.keys[(r + 1) % n], plain_ok)
            for r in range(n)
        ]
        with arrived:
            assert arrived.wait_for(lambda: len(self.ins) == n, 10)

    def all_reduce(self, xs: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
        outs: list = [None] * self.n
        errors: list = []

        def run(r: int) -> None:
            x = xs[r].reshape(-1)
            acc = np.empty_like(x)
            head = m.encode(m.RingHeader(0, str(x.dtype), x.size, op))
            try:
                ok = rd.drive_tcp(
                    ring.Plan(r, self.n, x.size, x.itemsize),
                    x,
                    acc,
                    self.outs[r],
                    self.ins[r],
                    head,
                    lambda frame: None if frame == head else pytest.fail("header"),
                    10.0,
                    lambda: False,
                )
                assert ok
                outs[r] = ring.finish(acc, op, self.n).reshape(xs[r].shape)
            except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return outs

    def close(self) -> None:
        for end in [*self.outs, *self.ins.values(), *self.listeners]:
            end.close()


@pytest.mark.parametrize("plain_ok", [True, False], ids=["plain", "sealed"])
@pytest.mark.parametrize("n", [2, 3])
def test_the_driver_matches_numpy(n, plain_ok):
    ranks = Ranks(n, plain_ok)
    try:
        assert all(out.sealed is not plain_ok for out in ranks.outs)  # loopback: plain if allowed
        rng = np.random.default_rng(n)
        cases = [(1, "float32"), (2, "float64"), (1001, "float32"), (2**20 + 7, "float32"),
                 (999, "int64"), (777, "int32"), (65, "float16"), (0, "float32")]  # fmt: skip
        for count, dtype in cases:
            xs = [(rng.standard_normal(count) * 8).astype(dtype) for _ in range(n)]
            got = ranks.all_reduce(xs)
            want = ring.simulate(xs)  # the schedule's own order: bit for bit
            np.testing.assert_allclose(
                got[0].astype(np.float64), np.sum([x.astype(np.float64) for x in xs], axis=0),
                rtol=1e-2 if dtype == "float16" else 1e-6, atol=1e-2 if dtype == "float16" else 1e-6,
            )  # fmt: skip
            for g in got:
                assert g.tobytes() == want[0].tobytes(), (count, dtype)
        means = ranks.all_reduce([np.full((3, 5), float(k)) for k in range(n)], "mean")
        np.testing.assert_array_equal(means[-1], np.full((3, 5), (n - 1) / 2))
    finally:
        ranks.close()


def test_a_tampered_record_fails_authentication():
    ranks = Ranks(2, plain_ok=False)
    try:
        out, inn = ranks.outs[0], ranks.ins[1]
        record = bytearray(
            out.seal_piece(memoryview(np.arange(8, dtype=np.float32).view(np.uint8)))
        )
        record[5] ^= 1
        out.sock.sendall(record)
        with pytest.raises(rd.LinkBroken, match="failed authentication"):
            inn.recv_piece_into(memoryview(bytearray(32)))
    finally:
        ranks.close()


def test_a_dialler_without_the_key_is_refused_and_logged(caplog):
    key = os.urandom(32)
    delivered: list[rd.DataIn] = []

    def lookup(gid: int, rank: int):
        return key, delivered.append

    listener = rd.RingListener("127.0.0.1", 0, lookup)
    try:
        with caplog.at_level(logging.WARNING, logger="burn_remote.server"):
            with pytest.raises((rd.LinkBroken, OSError)):
                rd.dial(listener.address, GROUP, 0, os.urandom(32))
            for _ in range(100):
                if "did not prove the link key" in caplog.text:
                    break
                threading.Event().wait(0.05)
        assert "ring data link from 127.0.0.1" in caplog.text
        assert "the dialler did not prove the link key" in caplog.text
        assert not delivered
        # and the listener keeps serving: the right key gets its link
        assert isinstance(rd.dial(listener.address, GROUP, 0, key), rd.DataOut)
        assert len(delivered) == 1
    finally:
        listener.close()


def test_a_listener_without_the_key_is_refused():
    """A dialler that reaches something else at that address (not the successor: it does
    not hold the key) gets a clear error and falls back."""
    with socket.create_server(("127.0.0.1", 0)) as impostor:
        threading.Thread(
            target=lambda: impostor.accept()[0].sendall(os.urandom(rd.HELLO_RECORD)), daemon=True
        ).start()
        with pytest.raises(rd.LinkBroken, match="did not prove the link key"):
            rd.dial(impostor.getsockname(), GROUP, 0, os.urandom(32))
