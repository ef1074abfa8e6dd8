"""The ring's TCP data plane without servers: real sockets on loopback, the listener's
handshake, the single-thread driver against NumPy's sums (odd sizes, every dtype, sealed and
plain records, plain bytes through shared memory), and what a wrong key, a tampered record
or a shared segment that cannot be trusted does."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import numpy as np
import pytest
from burn_remote.engine.collective import ring
from burn_remote.protocol import messages as m
from burn_remote.server import _ring_data as rd
from burn_remote.server import _ring_drive as drive

GROUP = 0x5EED


class Ranks:
    """n ranks' data links: rank r dials rank r + 1's listener (as servers do)."""

    def __init__(
        self, n: int, plain_ok: bool | list[bool] = True, shared_ok: bool | list[bool] = True
    ) -> None:
        """``plain_ok``: for every link, or per link (r -> r + 1), whether both ends allow
        plain records; ``shared_ok`` the same for plain bytes through shared memory."""
        self.n = n
        plain = plain_ok if isinstance(plain_ok, list) else [plain_ok] * n
        shared = shared_ok if isinstance(shared_ok, list) else [shared_ok] * n
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

        self.listeners = [
            rd.RingListener("127.0.0.1", 0, lookup(r), plain[(r - 1) % n], shared[(r - 1) % n])
            for r in range(n)
        ]
        self.outs = [
            rd.dial(
                self.listeners[(r + 1) % n].address, GROUP, r, self.keys[(r + 1) % n], plain[r],
                shared[r],
            )
            for r in range(n)
        ]  # fmt: skip
        with arrived:
            assert arrived.wait_for(lambda: len(self.ins) == n, 10)

    def all_reduce(
        self, xs: list[np.ndarray], op: str = "sum", pieces: list[int] | None = None
    ) -> list[np.ndarray]:
        """Every rank's drive_tcp at once, each with the plan a server gives it
        (``drive.plan_for``), or with rank r's pieces cut at ``pieces[r]`` bytes."""
        outs: list = [None] * self.n
        errors: list = []

        def run(r: int) -> None:
            x = xs[r].reshape(-1)
            acc = np.empty_like(x)
            head = m.encode(m.RingHeader(0, str(x.dtype), x.size, op))
            try:
                plan = drive.plan_for(r, self.n, acc, self.outs[r], self.ins[r])
                if pieces is not None:
                    plan = ring.Plan(r, self.n, x.size, x.itemsize, pieces[r])
                ok = drive.drive_tcp(
                    plan,
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


LINKS = {"shared": (True, True), "plain": (True, False), "sealed": (False, True)}
"""(plain_ok, shared_ok) of every link: what a link between two servers of one host is."""


@pytest.mark.parametrize("links", list(LINKS))
@pytest.mark.parametrize("n", [2, 3])
def test_the_driver_matches_numpy(n, links):
    plain_ok, shared_ok = LINKS[links]
    ranks = Ranks(n, plain_ok, shared_ok)
    try:
        # loopback: plain if allowed, through shared memory if that is allowed too
        assert all(out.sealed is not plain_ok for out in ranks.outs)
        assert all(end.shared is (links == "shared") for end in [*ranks.outs, *ranks.ins.values()])
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


def _check(got: list[np.ndarray], xs: list[np.ndarray]) -> None:
    want = ring.simulate(xs)  # the schedule's own summation order: bit for bit
    for g in got:
        assert g.tobytes() == want[0].tobytes()


def test_plain_links_cut_bigger_pieces_and_a_sealed_link_keeps_the_record_size():
    ranks = Ranks(3, plain_ok=[True, False, True])  # 0 -> 1 plain, 1 -> 2 sealed, 2 -> 0 plain
    try:
        acc = np.empty(8, np.float32)
        plans = [drive.plan_for(r, 3, acc, ranks.outs[r], ranks.ins[r]) for r in range(3)]
        # rank 0's links are both plain; ranks 1 and 2 each have the sealed one
        assert [p.piece_bytes for p in plans] == [drive.PLAIN_PIECE_BYTES] + [ring.PIECE_BYTES] * 2
        assert drive.PLAIN_PIECE_BYTES > ring.PIECE_BYTES
    finally:
        ranks.close()
    all_plain = Ranks(2)
    try:
        acc = np.empty(8, np.float32)
        assert drive.plan_for(0, 2, acc, all_plain.outs[0], all_plain.ins[0]).piece_bytes == (
            drive.PLAIN_PIECE_BYTES
        )
    finally:
        all_plain.close()


@pytest.mark.parametrize("n", [2, 3])
def test_a_ring_of_shared_plain_and_sealed_links_matches_numpy(n):
    """Ranks with big plain pieces beside ranks with sealed records, on tensors of several
    plain pieces per chunk (and the last piece short); link 0 -> 1 goes through shared
    memory, the last one (3 ranks) is plain TCP."""
    ranks = Ranks(n, plain_ok=[r != 1 for r in range(n)], shared_ok=[r == 0 for r in range(n)])
    try:
        assert ranks.outs[0].shared and ranks.outs[1].sealed
        assert n == 2 or not (ranks.outs[2].shared or ranks.outs[2].sealed)
        rng = np.random.default_rng(7)
        count = (n * drive.PLAIN_PIECE_BYTES * 5) // (2 * 4) + 13  # 2.5 plain pieces a chunk
        for dtype in ("float32", "int64"):
            xs = [(rng.standard_normal(count) * 8).astype(dtype) for _ in range(n)]
            _check(ranks.all_reduce(xs), xs)
    finally:
        ranks.close()


@pytest.mark.parametrize("shared_ok", [True, False], ids=["shared", "plain"])
def test_ends_of_a_plain_link_may_cut_pieces_differently(shared_ok):
    """A plain link is one byte stream (through shared memory too): each rank's pieces are
    its own choice (here every rank a different size, none dividing the chunks evenly),
    and all agree bit for bit."""
    ranks = Ranks(3, shared_ok=shared_ok)
    try:
        rng = np.random.default_rng(3)
        xs = [rng.standard_normal(3 * 2**20 + 5).astype(np.float32) for _ in range(3)]
        sizes = [ring.PIECE_BYTES, 3 * 2**18 + 4, drive.PLAIN_PIECE_BYTES]
        _check(ranks.all_reduce(xs, pieces=sizes), xs)
        _check(ranks.all_reduce(xs, pieces=sizes[::-1]), xs)
    finally:
        ranks.close()


def test_a_rank_waiting_for_a_piece_counts_what_arrived_and_stops_when_told():
    """The waiting receive (MSG_WAITALL) of a piece that arrives only in part: within
    RECV_WAIT the part is counted in ``received`` (the neighbour's cut-link watchdog reads
    it), and the group's failure ends the wait."""
    ranks = Ranks(2)
    stop = threading.Event()
    result: list = []
    x = np.ones(2048, np.float32)  # chunks of 4 KiB: rank 0's sends fit in the socket

    def run() -> None:
        try:
            result.append(
                drive.drive_tcp(
                    drive.plan_for(0, 2, x, ranks.outs[0], ranks.ins[0]),
                    x,
                    np.empty_like(x),
                    ranks.outs[0],
                    ranks.ins[0],
                    b"head",
                    lambda frame: None,
                    10.0,
                    stop.is_set,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - checked on the test's thread
            result.append(exc)

    try:
        ranks.outs[1].send_header(b"head")  # rank 1's header, then 1 KiB of its 4 KiB piece
        ranks.outs[1].sock.sendall(bytes(1024))
        worker = threading.Thread(target=run)
        worker.start()
        want = rd.LENGTH.size + len(b"head") + 1024
        for _ in range(100):
            if ranks.ins[0].received == want:
                break
            threading.Event().wait(drive.RECV_WAIT / 4)
        assert ranks.ins[0].received == want
        assert worker.is_alive() and not result
        # nothing more comes: the wait counts from the last byte, across the timed-out
        # receives (the cut-link watchdog judges a receiver waiting over LINK_BEAT by it)
        threading.Event().wait(4 * drive.RECV_WAIT)
        since = ranks.ins[0].waiting_since
        assert since is not None and time.monotonic() - since >= 3 * drive.RECV_WAIT
        stop.set()
        worker.join(4 * drive.RECV_WAIT + 2)
        assert not worker.is_alive()
        assert isinstance(result[0], rd.LinkBroken) and "the group failed" in str(result[0])
    finally:
        stop.set()
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


def test_a_shared_link_wraps_its_buffer():
    """A 2-rank all-reduce moving more than the shared buffer holds (each rank sends 1.5x
    its size): the dialler waits for the successor to free room, and the bytes that wrap
    around the buffer's end arrive in order."""
    ranks = Ranks(2)
    try:
        assert all(out.shared for out in ranks.outs)
        count = 3 * m.RING_SHARED_BYTES // 4 + 3  # per rank: 3/4 of the buffer, plus 3 floats
        rng = np.random.default_rng(5)
        for _ in range(2):  # the second starts part-way round the buffer
            xs = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
            _check(ranks.all_reduce(xs), xs)
        assert ranks.outs[0].sock.written > 2 * m.RING_SHARED_BYTES
    finally:
        ranks.close()


def _offer(monkeypatch, make) -> None:  # noqa: ANN001
    """Make the dialler offer ``make()``'s (fd, nonce) instead of its own segment's."""
    real = rd.shm.trailer

    def trailer(seg):  # noqa: ANN001, ANN202
        fd, nonce = make(seg)
        return rd.shm.TRAILER.pack(os.getpid(), fd, nonce) if fd is not None else real(seg)

    monkeypatch.setattr(rd.shm, "trailer", trailer)


_OPENED: list[int] = []
"""Descriptors the offers below open (closed by the test)."""


def _unsealed_memfd() -> int:
    fd = os.memfd_create("unsealed")
    os.ftruncate(fd, rd.shm.SEGMENT_BYTES)
    _OPENED.append(fd)
    return fd


def _a_file() -> int:
    _OPENED.append(os.open(os.devnull, os.O_RDONLY))
    return _OPENED[-1]


@pytest.mark.parametrize(
    ("case", "make", "why"),
    [
        ("nonce", lambda seg: (seg.fd, os.urandom(16)), "does not hold the dialler's nonce"),
        ("unsealed", lambda seg: (_unsealed_memfd(), seg.nonce), "not sealed against resizing"),
        ("a file", lambda seg: (_a_file(), seg.nonce), "is not a memfd"),
        ("no fd", lambda seg: (987654, seg.nonce), "cannot open"),
    ],
)
def test_a_segment_the_successor_cannot_trust_leaves_the_link_on_plain_tcp(
    monkeypatch, caplog, case, make, why
):
    """The successor maps only the dialler's sealed memfd of the right size holding the
    nonce of its authenticated hello; anything else (another nonce, an unsealed memfd, a
    file that is no memfd, a descriptor that does not exist) answers plain TCP, logged, and
    the link works."""
    _offer(monkeypatch, make)
    with caplog.at_level(logging.INFO, logger="burn_remote.server"):
        ranks = Ranks(2)
    try:
        assert not any(end.shared or end.sealed for end in [*ranks.outs, *ranks.ins.values()])
        assert "plain TCP, not shared memory" in caplog.text and why in caplog.text, case
        xs = [np.arange(1001, dtype=np.float32) * k for k in (1, 2)]
        _check(ranks.all_reduce(xs), xs)
    finally:
        ranks.close()
        while _OPENED:
            os.close(_OPENED.pop())


def test_neither_end_can_resize_a_shared_segment():
    """The dialler seals its memfd before offering it: a successor (or anyone who opens
    it) cannot shrink it under the dialler's mapping, which would make its reads fault."""
    seg = rd.shm.make_segment()
    assert seg is not None
    try:
        opened, why = rd.shm.open_segment(rd.shm.trailer(seg))
        assert opened is not None, why
        fd = os.open(f"/proc/self/fd/{seg.fd}", os.O_RDWR)
        try:
            for size in (0, rd.shm.SEGMENT_BYTES + 4096):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, size)
        finally:
            os.close(fd)
    finally:
        seg.close_fd()


def test_counts_that_overrun_the_shared_buffer_break_the_link():
    """A neighbour's counts are checked against the buffer: announcing more than it holds,
    or freeing more than was written, breaks the link naming that side."""
    seg = rd.shm.make_segment()
    assert seg is not None
    a, b = socket.socketpair()
    try:
        dialler, successor = rd.shm.SharedPipe(a, seg), rd.shm.SharedPipe(b, seg)
        inn = rd.DataIn(successor, None, sealed=False)  # type: ignore[arg-type]
        out = rd.DataOut(dialler, None, sealed=False)  # type: ignore[arg-type]
        a.sendall(rd.shm.COUNT.pack(m.RING_SHARED_BYTES + 1))
        with pytest.raises(rd.LinkBroken, match="announced 16777217 bytes in a shared buffer"):
            drive._recv_some(inn, memoryview(bytearray(8)), 0)
        out.send_piece(memoryview(bytes(8)))
        b.sendall(rd.shm.COUNT.pack(9))  # frees 9 of the 8 bytes written
        with pytest.raises(rd.LinkBroken, match="freed 1 bytes more of the shared buffer"):
            drive._send_some(out, memoryview(bytes(8)))
    finally:
        a.close()
        b.close()
        seg.close_fd()


def test_a_shared_link_carries_the_stream_section_12_describes():
    """What the dialler puts in the shared buffer, read back by the spec's rules: the
    header's u32 length and frame, zero bytes up to a multiple of 8 (RING_SHARED_ALIGN),
    then the pieces it sends at step 0 (its own input's chunk ``rank``), in order; the
    second all-reduce's header follows the first's pieces, padded from there."""
    ranks = Ranks(2)
    try:
        xs = [np.arange(1001, dtype=np.float32) + 10 * r for r in range(2)]
        ranks.all_reduce(xs)
        ring_bytes = bytes(ranks.outs[0].sock.ring[: 2 * 4096])
        head = m.encode(m.RingHeader(0, "float32", 1001, "sum"))
        assert ring_bytes[:4] == len(head).to_bytes(4, "big")
        assert ring_bytes[4 : 4 + len(head)] == head
        start = 4 + len(head) + (-(4 + len(head)) % 8)
        assert set(ring_bytes[4 + len(head) : start]) <= {0} and start % 8 == 0
        lo, hi = ring.chunk_bounds(1001, 2)[0]  # rank 0 sends its chunk 0 at step 0
        assert ring_bytes[start : start + (hi - lo) * 4] == xs[0][lo:hi].tobytes()
        # step 1 (all-gather) sends the summed chunk 1 it received; then the next header
        lo1, hi1 = ring.chunk_bounds(1001, 2)[1]
        after = start + (hi - lo) * 4 + (hi1 - lo1) * 4
        assert ranks.outs[0].sock.written == after
        ranks.all_reduce(xs)
        assert ring_bytes[:after] == bytes(ranks.outs[0].sock.ring[:after])  # not rewritten
        nxt = bytes(ranks.outs[0].sock.ring[after : after + 4 + len(head) + 8])
        assert nxt[:4] == len(head).to_bytes(4, "big") and nxt[4 : 4 + len(head)] == head
        pad = -(after + 4 + len(head)) % 8
        assert nxt[4 + len(head) : 4 + len(head) + pad] == bytes(pad)
    finally:
        ranks.close()
