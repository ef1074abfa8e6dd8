"""How the client hands several ranks' work to their servers: `collective.sync` and the
data-parallel wait queue every rank's work with its Sync first, then send every rank its one
message back to back, so no rank's message waits for another's encoding and no server gets
a second message (and its wake-up) while its collective runs.

The devices here run over an in-memory link that records each frame sent and answers every
Sync at once (the servers' side is tested in test_servers.py)."""

from __future__ import annotations

import numpy as np
from burn_remote import RemoteDevice
from burn_remote import collective as C
from burn_remote._dp_sync import wait_all
from burn_remote._remote import RemoteRuntime
from burn_remote.protocol import messages as m


class _EchoLink:
    """Records (device, message kinds) per frame sent, and what every device still had
    unsent at that moment; answers each Sync with its Ack."""

    def __init__(self, name: str, proto, cond, frames: list, protos: dict) -> None:
        self.name, self.proto, self.cond = name, proto, cond
        self.frames, self.protos = frames, protos
        protos[name] = proto

    def kick(self) -> None:
        while True:
            queued = {k: bool(p.pending) for k, p in self.protos.items()}
            with self.cond:
                batch = self.proto.take()
            if batch is None:
                return
            msgs = m.decode(batch.frame)
            self.frames.append((self.name, [type(x).__name__ for x in msgs], queued))
            acks = [m.Ack(x.request_id) for x in msgs if isinstance(x, m.Sync)]
            if acks:
                with self.cond:
                    self.proto.receive_control(m.encode(acks))
                    self.cond.notify_all()

    def wait(self, done, timeout: float, linger: bool = True) -> float:
        return timeout

    def close(self) -> None:
        pass


def _devices(n: int, frames: list) -> list[RemoteDevice]:
    protos: dict = {}
    return [
        RemoteDevice.over(
            RemoteRuntime(lambda p, c, k=k: _EchoLink(f"s{k}", p, c, frames, protos)), f"s{k}"
        )
        for k in range(n)
    ]


def _record_on(devs: list[RemoteDevice]) -> list:
    return [d.tensor(np.full(3, float(k), np.float32)) * 2 + 1 for k, d in enumerate(devs)]


def _check_one_frame_each(frames: list, names: list[str]) -> None:
    assert [name for name, _, _ in frames] == names, frames
    for name, kinds, _ in frames:
        assert kinds[-2:] == ["ExecuteGraph", "Sync"], (name, kinds)
    # the first frame left once every rank's work was queued (back to back, none waited)
    assert all(frames[0][2].values()), frames[0]


def test_sync_sends_each_rank_its_work_and_sync_in_one_message_after_all_are_queued():
    frames: list = []
    devs = _devices(3, frames)
    ys = _record_on(devs)
    C.sync(devs)
    _check_one_frame_each(frames, ["s0", "s1", "s2"])
    assert len(ys) == 3


def test_the_data_parallel_wait_sends_each_rank_one_message_after_all_are_queued():
    frames: list = []
    devs = _devices(3, frames)
    ys = _record_on(devs)
    outcome = wait_all(devs)
    assert outcome.ok, outcome
    _check_one_frame_each(frames, ["s0", "s1", "s2"])
    assert len(ys) == 3


def test_a_rank_whose_submission_fails_is_raised_after_the_others_were_sent_and_waited():
    frames: list = []
    devs = _devices(3, frames)
    ys = _record_on(devs)
    devs[1]._rt.proto.fatal = "the server went away"  # its next request raises
    try:
        C.sync(devs)
    except ConnectionError as exc:
        assert "went away" in str(exc)
    else:
        raise AssertionError("sync did not raise the failed rank's error")
    assert [name for name, _, _ in frames] == ["s0", "s2"], frames
    assert all(kinds[-1] == "Sync" for _, kinds, _ in frames), frames
    assert len(ys) == 3


def test_sync_of_some_ranks_also_sends_what_their_group_partners_recorded():
    """`sync([rank 0])` must not leave rank 0's collective waiting for a partner whose step
    is still recorded on the client: the partner's work is sent too (not waited for)."""
    frames: list = []
    devs = _devices(2, frames)
    ys = _record_on(devs)
    devs[0]._rec.partners[7] = [devs[1]]  # what a Group of both sets up
    devs[1]._rec.partners[7] = [devs[0]]
    C.sync(devs[:1])
    sent = {name: kinds for name, kinds, _ in frames}
    assert sent["s0"][-2:] == ["ExecuteGraph", "Sync"], frames
    assert "ExecuteGraph" in sent["s1"] and "Sync" not in sent["s1"], frames
    assert len(ys) == 2
