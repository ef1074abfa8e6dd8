"""The optional operator port (``serve --http HOST:PORT``): ``/healthz`` and Prometheus
``/metrics``, served by a small threaded WSGI server beside the QUIC endpoint.

Metrics are read from the server's state when scraped (a ``prometheus_client`` collector),
so the hot paths only bump plain counters. prometheus_client is imported here only, when
the port is asked for.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from . import _status

log = logging.getLogger("burn_remote.server")


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
        errors = CounterMetricFamily("burn_remote_errors", "Errors by kind.", labels=["kind"])
        for kind, n in sorted(snap["errors"].items()):
            errors.add_metric([kind], n)
        yield errors
        yield gauge("uptime_seconds", "Seconds since the server started.", snap["uptime_s"])


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (stdlib's name)
        log.debug("http: " + format, *args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


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
        lag = time.monotonic() - heartbeat.last
        ok = lag < _status.HEALTH_STALL
        return ok, {"status": "ok" if ok else "stalled", "loop_lag_s": round(lag, 3)}

    return health


def _app(health: Callable[[], tuple[bool, Any]], collector: Any) -> Callable[..., Any]:
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    registry.register(collector)
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            ok, body = health()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"burn-remote: /healthz and /metrics live here\n"]

    return app


class OperatorPort:
    """The running HTTP server; ``address`` is where it listens (port 0 picks one).
    ``OperatorPort(state, bind)`` serves a compute server; a relay passes its own
    ``health`` and ``collector``."""

    def __init__(
        self,
        state: Any,
        bind: tuple[str, int],
        health: Callable[[], tuple[bool, Any]] | None = None,
        collector: Any = None,
    ) -> None:
        if health is None:
            health = lambda: _status.health(state)  # noqa: E731
        app = _app(health, collector if collector is not None else _Collector(state))
        cls = _ThreadingServer6 if ":" in bind[0] else _ThreadingServer
        self._server = make_server(bind[0], bind[1], app, server_class=cls, handler_class=_Quiet)
        self.address: tuple[str, int] = self._server.server_address[:2]  # type: ignore[assignment]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="burn-remote-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


__all__ = ["OperatorPort", "relay_health"]
