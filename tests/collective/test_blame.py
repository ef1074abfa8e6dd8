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
