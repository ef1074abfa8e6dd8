"""Which rank a server names when a neighbour's abort blames the server itself.

A cut link between ranks a and b makes b's watchdog blame a; b's abort travels round the
ring and may reach a before a's own watchdog fires. Both servers are up, so a must name b
(the end of the link that went quiet), never itself."""

from __future__ import annotations

from burn_remote.server._groups import GroupMember


def member(rank: int, size: int, heard: dict[str, float], moved: dict[str, float]):
    m = object.__new__(GroupMember)  # only the fields _blamed reads
    m.rank, m.size = rank, size
    m.pred, m.succ = (rank - 1) % size, (rank + 1) % size
    m._heard, m._moved = heard, moved
    m.data_out = m.tcp_in = None  # the QUIC plane (no TCP data link)
    m._stall = {"succ": 0.0, "pred": 0.0}
    m._peer_data = {"succ": 0, "pred": 0}
    m._peer_waiting = False
    return m


def test_an_abort_naming_another_rank_is_passed_on_as_is():
    m = member(0, 3, {"succ": 1.0, "pred": 9.0}, {"succ": 0.0, "pred": 0.0})
    assert m._blamed(2) == 2


def test_an_abort_naming_this_rank_names_the_neighbour_whose_link_went_quiet():
    # rank 0's link to its successor (rank 1) was cut at t=1; its predecessor (rank 2) is
    # heard until the abort arrives from it at t=4
    cut_succ = member(0, 3, {"succ": 1.0, "pred": 4.0}, {"succ": 1.2, "pred": 3.9})
    assert cut_succ._blamed(0) == 1
    cut_pred = member(1, 3, {"succ": 4.0, "pred": 1.0}, {"succ": 3.0, "pred": 1.1})
    assert cut_pred._blamed(1) == 0


def test_ring_data_sent_on_a_link_counts_as_hearing_it():
    # heartbeats from the successor queue behind ring data, but pieces left recently
    m = member(2, 4, {"succ": 1.0, "pred": 2.0}, {"succ": 5.0, "pred": 2.5})
    assert m._blamed(2) == 1  # the predecessor (rank 1) is the quiet one


class _Out:
    """The fields of a TCP data link's sending end that the watchdog reads."""

    def __init__(self, sent: int) -> None:
        self.sent = sent


def test_a_stalled_tcp_data_link_names_its_other_end(monkeypatch):
    """Both QUIC links beat (the successor was heard last of all), but the successor waits
    for 5000 bytes this rank wrote to their TCP data link: the successor is named."""
    from burn_remote.server import _groups

    monkeypatch.setattr(_groups.rd, "DataOut", _Out)
    m = member(0, 3, {"succ": 9.0, "pred": 4.0}, {"succ": 0.0, "pred": 0.0})
    m.data_out = _Out(sent=9000)
    m._peer_data["succ"], m._peer_waiting = 4000, True
    assert m._blamed(0) == 2  # stalled only this moment: the quiet QUIC link decides
    m._stall["succ"] -= 2.0  # stalled for 2 s
    assert m._blamed(0) == 1
    assert m._stalled("succ", m._stall["succ"] + 1.0) == ""  # not for LINK_TIMEOUT yet
    assert "TCP path is cut" in m._stalled("succ", m._stall["succ"] + _groups.LINK_TIMEOUT + 1)
    m._peer_data["succ"] = 9000  # it got everything: nothing is stalled
    assert m._stalled("succ", 100.0) == "" and m._stall["succ"] == 0.0


def _starved_receiver(unread: int, received: int):
    """A TCP data link's receiving end whose thread has not run for a while: it went to wait
    long ago, and ``unread`` bytes sit in its socket since (a real socket pair)."""
    import socket
    import time

    from burn_remote.server import _ring_data as rd

    a, b = socket.socketpair()
    a.sendall(b"\0" * unread)
    inn = rd.DataIn(b, None, sealed=False)
    inn.received, inn.waiting_since = received, time.monotonic() - 10.0
    return inn, (a, b)


def test_a_starved_receiver_with_bytes_in_its_socket_is_not_a_cut_link():
    """The predecessor wrote 6000 bytes, this rank read 1000 and its driver thread has not
    run since (CPU-starved): the other 5000 are in its socket, so the path delivers and
    nothing is stalled; once they are read and more never come, the link is cut."""
    import time

    from burn_remote.server import _groups

    now = time.monotonic()
    m = member(1, 3, {"succ": now, "pred": now}, {"succ": 0.0, "pred": 0.0})
    m.tcp_in, socks = _starved_receiver(unread=5000, received=1000)
    m.id, m._peer_data["pred"] = 7, 6000
    try:
        assert m._stalled("pred", now) == "" and m._stall["pred"] == 0.0
        assert m._beat("pred").waiting == 0  # the predecessor is told: not waiting
        socks[1].recv(5000)  # the thread ran and read them; the rest never comes
        assert m._stalled("pred", now) == "" and m._stall["pred"] == now
        later = now + _groups.LINK_TIMEOUT + 0.1
        assert "TCP path is cut" in m._stalled("pred", later)
        assert m._beat("pred").waiting == 1
    finally:
        for s in socks:
            s.close()


def test_a_starved_rank_on_a_cut_link_names_its_successor(monkeypatch):
    """Rank 0's TCP data link to rank 1 is cut; rank 0's driver thread is starved, so what
    rank 2 sent it waits unread in its socket (an earlier watchdog tick saw the predecessor
    side as stalled). Rank 1's abort names rank 0: rank 0 names rank 1, not rank 2."""
    import time

    from burn_remote.server import _groups

    monkeypatch.setattr(_groups.rd, "DataOut", _Out)
    now = time.monotonic()
    m = member(0, 3, {"succ": now - 0.1, "pred": now - 0.3}, {"succ": 0.0, "pred": 0.0})
    m.tcp_in, socks = _starved_receiver(unread=4096, received=1000)
    m._peer_data["pred"] = 5096
    m._stall["pred"] = now - 2.0
    m.data_out = _Out(sent=9000)
    m._peer_data["succ"], m._peer_waiting = 4000, True
    try:
        assert m._blamed(0) == 1
    finally:
        for s in socks:
            s.close()


def test_an_abort_that_outruns_this_rank_s_watchdog_names_the_stalled_side(monkeypatch):
    """Both QUIC links beat (the predecessor was heard a little earlier, by chance); the
    successor says it waits for bytes this rank wrote, seen only now: it is named."""
    import time

    from burn_remote.server import _groups

    monkeypatch.setattr(_groups.rd, "DataOut", _Out)
    now = time.monotonic()
    m = member(0, 3, {"succ": now - 0.1, "pred": now - 0.3}, {"succ": 0.0, "pred": 0.0})
    m.data_out = _Out(sent=9000)
    m._peer_data["succ"], m._peer_waiting = 4000, True
    assert m._blamed(0) == 1
    # this rank's loop was starved of CPU for 1.5 s: the predecessor's beats are queued,
    # not yet read, while the abort from the successor was read just now
    m._heard = {"succ": time.monotonic(), "pred": time.monotonic() - 1.5}
    assert m._blamed(0) == 1
    m._peer_waiting = False  # nothing stalled: the quieter link decides
    assert m._blamed(0) == 2


def test_a_failed_rank_sends_no_more_heartbeats():
    """After the group failed, a beat would say the (stopped) receiver no longer waits and
    could overtake the GroupAbort: the neighbour would then blame without that evidence."""
    import trio
    import trio.testing
    from burn_remote.engine.collective import GroupFailure
    from burn_remote.protocol import messages as msgs

    m = member(1, 3, {"succ": 0.0, "pred": 0.0}, {"succ": 0.0, "pred": 0.0})
    m.id, m.failure = 7, None
    sent: list[bytes] = []

    class Ctl:
        async def send_frame(self, frame: bytes) -> None:
            sent.append(frame)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m._send_beats, Ctl(), "pred")
            await trio.sleep(2.2)  # beats at 0, 0.5, 1.0, 1.5, 2.0
            m.failure = GroupFailure(7, 0, "", "the TCP path is cut")
            await trio.sleep(5.0)  # the loop ends at its next beat: none is sent

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(sent) == 5
    assert all(isinstance(msgs.decode(f)[0], msgs.GroupBeat) for f in sent)
