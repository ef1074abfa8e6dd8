"""Maximal graphs (``MAX_GRAPH_NODES`` nodes, the largest the server accepts) from a hostile
authorised peer. While they are registered, a well-behaved client's round trips keep being
answered (it is not queued behind them); the plans they leave in the cache are charged to
the ledger, so a server with a small memory limit refuses them instead of growing past it."""

from __future__ import annotations

import statistics
import threading
import time

import msgpack
from burn_remote.protocol import messages as m
from burn_remote.protocol.graph import GRAPH_FORMAT, MAX_GRAPH_NODES, canonical, decode
from burn_remote.server._footprint import PLAN_BYTES_PER_NODE

from .conftest import MEMORY_LIMIT, round_trip_times

GRAPHS = 3
"""Maximal graphs the attacker registers back to back (each one distinct)."""
ROOMY = 1 << 30
"""``--memory-limit`` of the server in the latency test: room for the plans it caches."""


def chain_graph(variant: int, nodes: int = MAX_GRAPH_NODES) -> tuple[bytes, bytes]:
    """(encoding, canonical digest) of a chain of ``nodes`` additions; ``variant`` changes
    the input's shape so each graph is new to the server."""
    spec = [[1 + variant], "float32"]
    body = [["add", [0, i], [], [spec]] for i in range(nodes)]
    raw = msgpack.packb([GRAPH_FORMAT, [spec], body, [nodes]])
    return raw, bytes.fromhex(canonical(decode(raw)).digest())


def _register(client, graphs, answers: list) -> None:  # type: ignore[no-untyped-def]
    """Send every graph (each followed by a Sync) at once, then collect the replies."""
    for k, (body, digest) in enumerate(graphs):
        client.send(m.RegisterGraph(k + 1, digest, body), m.Sync(100 + k))
    acks = 0
    while acks < len(graphs):
        got = client.replies(timeout=120)
        answers.extend(got)
        acks += sum(isinstance(r, m.Ack) for r in got)


def test_maximal_graphs_do_not_hold_up_another_client(secure, peers, raw, guard_of):
    server = secure("--memory-limit", str(ROOMY))
    guard = guard_of(server, peers.victim, memory_limit=ROOMY)
    graphs = [chain_graph(k) for k in range(GRAPHS)]
    attacker = raw(server, peers.attacker)
    attacker.hello()
    answers: list = []
    thread = threading.Thread(target=_register, args=(attacker, graphs, answers))
    started = time.perf_counter()
    thread.start()
    during: list[float] = []
    while thread.is_alive():
        during += round_trip_times(guard.dev, 10)
        guard.sample_rss()
    took = time.perf_counter() - started
    thread.join()
    assert not [a for a in answers if isinstance(a, m.Error)], answers  # all registered
    # the victim's graphs were answered while the attacker's registrations were in progress
    # (queued behind them, it would have got at most one answer per graph)
    assert len(during) >= 50, f"the victim got {len(during)} answers in {took:.2f} s"
    median = statistics.median(during)
    print(
        f"\n{GRAPHS} graphs of {MAX_GRAPH_NODES} nodes registered in {took:.1f} s; victim "
        f"round trips during: median {median * 1e3:.2f} ms, max {max(during) * 1e3:.0f} ms "
        f"({len(during)}); before {guard.base * 1e3:.2f} ms"
    )
    guard.check()


def test_cached_plans_are_charged_so_the_cache_cannot_outgrow_the_limit(
    secure, peers, raw, guard_of
):
    server = secure()  # --memory-limit 64 MiB
    guard = guard_of(server, peers.victim)
    attacker = raw(server, peers.attacker)
    attacker.hello()
    answers: list = []
    _register(attacker, [chain_graph(0)], answers)  # a maximal plan alone is over the limit
    (err,) = [a for a in answers if isinstance(a, m.Error)]
    assert err.code == m.LIMIT and "compiled plan" in err.message, err
    # graphs of 10 000 nodes (about 10 MiB of plan each): the first few fit, the rest are
    # refused; the cache holds no more than the limit
    fits = MEMORY_LIMIT // (PLAN_BYTES_PER_NODE * 10_001)
    answers = []
    _register(attacker, [chain_graph(k, 10_000) for k in range(fits + 4)], answers)
    guard.sample_rss()
    refused = [a for a in answers if isinstance(a, m.Error)]
    assert all(a.code == m.LIMIT for a in refused), refused
    assert 4 <= len(refused) <= 5, (fits, refused)  # the victim's session holds a little
    guard.check()
    attacker.close()
