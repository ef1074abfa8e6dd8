"""The thread-driven client connection against the trio endpoint, over real UDP on loopback."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import trio
from burn_remote.protocol.transport import (
    BlockingConnection,
    Endpoint,
    EndpointConfig,
    FrameTooLarge,
    Identity,
    PeerRejected,
    TransportError,
)

from .conftest import has_ipv6_loopback, streams_left

pytestmark = pytest.mark.timeout(60)

ENGINE = {"name": "aioquic"}
"""The QUIC engine of the client connections a test makes."""

SERVER_ENGINE = {"name": "aioquic"}
"""The QUIC engine of ``Server`` (tests that take ``server_engine`` run with both)."""


@pytest.fixture(autouse=True, params=["aioquic", "qh3"])
def engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs with each client engine; qh3 is the optional ``qh3`` extra."""
    if request.param == "qh3":
        pytest.importorskip("qh3")
    ENGINE["name"] = request.param
    yield request.param
    ENGINE["name"] = "aioquic"


@pytest.fixture(params=["aioquic", "qh3"])
def server_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Interop on the wire: each client engine against each server engine."""
    if request.param == "qh3":
        pytest.importorskip("qh3")
    SERVER_ENGINE["name"] = request.param
    yield request.param
    SERVER_ENGINE["name"] = "aioquic"


class Server:
    """A trio endpoint in a thread: echoes every frame on its stream; on b"push" it also opens
    a stream of its own with one frame; on b"bye" it closes the connection."""

    def __init__(self, authorized: set, host: str = "127.0.0.1") -> None:
        self.identity = Identity.generate()
        self._host = host
        self.closed: queue.Queue[str] = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=trio.run, args=(self._main, authorized))
        self._thread.start()
        self.address, self._token, self._scope = self._ready.get(timeout=10)

    async def _main(self, authorized: set) -> None:
        config = EndpointConfig(quic_engine=SERVER_ENGINE["name"])
        async with Endpoint.open(
            self.identity, (self._host, 0), config=config, authorized_peers=authorized
        ) as ep:
            with trio.CancelScope() as scope:
                self._ready.put((ep.local_address, trio.lowlevel.current_trio_token(), scope))
                await ep.serve(self._handle)

    async def _handle(self, conn) -> None:  # type: ignore[no-untyped-def]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, conn)
                while True:
                    stream = await conn.accept_stream()
                    nursery.start_soon(self._echo, conn, stream)
        except* TransportError:
            pass  # the connection ended: what the tests look at is in `closed`

    async def _watch(self, conn) -> None:  # type: ignore[no-untyped-def]
        self.closed.put(str(await conn.wait_closed()))

    async def _echo(self, conn, stream) -> None:  # type: ignore[no-untyped-def]
        while (frame := await stream.receive_frame()) is not None:
            if frame == b"bye":
                await conn.close("server says bye")
                return
            await stream.send_frame(frame)
            if frame == b"push":
                pushed = await conn.open_stream()
                await pushed.send_frame(b"pushed")
                await pushed.close()
        await stream.close()

    def stop(self) -> None:
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)


class Received:
    """What the reader thread handed out, for a test to wait on."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[int, bytes | None]] = queue.Queue()
        self.closed: queue.Queue[TransportError] = queue.Queue()

    def next(self) -> tuple[int, bytes | None]:
        return self.frames.get(timeout=20)


def dial(client: Identity, peer, address, **config) -> BlockingConnection:  # type: ignore[no-untyped-def]
    """A connection whose frames and loss nobody watches (for the handshake's outcomes)."""
    return BlockingConnection.connect(
        client,
        peer,
        address,
        on_frame=lambda *_: None,
        on_closed=lambda _: None,
        config=EndpointConfig(quic_engine=ENGINE["name"], **config),
    )


@pytest.fixture
def client() -> Identity:
    return Identity.generate()


@contextmanager
def served(
    client: Identity, host: str = "127.0.0.1"
) -> Iterator[tuple[Server, BlockingConnection, Received]]:
    server = Server({client.peer_id}, host)
    got = Received()
    conn = BlockingConnection.connect(
        client,
        server.identity.peer_id,
        (host, server.address[1]),
        on_frame=lambda sid, frame: got.frames.put((sid, frame)),
        on_closed=got.closed.put,
        config=EndpointConfig(quic_engine=ENGINE["name"]),
    )
    try:
        yield server, conn, got
    finally:
        conn.close(flush_timeout=1)
        server.stop()


def test_frames_of_many_sizes_round_trip_in_order(client: Identity, server_engine: str) -> None:
    rng = np.random.default_rng(0)
    sizes = [0, 1, 65536, 65537, 3 << 20, 10 << 20]  # the last two exceed send_buffer / 2 and 1x
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        frames = [rng.bytes(n) for n in sizes]
        for frame in frames:
            conn.send_frame(sid, frame)
        for frame in frames:
            assert got.next() == (sid, frame)
        assert conn.peer_id is not None


def test_a_frame_written_with_its_length_prefix_goes_as_it_is(client: Identity) -> None:
    """A sender that built its frame with the 4-byte length prefix in front (the remote
    link joins its frames once, headers included) sends that buffer as it is; a prefix
    that is not the frame's length is refused before anything is sent."""
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        for n, wait in ((0, False), (5, False), (65536, True), (300_000, False), (9 << 20, True)):
            frame = np.random.default_rng(n).bytes(n)
            conn.send_frame(sid, bytearray(n.to_bytes(4, "big") + frame), wait=wait, prefixed=True)
            assert got.next() == (sid, frame)
        with pytest.raises(ValueError, match="its own length"):
            conn.send_frame(sid, bytearray(b"\x00\x00\x00\x09abc"), prefixed=True)
        conn.send_frame(sid, b"after")
        assert got.next() == (sid, b"after")


def test_quick_round_trips_need_no_datagram_for_an_ack(
    client: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's reply carries the ACK its request is owed: a qh3 client sends nothing
    more while its last packet is unacknowledged, so a server that held that ACK (to save
    processing it, as a client does) made each request wait for its ACK_DELAY timer and a
    datagram of its own. The server builds no datagram without stream data here."""
    from burn_remote.protocol.transport import _quic_fast
    from burn_remote.protocol.transport._quic import AioquicConnection

    if not _quic_fast.FAST:
        pytest.skip("stock aioquic: its own ACK timer (the overrides are off)")
    bare: list[int] = []
    build = AioquicConnection.datagrams_to_send

    def counting(self: AioquicConnection, now: float) -> list:
        with_data = self.data_queued
        out = build(self, now)
        if out and not with_data and not self._is_client and self.handshake_confirmed:
            bare.append(len(out))
        return out

    monkeypatch.setattr(AioquicConnection, "datagrams_to_send", counting)
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"warm-up")
        assert got.next() == (sid, b"warm-up")
        bare.clear()
        for k in range(30):
            conn.send_frame(sid, b"request %d" % k)
            assert got.next() == (sid, b"request %d" % k)
        assert len(bare) <= 3, f"{len(bare)} ACK-only builds in 30 round trips"


def test_small_frames_sent_without_waiting_arrive_in_order(client: Identity) -> None:
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        for k in range(300):
            conn.send_frame(sid, k.to_bytes(4, "big") * 100, wait=False)
        for k in range(300):
            assert got.next() == (sid, k.to_bytes(4, "big") * 100)


def test_a_stream_the_server_opens_is_delivered_then_ended(
    client: Identity, server_engine: str
) -> None:
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"push")
        seen = [got.next() for _ in range(3)]
        assert (sid, b"push") in seen
        pushed = [item for item in seen if item[0] != sid]
        assert len(pushed) == 2 and pushed[0][1] == b"pushed" and pushed[1][1] is None
        assert pushed[0][0] % 4 == 1  # a server-initiated bidirectional stream


def test_finishing_a_stream_ends_it_on_both_sides(client: Identity) -> None:
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"last")
        conn.finish(sid)
        assert got.next() == (sid, b"last")  # the server's side stays open until it ends
        assert got.next() == (sid, None)


def test_oversize_frame_is_refused_before_sending(client: Identity) -> None:
    server = Server({client.peer_id})
    try:
        conn = dial(
            client, server.identity.peer_id, ("127.0.0.1", server.address[1]), max_frame_size=1000
        )
        sid = conn.open_stream()
        with pytest.raises(FrameTooLarge, match="1001 bytes exceeds 1000"):
            conn.send_frame(sid, b"x" * 1001)
        conn.close()
    finally:
        server.stop()


def test_wrong_peer_id_is_refused_in_the_handshake(client: Identity, server_engine: str) -> None:
    server = Server({client.peer_id})
    try:
        impostor = Identity.generate().peer_id
        with pytest.raises(PeerRejected, match="but .* was dialled"):
            dial(client, impostor, ("127.0.0.1", server.address[1]))
    finally:
        server.stop()


def test_unauthorised_client_is_refused(client: Identity, server_engine: str) -> None:
    server = Server(set())
    try:
        with pytest.raises(PeerRejected, match="not in this server's authorized peers"):
            dial(client, server.identity.peer_id, ("127.0.0.1", server.address[1]))
    finally:
        server.stop()


def test_server_closing_is_reported_with_its_reason(client: Identity, server_engine: str) -> None:
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"bye")
        error = got.closed.get(timeout=20)
        assert "server says bye" in str(error)
        assert conn.is_closed
        with pytest.raises(TransportError):
            conn.send_frame(sid, b"too late")


def test_close_tells_the_server_why(client: Identity, server_engine: str) -> None:
    with served(client) as (server, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"x" * 100_000)
        conn.close("finished here")
        assert "finished here" in server.closed.get(timeout=20)
        assert got.closed.empty()  # closing ourselves is not reported as a loss


def test_no_answer_times_out(client: Identity) -> None:
    import socket

    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(TransportError, match="no handshake within 0.5 s"):
            dial(client, Identity.generate().peer_id, silent.getsockname(), handshake_timeout=0.5)
    finally:
        silent.close()


def test_finished_streams_are_freed_at_our_end(client: Identity, engine: str) -> None:
    """aioquic keeps a stream until both directions ended: a pushed stream must be ended from
    our side too, or every download would leave one behind (and slow every packet built)."""
    if engine != "aioquic":
        pytest.skip("looks into aioquic's stream table")
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        for _ in range(20):
            conn.send_frame(sid, b"push")
        ended = 0
        while ended < 20:
            ended += got.next()[1] is None

        def sync() -> None:
            conn.send_frame(sid, b"sync")
            while got.next() != (sid, b"sync"):  # pushed frames may still be on their way
                pass

        assert streams_left(conn, sid, sync) == [sid]


def test_an_unresolvable_host_is_a_transport_error(client: Identity) -> None:
    with pytest.raises(TransportError, match="cannot resolve 'no-such-host.invalid'"):
        dial(client, Identity.generate().peer_id, ("no-such-host.invalid", 4433))


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_loopback(client: Identity) -> None:
    with served(client, "::1") as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"over v6")
        assert got.next() == (sid, b"over v6")


def test_a_failing_frame_handler_does_not_end_the_connection(
    client: Identity, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server({client.peer_id})
    got = Received()

    def handler(sid: int, frame: bytes | None) -> None:
        if frame == b"boom":
            raise RuntimeError("a bug in the handler")
        got.frames.put((sid, frame))

    try:
        conn = BlockingConnection.connect(
            client,
            server.identity.peer_id,
            ("127.0.0.1", server.address[1]),
            on_frame=handler,
            on_closed=got.closed.put,
            config=EndpointConfig(quic_engine=ENGINE["name"]),
        )
        sid = conn.open_stream()
        conn.send_frame(sid, b"boom")
        conn.send_frame(sid, b"after")
        assert got.next() == (sid, b"after")
        assert "frame handler failed" in caplog.text and got.closed.empty()
        conn.close()
    finally:
        server.stop()


def test_an_endpoint_without_qh3_says_which_package_to_install(
    client: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "burn_remote.protocol.transport._qh3_server", None)

    async def main() -> None:
        async with Endpoint.open(client, config=EndpointConfig(quic_engine="qh3")):
            pass

    with pytest.raises(TransportError, match=r"pip install 'burn-remote\[qh3\]'"):
        trio.run(main)


def test_an_unknown_engine_is_named() -> None:
    with pytest.raises(ValueError, match="quic_engine 'picoquic': expected one of aioquic, qh3"):
        EndpointConfig(quic_engine="picoquic")


def test_a_waiting_caller_reads_its_reply_in_its_own_thread(client: Identity) -> None:
    """``drive_until``: the first call finds the reader thread on the socket, wakes it and
    waits for it to stand aside; then every call reads the reply in the caller's thread.
    Frames arrive in order, and the caller's timeout holds."""
    from burn_remote.protocol.transport import _blocking

    server = Server({client.peer_id})
    seen: list[tuple[bytes | None, int]] = []
    got: queue.Queue[bytes | None] = queue.Queue()

    def on_frame(sid: int, frame: bytes | None) -> None:
        seen.append((frame, threading.get_ident()))
        got.put(frame)

    conn = BlockingConnection.connect(
        client,
        server.identity.peer_id,
        ("127.0.0.1", server.address[1]),
        on_frame=on_frame,
        on_closed=lambda _: None,
        config=EndpointConfig(quic_engine=ENGINE["name"]),
    )
    try:
        sid = conn.open_stream()
        results = []
        for k in range(30):
            frame = b"q%d" % k
            n = len(seen)
            conn.send_frame(sid, frame, wait=False)
            results.append(conn.drive_until(lambda n=n: len(seen) > n, 10.0))
            assert got.get_nowait() == frame
        assert all(r is True for r in results), results
        me = threading.get_ident()
        driven = [frame for frame, tid in seen if tid == me]
        assert len(driven) >= 25, results  # the reader takes over only after a pause
        assert [f for f, _ in seen] == [b"q%d" % k for k in range(30)]
        assert conn.drive_until(lambda: False, 0.05) is False  # nothing came: the timeout
        # Nobody waits now: a frame the server pushes is read by the reader thread once it
        # takes the socket back (within STAND_ASIDE), not left in the socket.
        n = len(seen)
        conn.send_frame(sid, b"push", wait=False)
        assert [got.get(timeout=10) for _ in range(3)].count(b"pushed") == 1
        assert all(tid != me for _, tid in seen[n:])
        assert _blocking.STAND_ASIDE < 0.1
    finally:
        conn.close(flush_timeout=1)
        server.stop()


def test_a_sender_waiting_for_room_calls_the_reader_back(client: Identity) -> None:
    """After a caller drove the connection, the reader stands aside; a large upload that
    must wait for acknowledgements makes it read again at once instead of after
    STAND_ASIDE per window (the upload completes, echoed back whole)."""
    with served(client) as (_, conn, got):
        sid = conn.open_stream()
        conn.send_frame(sid, b"hello")
        assert got.next() == (sid, b"hello")
        conn.send_frame(sid, b"again", wait=False)
        assert conn.drive_until(lambda: not got.frames.empty(), 10.0) in (True, None)
        assert got.next() == (sid, b"again")
        big = np.random.default_rng(1).bytes(24 << 20)  # six times the 4 MiB send buffer
        conn.send_frame(sid, big)
        assert got.next() == (sid, big)


def test_a_caller_expecting_more_replies_leaves_the_socket_to_the_reader(client: Identity) -> None:
    """``linger=False`` (pipelined requests, a device running compiled steps): a caller that
    drove because the reader stood aside hands the socket back at once, and never asks the
    reader to stand aside (None: it waits for the reader's ``on_frame``), so replies
    nobody waits for are read as they arrive."""
    import time

    server = Server({client.peer_id})
    got: queue.Queue[tuple[bytes | None, int]] = queue.Queue()
    conn = BlockingConnection.connect(
        client,
        server.identity.peer_id,
        ("127.0.0.1", server.address[1]),
        on_frame=lambda sid, frame: got.put((frame, threading.get_ident())),
        on_closed=lambda _: None,
        config=EndpointConfig(quic_engine=ENGINE["name"]),
    )
    try:
        sid = conn.open_stream()

        def ask(frame: bytes, linger: bool) -> bool | None:
            conn.send_frame(sid, frame, wait=False)
            result = conn.drive_until(lambda: not got.empty(), 10.0, linger=linger)
            assert got.get(timeout=10)[0] == frame
            return result

        def owner_is(reader: bool) -> None:  # the reader's turn comes after it hands out
            deadline = time.monotonic() + 10
            while (conn._owner is not None) != reader and time.monotonic() < deadline:
                time.sleep(0.001)

        assert ask(b"a", True) is True  # the reader had the socket and stood aside
        assert ask(b"b", True) is True
        assert ask(b"c", False) is True  # drove, then called the reader back
        owner_is(reader=True)
        for k in range(10):
            assert ask(b"d%d" % k, False) is None  # the reader keeps it
        conn.send_frame(sid, b"push", wait=False)  # nobody waits: still read at once
        seen = [got.get(timeout=10) for _ in range(3)]
        assert [f for f, _ in seen].count(b"pushed") == 1
        assert all(tid != threading.get_ident() for _, tid in seen)
    finally:
        conn.close(flush_timeout=1)
        server.stop()
