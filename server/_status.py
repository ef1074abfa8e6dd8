"""What an operator sees of a running server: one snapshot, read by ``burn-remote status``
(the ServerStatus message), ``/healthz`` and ``/metrics`` alike, so they never disagree.
"""

from __future__ import annotations

import time
from typing import Any

HEARTBEAT = 0.5
"""Seconds between the network loop's ticks that ``/healthz`` checks."""
HEALTH_STALL = 5.0
"""Seconds without a tick of the network loop after which ``/healthz`` answers 503: a loop
that stopped turning serves no one, whatever else is fine."""


def memory(state: Any) -> dict[str, Any]:
    """The ledger (every byte sessions and jobs hold) and, where the backend has pools
    (CuPy), what each pool reserves and uses."""
    with state.lock:
        out: dict[str, Any] = {
            "in_use": state.bytes,
            "held": state.held,
            "peak": state.peak_bytes,
            "limit": state.limits.memory_limit,
            "tensors": state.tensors,
        }
    pools = []
    if state.backend.reports_memory:
        try:
            stats = state.backend.memory_stats()
            pools = [
                {"pool": r.name, "reserved": r.reserved, "in_use": r.in_use} for r in stats.rows
            ]
        except Exception:  # a backend without pools (or mid-teardown) just has no rows
            pools = []
    out["pools"] = pools or [
        {"pool": "tensors", "reserved": out["in_use"], "in_use": out["in_use"]}
    ]
    return out


def jobs(state: Any) -> dict[str, Any] | None:
    service = state.jobs
    if service is None:
        return None
    running = service.running
    return {
        "by_state": service.store.counts(),
        "running_bytes": running.nbytes if running is not None else 0,
        "storage_error": service.storage_error,
        "runner_alive": service._thread.is_alive(),
    }


def health(state: Any) -> tuple[bool, dict[str, Any]]:
    """(healthy, body): unhealthy only when the network loop stopped ticking.

    ``loop_lag_s`` is how late the loop's last tick woke, or, while a tick is overdue, how
    overdue it is: about 0 on an idle server (the time since the last tick, up to
    HEARTBEAT, is not a delay)."""
    lag = time.monotonic() - state.heartbeat
    late = max(getattr(state, "loop_lag", 0.0), lag - HEARTBEAT)
    body: dict[str, Any] = {
        "status": "ok" if lag < HEALTH_STALL else "stalled",
        "loop_lag_s": round(max(0.0, late), 3),
        "sessions": len(state.sessions),
        "uptime_s": round(time.monotonic() - state.started, 1),
    }
    job_view = jobs(state) if state.jobs is not None else None
    if job_view is not None:
        body["jobs"] = "ok" if job_view["storage_error"] is None else "waiting for storage"
        if job_view["storage_error"]:
            body["jobs_error"] = job_view["storage_error"]
    return lag < HEALTH_STALL, body


def snapshot(state: Any, now: float) -> dict[str, Any]:
    """Everything ``burn-remote status`` shows; ``now`` is the sessions' clock."""
    with state.lock:
        sessions = list(state.sessions.values())
        counters = state.traffic()
        errors = dict(state.errors)
    executor = state.executor
    return {
        "peer_id": state.peer_id,
        "device": state.device,
        "uptime_s": round(time.monotonic() - state.started, 1),
        "sessions": [
            {
                "id": s.id,
                "peer": s.peer_id,
                "tensors": len(s.store),
                "bytes": s.nbytes,
                "group_bytes": getattr(s, "group_bytes", 0),
                "peak": s.peak,
                "messages": s.messages,
                "idle_s": round(max(0.0, now - s.last_active), 1),
            }
            for s in sessions
        ],
        "memory": memory(state),
        "plan_cache": {
            "plans": len(executor._plans),
            "capacity": executor.cache_size,
            "compiled": executor.compiled,
            "replays": executor.replays,
        },
        "traffic": counters,
        "jobs": jobs(state),
        "engine": state.fair.shares(),
        "errors": errors,
        "limits": {
            "max_sessions": state.limits.max_sessions,
            "session_memory": state.limits.session_memory,
            "memory_limit": state.limits.memory_limit,
        },
    }


def engine_lines(engine: dict[str, Any] | None) -> list[str]:
    """``burn-remote status``'s lines on the engine's fair turns (none for an older server
    that does not report them)."""
    if not engine:
        return []
    lines = [
        f"engine: {engine['busy']}/{engine['slots']} turns running, "
        f"turns of {engine['slice_s'] * 1000:.0f} ms"
    ]
    for f in engine["flows"]:
        who = f["flow"] if f["kind"] == "job" else f"peer {f['flow'][:12]}..."
        lines.append(
            f"  {who}  weight {f['weight']:g}  share {f['share']:.0%}  "
            f"{f['seconds']:.1f} s in {f['turns']} turns  {f['waiting']} waiting"
        )
    return lines


__all__ = ["HEALTH_STALL", "engine_lines", "health", "jobs", "memory", "snapshot"]
