"""Malformed frames: generated and mutated; each gets an Error, nothing crashes, and another
session on the same server is not disturbed."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest
import trio
from burn_remote import RemoteDevice
from burn_remote.protocol import messages as m
from burn_remote.server._session import Session
from burn_remote.server._state import ServerState
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Server

_VALID = [
    m.encode(m.Upload(0, 1, "float32", (2,), b"\0" * 8, 0)),
    m.encode([m.Read(3, 1), m.Sync(4)]),
    m.encode(m.ExecuteGraph(5, b"\1" * 32, (1,), (0.5,), (2,), (1,))),
    m.encode(m.RegisterGraph(7, b"\2" * 32, b"\x94\x01\x90\x90\x90")),
    m.encode([m.Drop((1, 2)), m.MemoryStats(6, 0, 0, 0, 0, 0, 0, 0)]),
]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.binary(max_size=40)
    | st.text(max_size=10)
)
_msgpack_values = st.recursive(
    _scalars,
    lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=4), c, max_size=3),
)


def _mutate(frame: bytes, rng: random.Random) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)) :]
        else:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
    return bytes(b)


def _fresh_session() -> Session:
    s = Session(ServerState("cpu"), "fuzz")
    s.feed_control(m.encode(m.Hello(m.PROTOCOL_VERSION, b"")))
    s.step(0.0)
    return s


def _check_alive(s: Session) -> None:
    s.stalled = False  # an UNKNOWN_GRAPH stall is legal; the client would Resync
    if s.waiting is not None:  # a (mutated) bulk upload waits for its bytes: send too few
        s.feed_bulk(s.waiting[1], b"")
    s.feed_control(m.encode(m.Sync(99)))
    assert m.decode(s.step(0.0)[-1])[-1] == m.Ack(99)
    s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_msgpack_values)
def test_generated_frames_never_crash_the_session(value: object) -> None:
    s = _fresh_session()
    s.feed_control(msgpack.packb(value, use_bin_type=True))
    for out in s.step(0.0):
        assert isinstance(out, bytes)
        for msg in m.decode(out):
            assert isinstance(msg, m.Error | m.Data | m.Ack | m.MemoryStats)
    _check_alive(s)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, len(_VALID) - 1))
def test_mutated_frames_never_crash_the_session(seed: int, which: int) -> None:
    s = _fresh_session()
    s.feed_control(m.encode(m.Upload(0, 1, "float32", (2,), b"\0" * 8, 0)))
    s.feed_control(_mutate(_VALID[which], random.Random(seed)))
    for out in s.step(0.0):
        assert isinstance(out, bytes)
        m.decode(out)
    _check_alive(s)


async def _raw_session(server: Server, frames: list[bytes]) -> list[list[m.Message]]:
    from burn_remote.protocol.transport import Endpoint, Identity, default_key_path

    host, _, port = server.address.rpartition(":")
    ident = Identity.load_or_create(default_key_path())
    replies = []
    async with Endpoint.open(ident) as ep:
        conn = await ep.connect(server.peer_id, (host, int(port)))
        s = await conn.open_stream()
        await s.send_frame(m.encode(m.Hello(m.PROTOCOL_VERSION, b"")))
        assert isinstance(m.decode(await s.receive_frame())[0], m.Welcome)
        for i, frame in enumerate(frames):
            await s.send_frame(frame)
            await s.send_frame(m.encode(m.Sync(10_000 + i)))
            while True:  # replies up to our Sync's Ack
                msgs = m.decode(await s.receive_frame())
                replies.append(msgs)
                if m.Ack(10_000 + i) in msgs:
                    break
                if any(isinstance(x, m.Error) and x.code == m.STALLED for x in msgs):
                    await s.send_frame(m.encode([m.Resync(), m.Sync(10_000 + i)]))
        await conn.close("done")
    return replies


@pytest.mark.timeout(300)
def test_malformed_frames_over_quic_get_errors_and_spare_other_sessions(server: Server) -> None:
    other = RemoteDevice(server.target)
    kept = other.tensor(np.arange(6, dtype=np.float32))
    assert kept.sum().item() == 15.0
    rng = random.Random(4)
    frames = [_mutate(_VALID[1 + i % 4], rng) for i in range(20)]  # Upload: in memory
    frames += [msgpack.packb(v, use_bin_type=True) for v in ([], [[99]], {"a": 1}, "x", [[3, -1]])]
    frames.append(bytes(rng.randrange(256) for _ in range(300)))
    replies = trio.run(_raw_session, server, frames)
    errors = [x for msgs in replies for x in msgs if isinstance(x, m.Error)]
    assert len(errors) >= len(frames) // 2
    assert all(e.message for e in errors)
    assert kept.sum().item() == 15.0 and (kept * 2).numpy().tolist() == [0, 2, 4, 6, 8, 10]
    other.close()
