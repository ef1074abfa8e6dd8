"""The messages of a step are encoded as they are queued (``ClientProtocol``: an inline
Upload straight from the array, an ExecuteGraph filled from the capture's id and value
lists): the frames carry exactly the bytes ``messages.encode`` gives for the same messages."""

from __future__ import annotations

import threading

import burn_remote as br
import numpy as np
import pytest
from burn_remote import functional as F
from burn_remote import nn, optim
from burn_remote._remote_link import _UP, Link
from burn_remote._remote_protocol import ClientProtocol
from burn_remote._remote_resume import STAMP_ROOM, ClientSequencer
from burn_remote.protocol import messages as m
from burn_remote.protocol.sequencing import unwrap, wrap
from burn_remote.server._loopback import loopback_device


def _some_messages(n: int) -> list[m.Message]:
    kinds = [
        lambda i: m.Upload(0, i, "float32", (2, 3), np.arange(6, dtype=np.float32).tobytes(), 0),
        lambda i: m.ExecuteGraph(i, b"\x01" * 32, (1, 2**40, i), (0.5, -3, True), (7,), ()),
        lambda i: m.Drop((i, i + 1)),
        lambda i: m.Sync(i),
        lambda i: m.Read(i, 2**63 + i),
        lambda i: m.Hello(m.PROTOCOL_VERSION, b"token"),
    ]
    return [kinds[i % len(kinds)](i + 1) for i in range(n)]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 300, 65536])
def test_a_frame_of_messages_encoded_one_by_one_equals_the_encoder(n: int) -> None:
    msgs = _some_messages(n)
    packer = m.packer()
    assert m.frame_of([m.encode_one(x, packer) for x in msgs]) == m.encode(msgs)


def test_uploads_and_executions_queued_as_bytes_equal_the_encoder_and_decode_back() -> None:
    proto = ClientProtocol()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    proto.upload(5, a)
    proto.upload(6, a.T)  # not contiguous: uploaded in C order
    proto.upload(7, np.array(3, np.int64))  # 0-d
    proto.upload(8, np.zeros((0, 4), np.float16))  # empty
    a[:] = -1  # the queued upload kept its own copy
    frame = proto.take().frame
    msgs = m.decode(frame)
    assert m.encode(msgs) == frame
    hello, *ups = msgs
    assert isinstance(hello, m.Hello)
    assert [(u.tensor_id, u.dtype, u.shape, u.bulk_id) for u in ups] == [
        (5, "float32", (3, 4), 0),
        (6, "float32", (4, 3), 0),
        (7, "int64", (), 0),
        (8, "float16", (0, 4), 0),
    ]
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert ups[0].data == base.tobytes() and ups[1].data == base.T.copy().tobytes()
    assert ups[2].data == np.array(3, np.int64).tobytes() and ups[3].data == b""


def test_a_compiled_steps_frames_equal_the_encoder_with_the_ids_and_values_it_binds() -> None:
    dev, _ = loopback_device()
    link = dev._rt.link
    nn.seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=1e-2)

    @br.compile
    def step(x, y, scale):
        loss = F.cross_entropy(net(x) * scale, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    rng = np.random.default_rng(0)
    for i in range(6):
        x = dev.tensor(rng.standard_normal((5, 4)).astype(np.float32))
        y = dev.tensor(rng.integers(0, 2, 5))
        loss = step(x, y, 1.0 + i)
        assert np.isfinite(loss.item())
    assert step.stats()["replays"] >= 3
    executions = []
    for frame in link.frames:
        msgs = m.decode(frame)
        assert m.encode(msgs) == frame
        executions += [x for x in msgs if isinstance(x, m.ExecuteGraph)]
    last = executions[-1]
    held = {net[0].weight._id, net[0].bias._id, net[2].weight._id, net[2].bias._id}
    assert held <= set(last.input_ids) and held <= set(last.output_ids)  # written in place
    assert x._id in last.input_ids and y._id in last.input_ids
    assert 6.0 in last.values  # the scale bound on the last call


def test_a_frame_built_with_room_in_front_holds_the_same_frame_after_it() -> None:
    msgs = _some_messages(20)
    packer = m.packer()
    buf = m.frame_of([m.encode_one(x, packer) for x in msgs], reserve=21)
    assert type(buf) is bytearray and buf[:21] == bytes(21)
    assert bytes(buf[21:]) == m.encode(msgs)


def test_the_sequencer_stamps_a_frame_in_its_own_buffer() -> None:
    """The link's frame is joined once with room for the transport's length prefix and the
    sequencing header; ``stamp`` writes both there and keeps a view (no copy) for resume."""
    proto, seq = ClientProtocol(), ClientSequencer()
    seq.received = 7
    proto.request(m.Sync)
    buf = proto.take(STAMP_ROOM).frame
    inner = bytes(buf[STAMP_ROOM:])
    assert proto.counters.bytes_sent == len(inner)
    view = seq.stamp(buf)
    assert bytes(buf) == (len(buf) - 4).to_bytes(4, "big") + wrap(1, 7, inner)
    assert view.obj is buf and bytes(view) == wrap(1, 7, inner)
    assert seq.unacked[-1][0] == 1 and seq.unacked[-1][1] is view
    assert [type(x) for x in m.decode(unwrap(bytes(view))[2])] == [m.Hello, m.Sync]
    assert seq.accept(wrap(8, 1, b"")) == b"" and not seq.unacked  # acknowledged


def test_a_kick_hands_the_transport_the_stamped_buffer_itself() -> None:
    class Conn:
        sent: list = []

        def send_frame(self, sid, data, *, wait=True, prefixed=False):  # type: ignore[no-untyped-def]
            self.sent.append((sid, data, wait, prefixed))

    proto = ClientProtocol()
    link = Link("peer", ("127.0.0.1", 1), proto, threading.Condition())
    link._state, link._conn, link._control = _UP, Conn(), 0
    rid = proto.request(m.Read, 5)
    link.kick()
    link.kick()  # nothing pending: nothing sent
    ((sid, data, wait, prefixed),) = Conn.sent
    assert (sid, wait, prefixed) == (0, False, True) and type(data) is bytearray
    assert link._seq.unacked[-1][1].obj is data  # resume resends this very buffer
    seq, ack, inner = unwrap(bytes(data[4:]))
    assert int.from_bytes(data[:4], "big") == len(data) - 4 and (seq, ack) == (1, 0)
    assert [getattr(x, "request_id", None) for x in m.decode(inner)] == [None, rid]


def test_a_reply_trims_what_was_sent_up_to_its_request_only() -> None:
    """The journal (kept for a resend after UNKNOWN_GRAPH) and the executions awaiting an
    outcome are trimmed up to the answered request, in one go when it was the last one."""
    proto = ClientProtocol()
    first = proto.request(m.Sync)
    proto.upload(1, np.ones(3, np.float32))
    second = proto.request(m.Read, 1)
    third = proto.request(m.Sync)
    proto.take()
    proto.in_flight = {first - 1: "a", second - 1: "b", third - 1: "c"}  # (executions' ids)
    proto.receive_control(m.encode([m.Ack(second)]))
    assert [e.rid for e in proto.journal] == [third] and list(proto.in_flight) == [third - 1]
    proto.receive_control(m.encode([m.Ack(third)]))
    assert not proto.journal and not proto.in_flight
    assert {first, second, third} - set(proto.results) == {first}


_ITEM_CASES = [
    ("bool", [True, False]),
    ("int8", [-128, 127, 0]),
    ("uint8", [0, 255]),
    ("int32", [-(2**31), 2**31 - 1]),
    ("int64", [-(2**63), 2**63 - 1, 7]),
    ("float16", [1.5, -0.0, float("inf"), float("nan"), 65504.0, 6e-8]),
    ("bfloat16", [1.5, -2.0, float("-inf")]),
    ("float32", [0.1, -0.0, float("nan"), 3.4e38, 1e-45]),
    ("float64", [0.1, -0.0, float("inf"), 1e-308, 5e-324]),
]


@pytest.mark.parametrize("dtype,values", _ITEM_CASES, ids=[c[0] for c in _ITEM_CASES])
def test_item_is_what_numpy_gives_for_every_dtype_and_shape(dtype: str, values: list) -> None:
    """``item()`` on a remote tensor unpacks its reply straight into a Python number: the
    same value and type as ``ndarray.item()`` (NaN, -0.0, infinities, extremes)."""
    from burn_remote.protocol import dtypes

    dev, _ = loopback_device()
    np_dtype = dtypes.to_numpy(dtype)
    for v in values:
        for shape in [(), (1,), (1, 1, 1)]:
            a = np.full(shape, v, dtype=np_dtype)
            got, want = dev.tensor(a).item(), a.reshape(()).item()
            assert type(got) is type(want), (dtype, v, shape)
            if want != want:  # NaN
                assert got != got
            else:
                assert got == want and np.copysign(1, got) == np.copysign(1, want)
    assert not dev._rt.proto._item_reads


def test_an_item_reply_builds_no_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply to ``item()`` (a float32 scalar: the loss every few steps) is unpacked
    without NumPy on its path; ``numpy()`` still gets its array."""
    from burn_remote import _remote_protocol

    dev, _ = loopback_device()
    t = dev.tensor(np.array([2.5, 4.0], np.float32)).sum()
    assert t.numpy() == np.float32(6.5)

    def no_array(*args: object, **kwargs: object) -> None:
        raise AssertionError("an array was built for an item() reply")

    monkeypatch.setattr(_remote_protocol.np, "frombuffer", no_array)
    assert t.item() == 6.5
    assert (t * 2).item() == 13.0


def test_a_failed_item_read_raises_and_leaves_nothing_behind() -> None:
    """An Error instead of the Data (the server lacks the tensor) raises at the read, and
    the read is not remembered as one whose Data is unpacked."""
    from burn_remote._recorder import OpFailed

    dev, _ = loopback_device()
    t = dev.tensor(np.float32(1.0))
    with pytest.raises(OpFailed, match="1000000000"):
        dev._rt.read_item(10**9)  # a tensor id the server never had
    assert not dev._rt.proto._item_reads
    assert t.item() == 1.0
