"""Frame streams over real UDP on loopback: framing, bulk integrity, back-pressure, timeouts."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tracemalloc

import pytest
import trio
from burn_remote.protocol.transport import EndpointConfig, FrameTooLarge, TransportError

from .conftest import serving, trio_test

# Tests that take ``server_engine`` run against an aioquic and a qh3 server.

MiB = 1024 * 1024


async def digest_each_stream(conn):
    """Server: for every incoming stream, reply with sha256 and byte count of its frames."""
    async with trio.open_nursery() as nursery:
        while True:
            try:
                s = await conn.accept_stream()
            except TransportError:
                return
            nursery.start_soon(_digest, s)


async def _digest(s):
    h = hashlib.sha256()
    n = 0
    while (frame := await s.receive_frame()) is not None:
        h.update(frame)
        n += len(frame)
    await s.send_frame(h.digest() + n.to_bytes(8, "big"))
    await s.close()


async def upload(conn, payload: memoryview, frame_size: int) -> bytes:
    s = await conn.open_stream()
    for i in range(0, len(payload), frame_size):
        await s.send_frame(payload[i : i + frame_size])
    await s.close()
    reply = await s.receive_frame()
    assert await s.receive_frame() is None
    return reply


@trio_test
async def test_frames_of_many_sizes_round_trip(server_engine):
    async def echo(conn):
        s = await conn.accept_stream()
        while (frame := await s.receive_frame()) is not None:
            await s.send_frame(frame)
        await s.close()

    sizes = [0, 1, 3, 4, 5, 1000, 65535, 65536, 65537, 300_000, 3 * MiB]
    async with serving(echo) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        for size in sizes:
            data = os.urandom(size)
            await s.send_frame(data)
            assert await s.receive_frame() == data
        await s.close()
        assert await s.receive_frame() is None


@trio_test
async def test_frames_larger_than_the_receive_window_arrive_whole(server_engine):
    async def echo(conn):
        s = await conn.accept_stream()
        while (frame := await s.receive_frame()) is not None:
            await s.send_frame(frame)
        await s.close()

    small = EndpointConfig(stream_window=64 * 1024, connection_window=128 * 1024)
    async with serving(echo, server_config=small, client_config=small) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        data = os.urandom(8 * MiB)
        with trio.fail_after(60):
            for _ in range(2):
                await s.send_frame(data)
                assert await s.receive_frame() == data


@trio_test
async def test_oversize_frames_are_refused_on_both_sides(server_engine):
    got = []

    async def reader(conn):
        s = await conn.accept_stream()
        try:
            await s.receive_frame()
        except FrameTooLarge as exc:
            got.append(str(exc))

    small = EndpointConfig(max_frame_size=1000)
    big = EndpointConfig(max_frame_size=10_000)
    async with serving(reader, server_config=small, client_config=big) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        with pytest.raises(FrameTooLarge, match="max_frame_size"):
            await s.send_frame(bytes(10_001))  # refused locally, nothing written
        await s.send_frame(bytes(5000))  # allowed here, too large for the server
        with trio.fail_after(10):
            while not got:
                await trio.sleep(0.01)
    assert "5000" in got[0]


@trio_test
async def test_256_mib_on_one_stream_and_over_8_streams(server_engine):
    payload = memoryview(os.urandom(256 * MiB))
    expected = hashlib.sha256(payload).digest()
    async with serving(digest_each_stream) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        with trio.fail_after(300):
            reply = await upload(conn, payload, 4 * MiB)
        assert reply == expected + len(payload).to_bytes(8, "big")

        part = len(payload) // 8
        replies = {}

        async def one(i):
            replies[i] = await upload(conn, payload[i * part : (i + 1) * part], MiB)

        with trio.fail_after(300):
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, i)
        for i in range(8):
            chunk = payload[i * part : (i + 1) * part]
            assert replies[i] == hashlib.sha256(chunk).digest() + part.to_bytes(8, "big")
        await conn.close()


@trio_test
async def test_writer_memory_bounded_when_reader_stalls():
    """A reader that never reads (aioquic server): the writer blocks; neither side's buffers
    grow past the configured send buffer and receive window, whatever the writer offers."""
    accepted = trio.Event()
    holder = []

    async def stall(conn):
        holder.append(await conn.accept_stream())
        accepted.set()
        await trio.sleep_forever()

    config = EndpointConfig(send_buffer=MiB, stream_window=2 * MiB, connection_window=4 * MiB)
    frame = bytes(MiB)
    async with serving(stall, server_config=config, client_config=config) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            sent = 0
            with trio.move_on_after(2):
                for _ in range(256):  # offers 256 MiB
                    await s.send_frame(frame)
                    sent += 1
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await accepted.wait()
        server_conn = next(iter(srv.connections))
        assert sent < 16  # the writer was held back
        assert conn._quic.sender_buffered(s.stream_id) <= config.send_buffer
        assert server_conn._ledger.buffered <= config.stream_window + 64 * 1024
        # both endpoints run in this process: the peak covers writer and reader together
        assert peak - base < config.send_buffer + config.stream_window + 8 * MiB


@trio_test
async def test_a_qh3_server_closes_a_peer_that_floods_an_unread_stream():
    """qh3's core grants credit as it delivers, so a reader that never reads cannot hold a
    writer back: once more than ``UNREAD_LIMIT_FACTOR`` connection windows are delivered
    and unread, the server closes the connection (FLOW_CONTROL_ERROR) with a reason naming
    the figures, and what it buffered stays within that limit plus a datagram's worth."""
    pytest.importorskip("qh3")
    from burn_remote.protocol.transport._qh3_server import UNREAD_LIMIT_FACTOR

    accepted = trio.Event()
    holder = []

    async def stall(conn):
        holder.append(await conn.accept_stream())
        accepted.set()
        await trio.sleep_forever()

    window = 4 * MiB
    server = EndpointConfig(connection_window=window, stream_window=window, quic_engine="qh3")
    async with serving(stall, server_config=server) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        await s.send_frame(b"first")  # whole: the handler accepts the stream, never reads
        await accepted.wait()
        server_conn = next(iter(srv.connections))
        most = 0
        with trio.fail_after(60), pytest.raises(TransportError) as info:
            for _ in range(256):  # offers 256 MiB, far past the limit
                await s.send_frame(bytes(MiB))
                most = max(most, server_conn._ledger.buffered)
        limit = UNREAD_LIMIT_FACTOR * window
        assert "has not read" in str(info.value) and str(limit) in str(info.value)
        assert server_conn.is_closed and "has not read" in str(server_conn.close_reason)
        assert most <= limit


@trio_test
async def test_a_qh3_server_lets_a_reading_peer_send_far_past_the_limit():
    """Small windows (a 2 MiB unread limit) and a reader that reads: 24 MiB goes through."""
    pytest.importorskip("qh3")
    server = EndpointConfig(connection_window=MiB, stream_window=MiB, quic_engine="qh3")
    payload = memoryview(os.urandom(24 * MiB))
    async with serving(digest_each_stream, server_config=server) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        with trio.fail_after(120):
            reply = await upload(conn, payload, MiB)
    assert reply == hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "big")


@trio_test
async def test_idle_timeout_closes_a_silent_connection(server_engine):
    async def idle(conn):
        await trio.sleep_forever()

    quiet = EndpointConfig(idle_timeout=0.5, keepalive_interval=None)
    async with serving(idle, server_config=quiet, client_config=quiet) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        with trio.fail_after(30):
            reason = await conn.wait_closed()
        assert "Idle timeout" in str(reason)
        with pytest.raises(TransportError):
            await conn.open_stream()


@trio_test
async def test_keepalive_holds_an_idle_connection_open(server_engine):
    async def echo(conn):
        s = await conn.accept_stream()
        while (frame := await s.receive_frame()) is not None:
            await s.send_frame(frame)

    lively = EndpointConfig(idle_timeout=1.0, keepalive_interval=0.1)
    async with serving(echo, server_config=lively, client_config=lively) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        await trio.sleep(3.5)  # several idle timeouts of silence from the application
        assert not conn.is_closed
        s = await conn.open_stream()
        await s.send_frame(b"still here")
        assert await s.receive_frame() == b"still here"


@trio_test
async def test_server_keeps_serving_during_garbage_flood(server_engine):
    stop = trio.Event()

    async def flood(addr):
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
        fake_initial = bytes([0xC3]) + (1).to_bytes(4, "big") + b"\x08" + os.urandom(8)
        fake_initial += b"\x08" + os.urandom(8) + b"\x00\x44\xd0"
        n = 0
        while not stop.is_set():
            kind = n % 4
            if kind == 0:
                data = os.urandom(1 + n % 1400)
            elif kind == 1:
                data = bytes([0x40]) + os.urandom(40)  # short header, unknown cid
            elif kind == 2:
                data = (fake_initial + os.urandom(1200))[:1250]  # Initial that won't decrypt
            else:
                data = bytes([0xFF]) + os.urandom(3)
            with contextlib.suppress(OSError):
                await sock.sendto(data, addr)
            n += 1
            if n % 64 == 0:
                await trio.sleep(0)
        sock.close()

    payload = memoryview(os.urandom(16 * MiB))
    async with serving(digest_each_stream) as (srv, cli):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood, srv.local_address)
            nursery.start_soon(flood, srv.local_address)
            with trio.fail_after(120):
                conn = await cli.connect(srv.peer_id, srv.local_address)
                reply = await upload(conn, payload, MiB)
            stop.set()
        assert reply == hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "big")
        assert len(srv.connections) == 1  # garbage created no connections


@trio_test
async def test_peer_cannot_open_more_than_max_streams():
    accepted = []

    async def hoard(conn):
        while True:
            accepted.append(await conn.accept_stream())  # never finishes any of them

    limited = EndpointConfig(max_streams=4)
    async with serving(hoard, server_config=limited) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        for _ in range(10):
            s = await conn.open_stream()
            await s.send_frame(b"x")  # buffered locally when the stream is blocked
        await trio.sleep(0.5)
        assert len(accepted) == 4
        server_conn = next(iter(srv.connections))
        assert server_conn._quic._local_max_streams_bidi.value == 4


@trio_test
async def test_connection_ids_are_tracked_and_released(server_engine):
    async def handler(conn):
        await trio.sleep_forever()

    async with serving(handler) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        with trio.fail_after(10):
            while len(srv._cids) < 3:  # the original id, the first one, and issued ones
                await trio.sleep(0.01)
        server_conn = next(iter(srv.connections))
        assert set(srv._cids) == server_conn._cids
        await conn.close("bye")
        with trio.fail_after(30):
            while srv._cids or cli._cids:
                await trio.sleep(0.01)
        assert not srv.connections and not cli.connections


@trio_test
async def test_cancelled_send_resets_the_stream_instead_of_corrupting_it():
    # aioquic server only: the send must block on a reader that does not read, and a qh3
    # server has no such back-pressure (its bound is the unread limit, tested above).
    errors = []
    go = trio.Event()

    async def reader(conn):
        s = await conn.accept_stream()
        await go.wait()  # read only after the writer gave up
        try:
            while await s.receive_frame() is not None:
                pass
        except TransportError as exc:
            errors.append(str(exc))

    stalled = EndpointConfig(send_buffer=64 * 1024, stream_window=128 * 1024)
    async with serving(reader, server_config=stalled, client_config=stalled) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        with trio.move_on_after(0.2) as scope:
            await s.send_frame(bytes(8 * MiB))  # cannot finish: nobody reads yet
        assert scope.cancelled_caught
        with pytest.raises(TransportError):
            await s.send_frame(b"after")
        go.set()
        with trio.fail_after(10):
            while not errors:
                await trio.sleep(0.01)
    assert "reset" in errors[0]


@trio_test
async def test_receive_frame_is_always_a_checkpoint():
    """Once, whether the frame was buffered already or had to be waited for (parking is the
    checkpoint then): trio's rule that lets a loop of reads be cancelled and be fair."""
    from trio.testing import assert_checkpoints

    async def echo_twice(conn):
        s = await conn.accept_stream()
        frame = await s.receive_frame()
        await s.send_frame(frame)
        await s.send_frame(frame)

    async with serving(echo_twice) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        await s.send_frame(b"ping")
        with assert_checkpoints():
            assert await s.receive_frame() == b"ping"  # waited for
        while not s._buffered:
            await trio.sleep(0.001)
        with assert_checkpoints():
            assert await s.receive_frame() == b"ping"  # already there


@trio_test
async def test_on_frame_answers_on_the_receive_loop_while_a_reader_waits(server_engine):
    """A frame that arrives whole while the reader is parked goes to ``on_frame`` (on the
    receive loop, no task switch); its reply leaves with the loop's transmit. A frame it
    declines, and frames that arrive while the reader is not parked, reach the reader, in
    order."""
    taken: list[bytes] = []
    ready = trio.Event()
    stream_box: list = []

    async def handler(conn):
        s = await conn.accept_stream()
        stream_box.append(s)

        def on_frame(frame: bytes) -> bool:
            if frame.startswith(b"pass"):
                return False
            taken.append(frame)
            assert s.send_frame_nowait(b"fast:" + frame)
            return True

        first = await s.receive_frame()  # the first frame is read before on_frame is set
        s.on_frame = on_frame
        await s.send_frame(b"slow:" + first)
        ready.set()
        while (frame := await s.receive_frame()) is not None:
            await s.send_frame(b"slow:" + frame)
        await s.close()

    async with serving(handler) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        await s.send_frame(b"first")
        assert await s.receive_frame() == b"slow:first"
        await ready.wait()
        for k in range(20):
            await s.send_frame(b"q%d" % k)
            assert await s.receive_frame() == b"fast:q%d" % k
        await s.send_frame(b"pass me on")
        assert await s.receive_frame() == b"slow:pass me on"
        assert taken == [b"q%d" % k for k in range(20)]
        # frames sent back to back may arrive in one chunk: the reader gets those
        for k in range(5):
            await s.send_frame(b"burst%d" % k)
        got = [await s.receive_frame() for _ in range(5)]
        assert [g.split(b":", 1)[1] for g in got] == [b"burst%d" % k for k in range(5)]
        await s.close()
        assert await s.receive_frame() is None


@trio_test
async def test_send_frame_nowait_refuses_what_the_send_buffer_cannot_take(server_engine):
    from burn_remote.protocol.transport._streams import SMALL_FRAME

    box: list = []
    done = trio.Event()

    async def handler(conn):
        s = await conn.accept_stream()
        await s.receive_frame()
        box.append(s)
        await done.wait()

    small = EndpointConfig(send_buffer=1000)
    async with serving(handler, server_config=small) as (srv, cli):
        conn = await cli.connect(srv.peer_id, srv.local_address)
        s = await conn.open_stream()
        await s.send_frame(b"hi")
        while not box:
            await trio.sleep(0.01)
        server_stream = box[0]
        assert not server_stream.send_frame_nowait(bytes(SMALL_FRAME + 1))  # never large ones
        assert server_stream.send_frame_nowait(bytes(600))
        assert not server_stream.send_frame_nowait(bytes(600))  # 1000-byte buffer: no room
        assert await s.receive_frame() == bytes(600)
        for _ in range(200):  # once acknowledged, there is room again
            if server_stream.send_frame_nowait(bytes(600)):
                break
            await trio.sleep(0.01)
        else:
            raise AssertionError("the send buffer never drained")
        assert await s.receive_frame() == bytes(600)
        done.set()


@trio_test
async def test_a_qh3_failure_ends_that_connection_and_the_server_goes_on(monkeypatch):
    """qh3 raising inside its core (a bug of its, or one a peer found) closes only the
    connection it happened on, with INTERNAL_ERROR and the reason; the receive loop lives."""
    pytest.importorskip("qh3")
    from burn_remote.protocol.transport import _qh3_server

    async def echo(conn):
        s = await conn.accept_stream()
        while (frame := await s.receive_frame()) is not None:
            await s.send_frame(frame)

    server = EndpointConfig(quic_engine="qh3")
    async with serving(echo, server_config=server) as (srv, cli):
        first = await cli.connect(srv.peer_id, srv.local_address)
        s = await first.open_stream()
        await s.send_frame(b"before")
        assert await s.receive_frame() == b"before"
        original = _qh3_server._ValidatedQuic.receive_many_datagrams
        victim = next(iter(srv.connections))._quic._quic

        def boom(self, *args):
            if self is victim:
                raise RuntimeError("packet builder capacity exhausted")
            return original(self, *args)

        monkeypatch.setattr(_qh3_server._ValidatedQuic, "receive_many_datagrams", boom)
        await s.send_frame(b"trigger")
        with trio.fail_after(10):
            reason = await first.wait_closed()
        assert "server QUIC error: packet builder capacity exhausted" in str(reason)
        second = await cli.connect(srv.peer_id, srv.local_address)
        s2 = await second.open_stream()
        await s2.send_frame(b"still serving")
        assert await s2.receive_frame() == b"still serving"
