"""The optional operator port (``serve --http [HOST:]PORT``, ``relay --http``): ``/healthz``
and Prometheus ``/metrics`` over HTTP/1.1, beside the QUIC endpoint.

Metrics are read from the server's state when scraped (a ``prometheus_client`` collector),
so the hot paths only bump plain counters. prometheus_client is imported here only, when
the port is asked for.

Bounded against whoever can reach it: one thread and one selector loop serve every
connection (``_listener``), parsed by h11 (sans-I/O HTTP/1.1), at most
``HTTP_MAX_CONNECTIONS`` in flight (``HTTP_MAX_PER_HOST`` per IP), each answered and closed
within ``HTTP_DEADLINE`` of its accept however slowly it sends, with a request head of at
most ``HTTP_MAX_HEAD`` bytes. It binds 127.0.0.1 unless told a host. With a token
(``--http-token-file`` or ``BURN_REMOTE_HTTP_TOKEN``) every path but ``/healthz`` wants
``Authorization: Bearer TOKEN``; ``/healthz`` stays open because orchestrators' probes
(Kubernetes ``httpGet``) cannot read a secret, and it tells only ok or stalled.
"""

from __future__ import annotations

import hmac
import json
import logging
import selectors
import socket
from collections.abc import Callable, Iterator
from typing import Any

import h11

from . import _status
from ._listener import BoundedListener, Slot

log = logging.getLogger("burn_remote.server")

HTTP_MAX_CONNECTIONS = 32
"""Connections the operator port serves at once (a newer one closes the oldest unfinished)."""
HTTP_MAX_PER_HOST = 8
"""Of those, how many one IP address may hold."""
HTTP_DEADLINE = 10.0
"""Seconds from accept by which a connection's request must have arrived and its answer
been sent (one request per connection); a scrape of /metrics takes milliseconds."""
HTTP_MAX_HEAD = 8 * 1024
"""Bytes of request line and headers accepted (more: 431)."""
HTTP_TOKEN_ENV = "BURN_REMOTE_HTTP_TOKEN"
"""The environment variable that holds the operator port's bearer token, if any."""
OPEN_PATHS = ("/healthz",)
"""Paths served without the token (see the module's docstring for why)."""


class _Collector:
    """Turns one status snapshot into metric families at every scrape."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = self.state
        snap = _status.snapshot(state, 0.0)
        traffic, cache, mem = snap["traffic"], snap["plan_cache"], snap["memory"]

        def gauge(name: str, doc: str, value: float) -> Any:
            return GaugeMetricFamily(f"burn_remote_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> Any:
            return CounterMetricFamily(f"burn_remote_{name}", doc, value=value)

        yield gauge("sessions", "Client sessions open now.", len(snap["sessions"]))
        yield gauge(
            "sessions_max",
            "Sessions the server admits (--max-sessions).",
            state.limits.max_sessions,
        )
        yield counter("messages", "Client messages handled.", traffic["messages"])
        yield counter("steps", "ExecuteGraph steps run for sessions.", traffic["steps"])
        yield counter("replays", "Plan runs by the engine (sessions and jobs).", cache["replays"])
        yield counter("graphs_compiled", "Graphs compiled into plans.", cache["compiled"])
        yield gauge("plan_cache_plans", "Compiled plans cached now.", cache["plans"])
        yield gauge(
            "plan_cache_capacity", "Plans the cache keeps (--plan-cache).", cache["capacity"]
        )
        yield counter(
            "received_bytes", "Tensor bytes uploaded by clients.", traffic["bytes_received"]
        )
        yield counter("sent_bytes", "Tensor bytes read back by clients.", traffic["bytes_sent"])
        pools = GaugeMetricFamily(
            "burn_remote_memory_bytes",
            "Device memory by pool: reserved from the device, and in use by live tensors.",
            labels=["pool", "kind"],
        )
        for row in mem["pools"]:
            pools.add_metric([row["pool"], "reserved"], row["reserved"])
            pools.add_metric([row["pool"], "in_use"], row["in_use"])
        yield pools
        yield gauge(
            "memory_charged_bytes", "Bytes sessions and jobs hold (the ledger).", mem["in_use"]
        )
        yield gauge("memory_peak_bytes", "Highest ledger total since start.", mem["peak"])
        yield gauge(
            "memory_limit_bytes", "The server's memory limit (--memory-limit).", mem["limit"]
        )
        jobs = snap["jobs"]
        if jobs is not None:
            by_state = GaugeMetricFamily("burn_remote_jobs", "Jobs by state.", labels=["state"])
            for name, n in jobs["by_state"].items():
                by_state.add_metric([name], n)
            yield by_state
            yield gauge(
                "jobs_storage_error",
                "1 while the job runner waits out a storage error (full disk).",
                1 if jobs["storage_error"] else 0,
            )
        yield from _engine_families(snap["engine"])
        errors = CounterMetricFamily("burn_remote_errors", "Errors by kind.", labels=["kind"])
        for kind, n in sorted(snap["errors"].items()):
            errors.add_metric([kind], n)
        yield errors
        yield gauge("uptime_seconds", "Seconds since the server started.", snap["uptime_s"])


def _engine_families(engine: dict[str, Any]) -> Iterator[Any]:
    """The engine's fair turns (``_fair.FairShare.shares``): per flow (a peer's sessions, or
    a job) its weight, engine seconds and turns used, turns waiting, and recent share."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield GaugeMetricFamily(
        "burn_remote_engine_slots", "Engine turns that run at once.", value=engine["slots"]
    )
    yield GaugeMetricFamily(
        "burn_remote_engine_busy", "Engine turns running now.", value=engine["busy"]
    )
    labels = ["flow", "kind"]
    families: dict[str, Any] = {
        "seconds": CounterMetricFamily(
            "burn_remote_engine_seconds", "Engine seconds used, by flow.", labels=labels
        ),
        "turns": CounterMetricFamily(
            "burn_remote_engine_turns", "Engine turns run, by flow.", labels=labels
        ),
        "waiting": GaugeMetricFamily(
            "burn_remote_engine_waiting", "Engine turns waiting now, by flow.", labels=labels
        ),
        "share": GaugeMetricFamily(
            "burn_remote_engine_share",
            "Part of the engine time used lately (10 s half-life), by flow.",
            labels=labels,
        ),
        "weight": GaugeMetricFamily(
            "burn_remote_engine_weight",
            "A flow's weight in the fair queue (sessions 1, jobs less).",
            labels=labels,
        ),
    }
    for flow in engine["flows"]:
        for key, family in families.items():
            family.add_metric([flow["flow"], flow["kind"]], flow[key])
    yield from families.values()


class _RelayCollector:
    """The relay's counters and record count at every scrape."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.relay.stats
        for name, doc in (
            ("forwarded", "Datagrams forwarded between peers."),
            ("forwarded_bytes", "Bytes forwarded between peers."),
            ("accepted_records", "Signed address records accepted."),
            ("refused_records", "Address records refused (unsigned, stale, replayed)."),
            ("auth_failures", "Peers that failed the key challenge."),
            (
                "refused_registrations",
                "Registrations refused: their IP address, network or the table was full.",
            ),
            ("unroutable", "Datagrams for peers the relay does not know."),
            ("observed", "OBSERVE requests answered (peers learning their public address)."),
            ("limited", "Datagrams dropped: their sender was over a per-peer limit."),
            ("limited_bytes", "Bytes dropped: their sender was over a per-peer limit."),
        ):
            yield CounterMetricFamily(f"burn_remote_relay_{name}", doc, value=getattr(stats, name))
        records = len(self.relay.store)
        yield GaugeMetricFamily("burn_remote_relay_records", "Address records held.", value=records)


def relay_health(relay: Any, heartbeat: Any) -> Callable[[], tuple[bool, dict[str, Any]]]:
    import time

    def health() -> tuple[bool, dict[str, Any]]:
        silent = time.monotonic() - heartbeat.last
        late = max(getattr(heartbeat, "lag", 0.0), silent - _status.HEARTBEAT, 0.0)
        ok = silent < _status.HEALTH_STALL
        return ok, {"status": "ok" if ok else "stalled", "loop_lag_s": round(late, 3)}

    return health


Answer = tuple[int, str, bytes]
"""(status, content type, body)."""


def _pages(health: Callable[[], tuple[bool, Any]], collector: Any) -> Callable[[str], Answer]:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)

    def page(path: str) -> Answer:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
        if path == "/healthz":
            ok, body = health()
            return (200 if ok else 503), "application/json", json.dumps(body).encode()
        return 404, "text/plain", b"burn-remote: /healthz and /metrics live here\n"

    return page


class _Exchange:
    """One connection's request and answer (h11's state, and the bytes still to send)."""

    __slots__ = ("h", "out")

    def __init__(self) -> None:
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=HTTP_MAX_HEAD)
        self.out = b""


class OperatorPort(BoundedListener):
    """The running HTTP port; ``address`` is where it listens (port 0 picks one).
    ``OperatorPort(state, bind)`` serves a compute server; a relay passes its own
    ``health`` and ``collector``. ``token``: the bearer token every path but /healthz wants
    (None: none)."""

    name = "http port"

    def __init__(
        self,
        state: Any,
        bind: tuple[str, int],
        health: Callable[[], tuple[bool, Any]] | None = None,
        collector: Any = None,
        token: str | None = None,
    ) -> None:
        if health is None:
            health = lambda: _status.health(state)  # noqa: E731
        self.page = _pages(health, collector if collector is not None else _Collector(state))
        self.token = token.encode() if token else None
        super().__init__(bind[0], bind[1], HTTP_MAX_CONNECTIONS, HTTP_MAX_PER_HOST)
        self.start("burn-remote-http")

    def deadline_s(self) -> float:
        return HTTP_DEADLINE

    def ready(self, slot: Slot, events: int) -> None:
        ex: _Exchange = slot.state if slot.state is not None else _Exchange()
        slot.state = ex
        if ex.out:
            self._flush(slot, ex)
            return
        try:
            data = slot.conn.recv(HTTP_MAX_HEAD)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.drop(slot)
            return
        try:
            ex.h.receive_data(data)
            event = ex.h.next_event()
            if event is h11.NEED_DATA:
                if not data:
                    self.drop(slot)
                return
            if not isinstance(event, h11.Request):
                self.drop(slot)
                return
            status, kind, body = self._answer(event)
        except h11.RemoteProtocolError as exc:
            status, kind = exc.error_status_hint, "text/plain"  # h11 lets a server answer it
            body = f"bad request: {exc}\n".encode()
        head = [("Content-Type", kind), ("Content-Length", str(len(body))),
                ("Connection", "close")]  # fmt: skip
        if status == 401:
            head.append(("WWW-Authenticate", 'Bearer realm="burn-remote"'))
        ex.out = ex.h.send(h11.Response(status_code=status, headers=head)) or b""
        ex.out += (ex.h.send(h11.Data(data=body)) or b"") + (ex.h.send(h11.EndOfMessage()) or b"")
        self.watch(slot, selectors.EVENT_WRITE)
        self._flush(slot, ex)

    def _answer(self, request: h11.Request) -> Answer:
        path = request.target.decode("ascii", "replace").partition("?")[0]
        if request.method not in (b"GET", b"HEAD"):
            return 405, "text/plain", b"GET only\n"
        if self.token is not None and path not in OPEN_PATHS:
            given = dict(request.headers).get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + self.token):
                return 401, "text/plain", b"this path wants Authorization: Bearer TOKEN\n"
        try:
            status, kind, body = self.page(path)
        except Exception as exc:  # noqa: BLE001 - a scrape's failure is the scraper's answer
            log.exception("http port: %s failed", path)
            return 500, "text/plain", f"{path} failed: {exc}\n".encode()
        return status, kind, b"" if request.method == b"HEAD" else body

    def _flush(self, slot: Slot, ex: _Exchange) -> None:
        try:
            sent = slot.conn.send(ex.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.drop(slot)
            return
        ex.out = ex.out[sent:]
        if not ex.out:
            try:
                slot.conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.drop(slot)


def read_token(path: str | None) -> str | None:
    """The operator port's bearer token: the file's first line if ``path``, else
    ``$BURN_REMOTE_HTTP_TOKEN``, else None. Raises ValueError naming what is wrong."""
    import os

    if path:
        try:
            with open(path) as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ValueError(f"--http-token-file {path}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"--http-token-file {path}: the file is empty")
        return token
    return os.environ.get(HTTP_TOKEN_ENV, "").strip() or None


def warn_if_open(bind: tuple[str, int], token: str | None, program: str) -> None:
    """Say so on stderr when the port is reachable beyond this host with no token."""
    import ipaddress
    import sys

    try:
        loopback = ipaddress.ip_address(bind[0]).is_loopback
    except ValueError:
        loopback = bind[0] == "localhost"
    if not loopback and token is None:
        print(f"{program}: warning: --http {bind[0]} serves /metrics to anyone who reaches it; "
              f"set --http-token-file or {HTTP_TOKEN_ENV}", file=sys.stderr)  # fmt: skip


__all__ = ["HTTP_TOKEN_ENV", "OperatorPort", "read_token", "relay_health", "warn_if_open"]
