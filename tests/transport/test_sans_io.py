"""The sans-I/O connection in memory: two ``AioquicConnection`` objects, datagrams moved by
hand with a round cap (aioquic's own test style). No sockets, no event loop, fake time."""

from __future__ import annotations

import pytest
from aioquic.quic import events
from burn_remote.protocol.transport import EndpointConfig, Identity
from burn_remote.protocol.transport._auth import AuthFailure, PeerAuth, SecretSink
from burn_remote.protocol.transport._config import quic_configuration
from burn_remote.protocol.transport._quic import AioquicConnection
from burn_remote.protocol.transport._quic_fast import FAST

CLIENT_ADDR = ("1.2.3.4", 1234)
SERVER_ADDR = ("2.3.4.5", 4433)


fast_only = pytest.mark.skipif(not FAST, reason="aioquic's performance overrides are off")
"""For tests of ``_quic_fast``'s overrides (ACK policy, builds): stock aioquic has its own."""


def make_pair(config=None, sinks=None):
    """A client and a server connection; ``sinks`` (client's, server's) get their key logs."""
    config = config or EndpointConfig()
    server_id, client_id = Identity.generate(), Identity.generate()
    client_sink, server_sink = sinks or (SecretSink(), SecretSink())
    client = AioquicConnection(
        configuration=quic_configuration(
            client_id, is_client=True, config=config, datagram_size=1452, secrets=client_sink
        ),
    )
    client.connect(SERVER_ADDR, now=Clock.now)
    server = AioquicConnection(
        configuration=quic_configuration(
            server_id, is_client=False, config=config, datagram_size=1452, secrets=server_sink
        ),
        original_destination_connection_id=client.original_destination_connection_id,
    )
    return client, server, client_id, server_id


def roundtrip(a, b, now, drop=lambda i: False):
    """Move every pending datagram a -> b; returns how many moved."""
    if not a._network_paths:  # a server that has heard nothing yet has nowhere to send
        return 0
    n = 0
    for i, (data, _addr) in enumerate(a.datagrams_to_send(now)):
        if not drop(i):
            b.receive_datagram(data, CLIENT_ADDR if a._is_client else SERVER_ADDR, now)
        n += 1
    return n


class Clock:
    """Fake time shared by both ends; each round moves it 10 ms (pacing needs time)."""

    now = 0.0


def exchange(client, server, rounds=50, now=None, drop=lambda i: False, on_round=None):
    """Move datagrams both ways, firing due timers, until nothing moves (capped)."""
    if now is not None:
        Clock.now = max(Clock.now, now)
    for _ in range(rounds):
        Clock.now += 0.01
        for conn in (client, server):
            timer = conn.get_timer() if conn._network_paths else None
            if timer is not None and timer <= Clock.now:
                conn.handle_timer(Clock.now)
        moved = roundtrip(client, server, Clock.now, drop)
        if on_round is not None:
            on_round()
        moved += roundtrip(server, client, Clock.now, drop)
        if not moved and all(
            not c._network_paths or (t := c.get_timer()) is None or t > Clock.now + 0.05
            for c in (client, server)
        ):
            return
    raise AssertionError("no quiescence within the round cap")


def drain(conn):
    """All pending events, after letting a closing period run out."""
    if conn.close_pending or conn._state.name in ("CLOSING", "DRAINING"):
        Clock.now += 10
        conn.handle_timer(Clock.now)
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def test_both_ends_get_one_binding_secret_and_another_connection_another():
    """The key proofs' channel binding (``_auth``): the secret both ends log is the same on
    one connection, known to the server before the client finished, and differs on the next
    connection between the same two keys' holders."""
    sinks = SecretSink(), SecretSink()
    client, server, _, _ = make_pair(sinks=sinks)
    roundtrip(client, server, Clock.now)
    assert sinks[1].secret is not None and sinks[0].secret is None  # the server's flight
    exchange(client, server)
    assert client.handshake_confirmed and server.handshake_confirmed
    assert sinks[0].secret == sinks[1].secret and len(sinks[0].secret) >= 32
    other = SecretSink(), SecretSink()
    exchange(*make_pair(sinks=other)[:2])
    assert other[0].secret == other[1].secret != sinks[0].secret


def test_a_proof_relayed_from_another_connection_does_not_verify():
    """A relay in the middle runs two handshakes: the server's proof it forwards from its
    own connection does not verify on the client's, nor the client's on the server's."""
    server_id, client_id = Identity.generate(), Identity.generate()
    left, right = SecretSink(), SecretSink()  # client<->relay, relay<->server
    exchange(*make_pair(sinks=(left, SecretSink()))[:2])
    exchange(*make_pair(sinks=(SecretSink(), right))[:2])
    server = PeerAuth(server_id, is_client=False, authorize=lambda peer: None)
    server.sink.write(f"SERVER_TRAFFIC_SECRET_0 00 {right.secret.hex()}\n")
    client = PeerAuth(client_id, is_client=True, expected_peer=server_id.peer_id)
    client.sink.write(f"SERVER_TRAFFIC_SECRET_0 00 {left.secret.hex()}\n")
    with pytest.raises(AuthFailure, match="does not verify"):
        client.feed(server.proof_due(), end=False)
    honest = PeerAuth(server_id, is_client=False)
    honest.sink.write(f"SERVER_TRAFFIC_SECRET_0 00 {left.secret.hex()}\n")
    client = PeerAuth(client_id, is_client=True, expected_peer=server_id.peer_id)
    client.sink.write(f"SERVER_TRAFFIC_SECRET_0 00 {left.secret.hex()}\n")
    client.feed(honest.proof_due(), end=False)  # the same key over the right binding
    assert client.peer_id == server_id.peer_id
    with pytest.raises(AuthFailure, match="does not verify"):
        server.feed(client.proof_due(), end=True)


def test_receive_window_follows_the_reader_not_the_sender():
    """A sender that pushes far more than the window while the application reads nothing:
    the receiver's limits stay at consumed + window however much arrived (stock aioquic
    keeps doubling them); reading half grants exactly half a window more."""
    config = EndpointConfig(stream_window=64 * 1024, connection_window=128 * 1024)
    client, server, _, _ = make_pair(config)
    exchange(client, server)
    sid = client.open_bidi_stream()
    client.send_stream_data(sid, bytes(4 * 1024 * 1024))
    received = [0]

    def deliver():  # what the trio driver does with StreamDataReceived
        while (event := server.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                server.ledger.buffered += len(event.data)
                received[0] += len(event.data)

    exchange(client, server, rounds=2000, on_round=deliver)
    assert received[0] == config.stream_window
    assert server._streams[sid].max_stream_data_local == config.stream_window
    assert server._local_max_data.value == config.connection_window
    server.ledger.read(sid, received[0] // 2)  # the application reads half
    exchange(client, server, rounds=2000, on_round=deliver)
    assert received[0] == config.stream_window * 3 // 2


def test_handshake_survives_lost_datagrams():
    client, server, _, _ = make_pair()
    roundtrip(client, server, Clock.now, drop=lambda i: True)  # the first Initial is lost
    for _ in range(10):  # jump to each retransmission timer, as the trio driver sleeps
        if client.handshake_confirmed:
            break
        Clock.now = max(Clock.now, client.get_timer())
        client.handle_timer(Clock.now)
        exchange(client, server)
    assert client.handshake_confirmed and server.handshake_confirmed


@fast_only
def test_acks_wait_for_the_delay_or_a_burst():
    """One small packet is acknowledged ACK_DELAY later (not aioquic's 1 ms); a burst is
    acknowledged at once on the datagram that makes ACK_EVERY_DATAGRAMS full datagrams (at a
    real network's datagram size that is fewer bytes than ACK_EVERY_BYTES)."""
    from aioquic import tls
    from burn_remote.protocol.transport._quic_fast import (
        ACK_DELAY,
        ACK_EVERY_BYTES,
        ACK_EVERY_DATAGRAMS,
        BULK_ACK_DELAY,
    )

    client, server, _, _ = make_pair()
    exchange(client, server)
    space = server._spaces[tls.Epoch.ONE_RTT]
    sid = client.open_bidi_stream()
    client.send_stream_data(sid, b"step")
    now = Clock.now = Clock.now + 1.0
    assert roundtrip(client, server, now) == 1
    assert space.ack_at == now + ACK_DELAY
    assert not server.datagrams_to_send(now + ACK_DELAY / 2)  # nothing due yet
    assert server.datagrams_to_send(now + ACK_DELAY)  # the ACK
    assert space.ack_at is None

    size = server._max_datagram_size
    due_after = min(ACK_EVERY_BYTES, ACK_EVERY_DATAGRAMS * size)
    assert due_after < ACK_EVERY_BYTES  # 1452-byte datagrams: the datagram count decides
    client._loss._cc.congestion_window = 64 * ACK_EVERY_BYTES  # a connection past slow start
    client.send_stream_data(sid, bytes(2 * due_after))
    sizes: list[int] = []
    start = now = now + 0.1
    while space.ack_at != now and now < start + 0.9 * ACK_DELAY:  # paced: a bit at a time
        now += BULK_ACK_DELAY / 100  # faster than the bulk delay: only the count makes it due
        for data, _ in client.datagrams_to_send(now):
            server.receive_datagram(data, CLIENT_ADDR, now)
            sizes.append(len(data))
            if space.ack_at == now:
                break
    assert space.ack_at == now, f"no ACK due after {sum(sizes)} bytes in {now - start:.4f} s"
    assert sum(sizes) >= due_after > sum(sizes[:-1])  # due on the datagram that filled it
    assert len(sizes) == ACK_EVERY_DATAGRAMS


@fast_only
def test_a_full_datagram_is_acknowledged_within_the_bulk_delay():
    """A full datagram (bulk data) is acknowledged BULK_ACK_DELAY after it came, a small one
    (a request) ACK_DELAY after: a sender whose congestion window holds fewer datagrams than
    ACK_EVERY_DATAGRAMS (slow start, after a loss) is not held ACK_DELAY per window."""
    from aioquic import tls
    from burn_remote.protocol.transport._quic_fast import ACK_DELAY, BULK_ACK_DELAY

    client, server, _, _ = make_pair()
    exchange(client, server)
    space = server._spaces[tls.Epoch.ONE_RTT]
    sid = client.open_bidi_stream()
    now = Clock.now = Clock.now + 1.0
    client.send_stream_data(sid, b"small")
    assert roundtrip(client, server, now) == 1
    assert space.ack_at == now + ACK_DELAY
    assert server.datagrams_to_send(now + ACK_DELAY)
    now += 1.0
    client.send_stream_data(sid, bytes(2000))  # one full datagram and a small rest
    datagrams = client.datagrams_to_send(now)
    assert len(datagrams[0][0]) == server._max_datagram_size
    server.receive_datagram(datagrams[0][0], CLIENT_ADDR, now)
    assert space.ack_at == now + BULK_ACK_DELAY
    assert not server.datagrams_to_send(now + BULK_ACK_DELAY / 2)
    assert server.datagrams_to_send(now + BULK_ACK_DELAY)


@fast_only
def test_a_gap_in_the_packet_numbers_is_acknowledged_at_once():
    """A datagram after a lost one, and the retransmission that fills the gap, make the ACK
    due at once (RFC 9000 13.2.1): the sender learns of the loss without waiting for our
    delay (4 MiB each way through 10 % loss took ~40 s at 1350-byte datagrams before)."""
    from aioquic import tls
    from burn_remote.protocol.transport._quic_fast import ACK_DELAY

    client, server, _, _ = make_pair()
    exchange(client, server)
    space = server._spaces[tls.Epoch.ONE_RTT]
    sid = client.open_bidi_stream()
    now = Clock.now = Clock.now + 1.0
    sent = []
    for i in range(3):  # three small requests, one datagram each
        client.send_stream_data(sid, b"request %d" % i)
        sent += [data for data, _ in client.datagrams_to_send(now + i * 1e-4)]
    assert len(sent) == 3
    server.receive_datagram(sent[0], CLIENT_ADDR, now)
    assert space.ack_at == now + ACK_DELAY  # in order: the ACK may wait
    later = now + 2e-4
    server.receive_datagram(sent[2], CLIENT_ADDR, later)  # the second was lost
    assert space.ack_at == later  # a gap: due at once
    assert server.datagrams_to_send(later)  # the ACK (with its gap) leaves
    assert space.ack_at is None
    server.receive_datagram(sent[1], CLIENT_ADDR, later + 1e-4)  # arrives late: fills the gap
    assert space.ack_at == later + 1e-4


@fast_only
def test_a_datagram_is_built_after_receiving_only_when_one_is_due():
    """send_due: true through the handshake; after a packet whose ACK may wait, false until
    the delay expires; true while stream data waits to go out."""
    from burn_remote.protocol.transport._quic_fast import ACK_DELAY

    client, server, _, _ = make_pair()
    assert client.send_due(Clock.now)  # the handshake is on
    exchange(client, server)
    now = Clock.now = Clock.now + 1.0
    assert not server.datagrams_to_send(now) and not server.send_due(now)
    sid = client.open_bidi_stream()
    client.send_stream_data(sid, b"step")
    assert client.send_due(now)  # written, not yet sent
    assert roundtrip(client, server, now) == 1
    assert not client.send_due(now)
    assert not server.send_due(now)  # its ACK waits
    assert not server.datagrams_to_send(now)  # as building would show
    assert server.send_due(now + ACK_DELAY)
    assert server.datagrams_to_send(now + ACK_DELAY)


@fast_only
def test_a_reply_carries_the_ack_it_owes_and_a_request_one_old_enough():
    """A server's owed ACK rides on its next reply (a qh3 client holds its next request back
    until it comes); a client's rides on its next request only once it is ACK_RIDE_AFTER
    old (processing an ACK per request cost the server more than the request itself), or
    when the client sent no ACK for ACK_DELAY (sparse traffic, where it would go alone). In
    request/reply traffic no ACK-only datagram is sent."""
    from aioquic import tls
    from burn_remote.protocol.transport._quic_fast import ACK_RIDE_AFTER

    client, server, _, _ = make_pair()
    exchange(client, server)
    sid = client.open_bidi_stream()
    server_space = server._spaces[tls.Epoch.ONE_RTT]
    client_space = client._spaces[tls.Epoch.ONE_RTT]
    now = Clock.now = Clock.now + 1.0

    def half(a, b, text: bytes, at: float) -> None:
        a.send_stream_data(sid, text)
        assert roundtrip(a, b, at) == 1
        while b.next_event() is not None:
            pass

    for i in range(10):
        at = now + i * ACK_RIDE_AFTER / 20  # quick turns (time moves: the pacer spaces packets)
        half(client, server, b"request %d" % i, at)
        assert server_space.ack_at is not None  # owed, not yet due
        half(server, client, b"reply %d" % i, at)
        assert server_space.ack_at is None  # it left with the reply
        assert client.sender_buffered(sid) == 0  # the request is acknowledged
        assert client_space.ack_at is not None  # the client's waits
    # the second request carried the ACK of the first reply (the client had sent none since
    # the handshake); then none rode
    assert server.sender_buffered(sid) == sum(len(b"reply %d" % i) for i in range(1, 10))
    # old enough (what it acknowledges starts at reply 1, at i = 1), though an ACK left
    # less than ACK_DELAY ago: it rides
    half(client, server, b"late request", now + ACK_RIDE_AFTER / 20 + ACK_RIDE_AFTER)
    assert server.sender_buffered(sid) == 0
    assert not server.datagrams_to_send(now) and not client.datagrams_to_send(now)


@fast_only
def test_a_build_ends_with_the_packet_that_left_nothing_behind(monkeypatch):
    """aioquic starts one more 1-RTT packet after each non-empty one and throws it away when
    it stays empty (~8 us of Python per build, on both ends of every round trip). Here a
    build that wrote everything ends there: a small frame costs one packet; data that does
    not fit one packet, on several streams, still leaves whole in the same build."""
    from aioquic.quic.packet_builder import QuicPacketBuilder

    client, server, _, _ = make_pair()
    exchange(client, server)
    started: list[int] = []
    start = QuicPacketBuilder.start_packet

    def counting(builder, packet_type, crypto):
        started.append(packet_type)
        return start(builder, packet_type, crypto)

    monkeypatch.setattr(QuicPacketBuilder, "start_packet", counting)
    now = Clock.now = Clock.now + 1.0
    sid = client.open_bidi_stream()
    client.send_stream_data(sid, b"one small request")
    assert roundtrip(client, server, now) == 1
    assert len(started) == 1  # stock aioquic: 2 (the second one empty)
    assert not client.send_due(now)  # and the stream knows it has nothing left to send

    client._loss._cc.congestion_window = 10**7  # only the pacer spreads it out
    sizes = {client.open_bidi_stream(): n for n in (5000, 1, 70000)}
    for s, n in sizes.items():
        client.send_stream_data(s, bytes([s % 251]) * n, end_stream=True)
    got: dict[int, bytes] = {}
    for _ in range(100):
        now += 0.001
        started.clear()
        moved = roundtrip(client, server, now)
        assert len(started) == max(moved, 1)  # a packet per datagram; one when idle
        while (event := server.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                got[event.stream_id] = got.get(event.stream_id, b"") + event.data
        if not moved:
            break
    assert {s: len(d) for s, d in got.items() if s in sizes} == sizes
    assert all(d == bytes([s % 251]) * sizes[s] for s, d in got.items() if s in sizes)
