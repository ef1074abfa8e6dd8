"""The ring all-reduce between real servers on loopback: values against NumPy (2 and 3
servers, odd sizes, dtypes, a compiled step that replays), servers that do not authorise
each other linked by the group capability only, and faults: a killed server fails the step
on every survivor with a GroupError naming it (by the links' heartbeats, long before the
rendezvous timeout), the survivors' servers stay up, and a group rebuilt from them works."""

from __future__ import annotations

import time

import burn_remote as br
import numpy as np
import pytest
from burn_remote import RemoteDevice
from burn_remote import collective as C
from support.server_group import bounded

pytestmark = pytest.mark.slow

WATCHDOG = 60.0
"""A hang is reported as such (the test fails) instead of blocking the suite."""


def _bounded(fn):
    return bounded(fn, WATCHDOG)


def _devices(daemons):
    return [RemoteDevice(d.target) for d in daemons]


PLANES = {
    "shm": ((), "over TCP (same host: authenticated, through shared memory)"),
    "tcp": (("--ring-loopback-tcp",), "over TCP (same host: authenticated, not encrypted)"),
    "sealed": (("--ring-seal-loopback",), "over TCP (AES-256-GCM)"),
    "quic": (("--ring-port", "off"), "over QUIC (fallback: the successor offers no TCP"),
}
"""Server flags for each data plane, and what the servers log about their links: the TCP
data plane (default; between servers of one host its plain bytes go through shared memory,
or over loopback TCP if asked; sealed records if asked or between hosts) and the QUIC
fallback."""


def _failures(outs) -> tuple[list[int], list[str]]:
    """Every rank's GroupError for its result (none may succeed or hang): the ranks they
    name, and their messages."""
    errors = []
    for o in outs:
        with pytest.raises(C.GroupError) as info:
            _bounded(o.numpy)
        errors.append(info.value)
    return [e.rank for e in errors], [str(e) for e in errors]


def _a_new_group_works(devs) -> None:
    """A group of ``devs`` (two), built after a failure, all-reduces right."""
    with C.Group(devs) as g:
        again = [C.all_reduce(d.tensor(np.full(2, 1.0)), g, "sum") for d in devs]
        np.testing.assert_array_equal(_bounded(again[1].numpy), [2.0, 2.0])


def _ring_address(daemon) -> tuple[str, int]:
    """Where a server's TCP data plane listens (its banner)."""
    import re

    found = re.search(r"ring data: tcp (\S+):(\d+)", daemon.output())
    assert found, daemon.output()
    return found.group(1), int(found.group(2))


@pytest.mark.parametrize("plane", PLANES)
@pytest.mark.parametrize("n", [2, 3])
def test_ring_matches_numpy(servers, n, plane):
    daemons = servers(n, "--allow-any", *PLANES[plane][0])
    devs = _devices(daemons)
    rng = np.random.default_rng(n)
    with C.Group(devs) as g:
        for count, dtype in [(1, "float32"), (7, "float64"), (1001, "float32"),
                             (3 * 2**20 + 5, "float32"), (999, "int64"), (64, "float16")]:  # fmt: skip
            xs = [(rng.standard_normal(count) * 4).astype(dtype) for _ in devs]
            outs = [C.all_reduce(d.tensor(x), g, "sum") for d, x in zip(devs, xs)]
            got = _bounded(lambda outs=outs: [o.numpy() for o in outs])
            want = np.sum([x.astype(np.float64) for x in xs], axis=0)
            tol = 1e-2 if dtype == "float16" else 1e-5
            np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=tol, atol=tol)
            assert all(o.tobytes() == got[0].tobytes() for o in got), "ranks differ"
        means = [C.all_reduce(d.tensor(np.full((2, 3), float(k))), g, "mean")
                 for k, d in enumerate(devs)]  # fmt: skip
        np.testing.assert_allclose(means[-1].numpy(), np.full((2, 3), (n - 1) / 2))
        scalars = [C.all_reduce(d.tensor(np.float32(k + 1)), g, "sum") for k, d in enumerate(devs)]
        assert scalars[0].numpy().shape == ()  # a loss or a count stays a scalar
        assert scalars[0].numpy() == n * (n + 1) / 2
    for d in daemons:  # every link took the plane asked for, and said so
        assert PLANES[plane][1] in d.output(), d.output()


def test_an_unreachable_tcp_data_plane_falls_back_to_quic(servers):
    """s1 offers a TCP data plane nobody can reach (a closed port): s0 says why in its log,
    sends over their QUIC link instead, and the sums are right; s1 -> s0 stays on TCP."""
    import socket

    with socket.socket() as closed:  # a port that was free a moment ago and is not listened on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    a = servers(1, "--allow-any")[0]
    b = servers(1, "--allow-any", "--ring-advertise", f"127.0.0.1:{port}")[0]
    a.know(b)
    b.know(a)
    devs = _devices([a, b])
    rng = np.random.default_rng(5)
    with C.Group(devs) as g:
        for count in (1, 1001, 2**20 + 3):
            xs = [rng.standard_normal(count).astype(np.float32) for _ in devs]
            outs = [C.all_reduce(d.tensor(x), g, "sum") for d, x in zip(devs, xs)]
            got = _bounded(lambda outs=outs: [o.numpy() for o in outs])
            np.testing.assert_allclose(got[0], xs[0] + xs[1], rtol=1e-6)
            assert got[0].tobytes() == got[1].tobytes()
    log_a, log_b = a.output(), b.output()
    assert "ring data to rank 1 over QUIC (fallback: TCP data link to 127.0.0.1:" in log_a, log_a
    assert "ring data from rank 0 over QUIC (fallback: TCP data link" in log_b, log_b
    assert "ring data to rank 0 over TCP" in log_b and "from rank 1 over TCP" in log_a


def test_compiled_step_replays_over_the_ring(servers):
    devs = _devices(servers(2, "--allow-any"))
    g = C.Group(devs)
    ws = [d.tensor(np.ones(5, np.float32), requires_grad=True) for d in devs]

    @br.compile
    def grad_mean(w, x):
        (w * x).sum().backward()
        return C.all_reduce(w.grad, g, "mean")

    for it in range(5):
        outs = []
        for k, (d, w) in enumerate(zip(devs, ws)):
            w.grad = None
            outs.append(grad_mean(w, d.tensor(np.full(5, float(2 * k + it), np.float32))))
        got = _bounded(lambda outs=outs: [o.numpy() for o in outs])
        for o in got:
            np.testing.assert_array_equal(o, np.full(5, 1.0 + it, np.float32))
    assert devs[0].stats()["graphs_registered"] <= 2  # registered once, then replayed
    g.close()


def test_servers_link_on_the_capability_without_authorising_each_other(
    servers, client_home, tmp_path
):
    me = _client_peer(client_home)
    allowed = tmp_path / "authorized_peers"
    allowed.write_text(f"{me} client\n")
    daemons = servers(3, "--authorized-peers", str(allowed))
    devs = _devices(daemons)
    with C.Group(devs) as g:
        outs = [C.all_reduce(d.tensor(np.full(10, float(k))), g, "sum") for k, d in enumerate(devs)]
        np.testing.assert_array_equal(_bounded(outs[1].numpy), np.full(10, 3.0))


def test_a_killed_server_fails_every_survivor_naming_it(servers, tmp_path):
    daemons = servers(3, "--allow-any")
    devs = _devices(daemons)
    g = C.Group(devs, timeout=600)  # only the heartbeats can end the wait soon
    outs = [C.all_reduce(d.tensor(np.ones(100, np.float32)), g) for d in devs]
    _bounded(lambda: [o.numpy() for o in outs])
    victim = daemons[1]
    victim.proc.kill()
    victim.proc.wait()
    start = time.monotonic()
    survivors = [devs[0], devs[2]]
    outs = [C.all_reduce(d.tensor(np.ones(100, np.float32)), g) for d in survivors]
    for d in survivors:
        d.flush()
    for o in outs:
        with pytest.raises(C.GroupError) as info:
            _bounded(o.numpy)
        assert info.value.rank == 1 and info.value.peer == victim.peer_id, info.value
        assert f"rank 1 ({victim.peer_id})" in str(info.value)
    print(f"GroupError on both survivors after {time.monotonic() - start:.2f} s")
    # the survivors' servers are up, their sessions go on, and a new group works
    g.close()
    with C.Group(survivors) as g2:
        again = [C.all_reduce(d.tensor(np.full(4, 2.0)), g2, "sum") for d in survivors]
        # every rank's result is read before the group closes: closing fails a rank whose
        # collective is still in flight (Group.close), which CI once caught on rank 1
        for o in again:
            np.testing.assert_array_equal(_bounded(o.numpy), np.full(4, 4.0))
    assert float((devs[2].tensor(np.ones(3)) * 2).sum().item()) == 6.0
    other = RemoteDevice(daemons[0].target, key=str(tmp_path / "another-client-key"))
    assert float((other.tensor(np.ones(3)) * 3).sum().item()) == 9.0


def test_mismatched_calls_fail_every_rank(servers):
    devs = _devices(servers(2, "--allow-any"))
    g = C.Group(devs, timeout=600)
    outs = [C.all_reduce(d.tensor(np.ones(3 + k, np.float32)), g) for k, d in enumerate(devs)]
    for o in outs:
        with pytest.raises(C.GroupError, match="all_reduce #0"):
            _bounded(o.numpy)
    g.close()


def test_a_server_refuses_a_group_that_names_another_server_as_it(servers):
    from burn_remote.protocol import messages as m

    a, b = servers(2, "--allow-any")
    dev = RemoteDevice(a.target)
    with pytest.raises(C.GroupError, match="not this server"):
        dev._rt._call(m.GroupSetup, 7, 0, (b.peer_id, a.peer_id), bytes(32), 1000)
    with pytest.raises(C.GroupError, match="listed twice"):
        dev._rt._call(m.GroupSetup, 8, 0, (a.peer_id, a.peer_id), bytes(32), 1000)
    assert float(dev.tensor(np.ones(2)).sum().item()) == 2.0  # the session goes on


def test_a_cut_link_fails_every_rank_naming_the_cut_pair(servers):
    """s0 reaches s1 only through the project's fault proxy; the proxy cuts: the ranks on
    both ends name each other, the third rank names one of them (the abort reaches it
    first from either side), and nobody hangs."""
    from pathlib import Path

    from burn_remote.protocol.transport.faultproxy import FaultProxy

    daemons = servers(3, "--allow-any", *PLANES["quic"][0])  # the UDP proxy cuts QUIC only
    host, port = daemons[1].address.rsplit(":", 1)
    proxy = FaultProxy.start_thread((host, int(port)))
    try:
        ph, pp = proxy.address
        book = Path(daemons[0].data_dir) / "addresses.toml"
        book.write_text(
            f'[[peer]]\nid = "{daemons[1].peer_id}"\naddresses = ["{ph}:{pp}"]\n'
            f'[[peer]]\nid = "{daemons[2].peer_id}"\naddresses = ["{daemons[2].address}"]\n'
        )
        devs = _devices(daemons)
        g = C.Group(devs, timeout=600)
        outs = [C.all_reduce(d.tensor(np.ones(1000, np.float32)), g, "sum") for d in devs]
        for o in outs:  # every rank done before the cut: only the next collective meets it
            np.testing.assert_array_equal(_bounded(o.numpy), np.full(1000, 3.0))
        assert proxy.stats.forwarded > 0  # the 0 -> 1 link really crosses the proxy
        proxy.cut(120)
        outs = [C.all_reduce(d.tensor(np.ones(1000, np.float32)), g, "sum") for d in devs]
        culprits, _ = _failures(outs)
        assert culprits[0] == 1 and culprits[1] == 0 and culprits[2] in (0, 1), culprits
        g.close()
        _a_new_group_works(devs[1:])  # the servers are fine; only that path is cut
    finally:
        proxy.stop()


def test_a_cut_tcp_data_link_fails_every_rank_naming_the_cut_pair(servers):
    """s0's TCP data link to s1 crosses a TCP relay that then black-holes it (nothing
    closes, nothing gets through) while every QUIC link still beats: the two ends name each
    other from the data links' progress within seconds, the third rank names one of them,
    nobody hangs, and a group of s1 + s2 works."""
    from support.tcp_proxy import TcpCutProxy

    proxy = TcpCutProxy()
    try:
        s0 = servers(1, "--allow-any")[0]
        s1 = servers(1, "--allow-any", "--ring-advertise", f"127.0.0.1:{proxy.port}")[0]
        s2 = servers(1, "--allow-any")[0]
        daemons = [s0, s1, s2]
        for d in daemons:
            d.know(*[o for o in daemons if o is not d])
        proxy.target = _ring_address(s1)
        devs = _devices(daemons)
        g = C.Group(devs, timeout=600)  # only the data links' progress can end the wait
        outs = [C.all_reduce(d.tensor(np.ones(1000, np.float32)), g, "sum") for d in devs]
        for got in _bounded(lambda: [o.numpy() for o in outs]):  # every rank done: no byte
            np.testing.assert_array_equal(got, np.full(1000, 3.0))  # of it on the relay
        assert proxy.relayed > 0  # the 0 -> 1 data link really crosses the relay
        assert "ring data to rank 1 over TCP" in s0.output()
        proxy.cut()
        start = time.monotonic()
        outs = [C.all_reduce(d.tensor(np.ones(2**20, np.float32)), g, "sum") for d in devs]
        culprits, reasons = _failures(outs)
        print(f"GroupError on every rank after {time.monotonic() - start:.2f} s: {culprits}")
        assert culprits[0] == 1 and culprits[1] == 0 and culprits[2] in (0, 1), culprits
        assert all("the TCP path is cut" in r for r in reasons), reasons
        g.close()
        _a_new_group_works(devs[1:])  # the servers are fine; only that path is cut
    finally:
        proxy.stop()


def _client_peer(client_home) -> str:
    from burn_remote.protocol.transport import Identity

    return str(Identity.load_or_create(client_home / "key").peer_id)


def _session_memory(daemon, peer: str) -> tuple[int, int, int]:
    """(tensor bytes, kept group bytes) of ``peer``'s session on ``daemon``, and the bytes the
    server's ledger holds beside tensors, from the server's own status (its own key)."""
    admin = RemoteDevice(daemon.target, key=str(daemon.data_dir / "key"))
    try:
        info = admin.server_status()
    finally:
        admin.close()
    (mine,) = [s for s in info["sessions"] if s["peer"] == peer]
    return mine["bytes"], mine["group_bytes"], info["memory"]["held"]


def test_kept_result_buffers_are_charged_to_the_session_and_refunded_with_the_group(
    servers, client_home
):
    """A rank keeps former results to reuse (no page zeroing); they count against its
    session's quota while kept, give way when the quota is short instead of failing the
    all-reduce, and are refunded when the group closes."""
    mib, quota = 2**20, 8 * 2**20
    daemons = servers(2, "--allow-any", "--session-memory", str(quota))
    devs = _devices(daemons)
    peer = _client_peer(client_home)
    x = np.arange(mib // 4, dtype=np.float32)
    g = C.Group(devs)
    for k in range(3):  # results dropped: a spare is reused
        outs = [C.all_reduce(d.tensor(x + k), g, "sum") for d in devs]
        np.testing.assert_array_equal(_bounded(outs[1].numpy), 2 * (x + k))
        del outs
    _, kept, held = _session_memory(daemons[0], peer)
    assert kept % mib == 0 and mib <= kept <= 4 * mib and held >= kept, (kept, held)
    live = []
    for k in range(5):  # results kept alive: new buffers, until the quota is short
        outs = [C.all_reduce(d.tensor(x * k), g, "sum") for d in devs]
        np.testing.assert_array_equal(_bounded(outs[0].numpy), 2 * x * k)
        live.append(outs)
        tensors, kept, _ = _session_memory(daemons[0], peer)
        assert tensors + kept <= quota, (k, tensors, kept)
    before = [_session_memory(d, peer) for d in daemons]
    assert all(kept > 0 for _, kept, _ in before), before
    g.close()
    for d, (_, kept_then, held_then) in zip(daemons, before):
        deadline = time.monotonic() + WATCHDOG  # the member ends on the server's loop
        while _session_memory(d, peer)[1] and time.monotonic() < deadline:
            time.sleep(0.1)
        _, kept, held = _session_memory(d, peer)
        assert kept == 0 and held == held_then - kept_then, (kept, held, kept_then, held_then)
    # a 16 MiB shared buffer does not fit this quota: the same-host links carry their
    # bytes over loopback TCP instead, and say why
    for d in daemons:
        assert "ring data link over TCP, not shared memory" in d.output(), d.output()
        assert "over TCP (same host: authenticated, not encrypted)" in d.output()


def test_a_shared_memory_data_link_is_charged_to_the_session_until_the_group_ends(
    servers, client_home
):
    """A same-host data link's shared buffer is memory the peer made the dialling server
    hold: it counts against the session's quota (its kept group bytes) while the group
    lives and is refunded when it closes."""
    from burn_remote.server._ring_shm import SEGMENT_BYTES

    daemons = servers(2, "--allow-any", "--session-memory", str(64 * 2**20))
    devs = _devices(daemons)
    peer = _client_peer(client_home)
    x = np.ones(1000, np.float32)
    g = C.Group(devs)
    outs = [C.all_reduce(d.tensor(x), g, "sum") for d in devs]
    np.testing.assert_array_equal(_bounded(outs[1].numpy), 2 * x)
    del outs
    for d in daemons:
        assert "(same host: authenticated, through shared memory)" in d.output(), d.output()
        _, kept, held = _session_memory(d, peer)
        assert SEGMENT_BYTES <= kept <= SEGMENT_BYTES + 4 * x.nbytes and held >= kept, kept
    g.close()
    for d in daemons:
        deadline = time.monotonic() + WATCHDOG  # the member ends on the server's loop
        while _session_memory(d, peer)[1] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_memory(d, peer)[1] == 0


def test_two_peers_groups_on_the_same_servers_keep_to_their_own_links_and_quota(
    servers, client_home, tmp_path
):
    """Two peers, each with a group over the same two servers of one host, all-reduce at
    once: each gets its own sums through its own shared-memory links, each session is
    charged its own buffers, and one peer closing its group leaves the other's working."""
    from burn_remote.protocol.transport import Identity
    from burn_remote.server._ring_shm import SEGMENT_BYTES

    daemons = servers(2, "--allow-any", "--session-memory", str(256 * 2**20))
    mine = _devices(daemons)
    other_key = tmp_path / "other-key"
    theirs = [RemoteDevice(d.target, key=other_key) for d in daemons]
    me = _client_peer(client_home)
    them = str(Identity.load_or_create(other_key).peer_id)
    g1, g2 = C.Group(mine), C.Group(theirs)
    x = np.arange(4 * 2**20, dtype=np.float32)  # 16 MiB a rank: the whole buffer's worth
    for k in range(3):  # both groups' all-reduces in flight together
        o1 = [C.all_reduce(d.tensor(x + k), g1, "sum") for d in mine]
        o2 = [C.all_reduce(d.tensor(-3 * x - k), g2, "sum") for d in theirs]
        _bounded(lambda: C.sync(mine + theirs))  # noqa: B023 - called at once
        np.testing.assert_array_equal(o1[1].numpy(), 2 * (x + k))
        np.testing.assert_array_equal(o2[0].numpy(), 2 * (-3 * x - k))
    for d in daemons:
        assert d.output().count("through shared memory") >= 4, d.output()  # 2 links each
        for peer in (me, them):
            assert _session_memory(d, peer)[1] >= SEGMENT_BYTES, peer
    g2.close()
    for d in daemons:
        deadline = time.monotonic() + WATCHDOG  # the member ends on the server's loop
        while _session_memory(d, them)[1] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_memory(d, them)[1] == 0
        assert _session_memory(d, me)[1] >= SEGMENT_BYTES
    again = [C.all_reduce(d.tensor(x), g1, "sum") for d in mine]
    np.testing.assert_array_equal(_bounded(again[0].numpy), 2 * x)
    g1.close()
