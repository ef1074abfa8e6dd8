"""Soak: N client sessions against one real `burn-remote serve` for minutes, watching the
server for leaks (issue 35, item 4).

The clients mix every kind of traffic a server sees, round robin over KINDS:
- ``captured`` / ``uncaptured``: the digits MLP trained with and without `br.compile`, the
  loss read every READ_EVERY steps (it must stay finite);
- ``item``: a small graph (matmul, relu, sum) and one ``item()`` per step, checked against
  NumPy: its latencies are the "small step" the p50/p99 figures are of;
- ``bulk``: 8-64 MiB uploads read back whole (must come back byte for byte) and summed;
- ``generate``: greedy decoding on a tiny random GPT, the tokens checked against the same
  model on the local CPU;
- ``lora``: one session submitting a small `lora_finetune` job, waiting for it and
  submitting again (a job still running at the end is cancelled, not counted as an error).

Every 10 s the harness samples the server's RSS, open fds and threads (/proc), its open
sessions and the bytes sessions hold (/metrics) and its data directory's size on disk.
Before the clients start and after they all close, the idle server's fds and threads are
taken once more (leaks show there). At the end it prints errors, RSS growth after warm-up,
fd/thread growth, small-step p50/p99 and steps/s, each beside the issue's target.

Run: flock /tmp/burn-bench.lock .venv/bin/python bench/soak.py [--sessions 50] [--minutes 10]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("item", "captured", "uncaptured", "bulk", "generate", "lora")
"""Client kinds, assigned round robin (``lora``: only the first, one job at a time)."""
READ_EVERY = 10
"""MLP clients read the loss every this many steps."""
BULK_MIB = (8, 64)
"""Upload sizes of a bulk client, MiB (uniform between)."""
SAMPLE_EVERY = 10.0
"""Seconds between samples of the server."""
SETTLE_TIMEOUT = 30.0
"""Seconds the server may take to drop every session after the clients close."""
THREAD_RETIRE = 15.0
"""Seconds an idle server may take to retire its worker threads (trio's cached threads
exit after 10 s idle)."""
TARGETS = {"rss_growth_pct": 5.0, "fd_growth": 0, "thread_growth": 0, "p99_ms": 50.0}
"""The issue's soak targets: RSS growth after warm-up, fd and thread growth, small-step p99."""
GPT_NEW = 16
"""Tokens a generate client asks for per call."""
CAPTURE_CALLS = 4
"""A compiled step's first calls record (until two recordings agree), and `br.compile`
records in one thread at a time (a second thread's capture raises CaptureError; `generate`
captures its decode step anew on every call): captured clients take CAPTURE_LOCK for their
first CAPTURE_CALLS calls, generate clients for every call."""
CAPTURE_LOCK = threading.Lock()


@dataclass
class Client:
    """One session's tally: what it did, how long its small steps took, what went wrong."""

    kind: str
    index: int
    progress: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Sample:
    t: float
    rss: int
    fds: int
    threads: int
    sessions: int
    charged: int
    store: int


@dataclass
class Fixtures:
    """Inputs the clients share, made once: digits, a tiny GPT (with the local tokens the
    remote ones must equal) and the files of a small LoRA job."""

    x: np.ndarray
    y: np.ndarray
    gpt_dir: Path
    prompt: np.ndarray
    want_tokens: np.ndarray
    lora_spec: dict[str, Any]


def make_fixtures(folder: Path) -> Fixtures:
    from burn_remote import Device, nn
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    nn.seed(3)
    cfg = nn.GPTConfig(n_layer=2, n_head=2, d_model=32, vocab=64, context=64)
    nn.GPT(cfg).save_pretrained(folder / "gpt")
    prompt = np.random.default_rng(4).integers(1, cfg.vocab, (2, 8))
    local = nn.GPT.from_pretrained(folder / "gpt", device=Device.cpu())
    want = local.generate(prompt, GPT_NEW, eos_token_id=None)
    nn.seed(0)
    small = nn.GPTConfig(n_layer=1, n_head=2, d_model=32, vocab=64, context=16)
    nn.GPT(small, device=Device.cpu()).save_gpt2(folder / "base.safetensors")
    tokens = np.random.default_rng(0).integers(0, 64, 4000).astype(np.int64)
    np.savez(folder / "tokens.npz", tokens=tokens)
    spec = {
        "kind": "lora_finetune", "seed": 7, "steps": 40, "batch_size": 4,
        "checkpoint_every": 20,
        "model": {"weights": str(folder / "base.safetensors"), "n_head": 2},
        "data": {"path": str(folder / "tokens.npz")},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn", "c_fc"]},
        "optimizer": {"lr": 1e-2},
    }  # fmt: skip
    return Fixtures(x, y, folder / "gpt", prompt, np.asarray(want), spec)


def _mlp_loop(dev: Any, fx: Fixtures, c: Client, until: float, captured: bool) -> None:
    import burn_remote as br
    from burn_remote import functional as F
    from burn_remote import nn, optim

    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=1e-3)

    def train_step(xb: Any, yb: Any) -> Any:
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = br.compile(train_step) if captured else train_step
    n = len(fx.x) - 64
    while time.monotonic() < until:
        i = (c.progress * 64) % n
        xb, yb = dev.tensor(fx.x[i : i + 64]), dev.tensor(fx.y[i : i + 64])
        if captured and c.progress < CAPTURE_CALLS:
            with CAPTURE_LOCK:
                loss = step(xb, yb)
        else:
            loss = step(xb, yb)
        c.progress += 1
        if c.progress % READ_EVERY == 0 and not np.isfinite(value := loss.item()):
            raise ArithmeticError(f"loss {value} at step {c.progress}")
    dev.sync()


def _item_loop(dev: Any, fx: Fixtures, c: Client, until: float) -> None:
    from burn_remote import functional as F

    rng = np.random.default_rng(c.index)
    w_np = rng.standard_normal((64, 64)).astype(np.float32)
    w = dev.tensor(w_np)
    while time.monotonic() < until:
        x_np = rng.standard_normal((32, 64)).astype(np.float32)
        x = dev.tensor(x_np)
        t0 = time.perf_counter()
        got = F.relu(x @ w).sum().item()
        c.latencies.append(time.perf_counter() - t0)
        want = float(np.maximum(x_np @ w_np, 0).sum())
        if abs(got - want) > 1e-3 * max(1.0, abs(want)):
            raise ArithmeticError(f"item() gave {got}, NumPy {want}")
        c.progress += 1


def _bulk_loop(dev: Any, fx: Fixtures, c: Client, until: float, mib: tuple[int, int]) -> None:
    rng = np.random.default_rng(1000 + c.index)
    while time.monotonic() < until:
        n = int(rng.integers(mib[0], mib[1] + 1)) << 18  # float32s in that many MiB
        data = rng.standard_normal(n, dtype=np.float32)
        t = dev.tensor(data)
        back = t.numpy()
        if not np.array_equal(back, data):
            raise ValueError(f"a {n * 4 >> 20} MiB upload came back different")
        total = t.sum().item()
        if abs(total - float(data.sum(dtype=np.float64))) > 1e-3 * n**0.5 + 1:
            raise ArithmeticError(f"sum of a {n * 4 >> 20} MiB upload: {total}")
        del t, back, data
        c.progress += 1


def _generate_loop(dev: Any, fx: Fixtures, c: Client, until: float) -> None:
    from burn_remote import nn

    model = nn.GPT.from_pretrained(fx.gpt_dir, device=dev)
    while time.monotonic() < until:
        with CAPTURE_LOCK:  # every call captures its decode step anew
            got = model.generate(fx.prompt, GPT_NEW, eos_token_id=None)
        if not np.array_equal(np.asarray(got), fx.want_tokens):
            raise ValueError("remote generate differs from the local CPU's tokens")
        c.progress += 1


def _lora_loop(dev: Any, fx: Fixtures, c: Client, until: float) -> None:
    while time.monotonic() < until:
        job = dev.jobs.submit(fx.lora_spec)
        while (state := job.status()["state"]) in ("queued", "running"):
            if time.monotonic() >= until:
                job.cancel()
                return
            time.sleep(0.5)
        if state != "succeeded":
            raise RuntimeError(f"job {job.id} {state}: {job.info.get('error')}")
        c.progress += 1


def run_client(target: str, key: Path, fx: Fixtures, c: Client, until: float, **kw: Any) -> None:
    """One session of kind ``c.kind`` until ``until``; an error ends it and is tallied."""
    from burn_remote import RemoteDevice

    loops: dict[str, Callable[..., None]] = {
        "captured": lambda *a: _mlp_loop(*a, captured=True),
        "uncaptured": lambda *a: _mlp_loop(*a, captured=False),
        "item": _item_loop,
        "bulk": lambda *a: _bulk_loop(*a, mib=kw.get("bulk_mib", BULK_MIB)),
        "generate": _generate_loop,
        "lora": _lora_loop,
    }
    dev = None
    try:
        dev = RemoteDevice(target, key=key)
        loops[c.kind](dev, fx, c, until)
    except Exception as exc:  # tallied and reported; the other clients go on
        c.errors.append(f"{c.kind}[{c.index}] {type(exc).__name__}: {exc}")
    finally:
        if dev is not None:
            try:
                dev.close()
            except Exception as exc:
                c.errors.append(f"{c.kind}[{c.index}] close: {type(exc).__name__}: {exc}")


def kinds_for(sessions: int) -> list[str]:
    """Round robin over KINDS, one LoRA session at most (one job at a time)."""
    others = [k for k in KINDS if k != "lora"]
    out = ["lora"] if sessions >= len(KINDS) else []
    out += [others[i % len(others)] for i in range(sessions - len(out))]
    return out


def _proc(pid: int) -> tuple[int, int, int]:
    """The server's RSS (bytes), open fds and threads, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def _metrics(http: str | None) -> dict[str, float]:
    if not http:
        return {}
    text = urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def sample(server: Any, t0: float) -> Sample:
    rss, fds, threads = _proc(server.proc.pid)
    met = _metrics(server.http)
    return Sample(
        time.monotonic() - t0, rss, fds, threads, int(met.get("burn_remote_sessions", -1)),
        int(met.get("burn_remote_memory_charged_bytes", -1)), _du(server.data_dir),
    )  # fmt: skip


@dataclass
class Report:
    clients: list[Client]
    samples: list[Sample]
    idle_before: Sample
    idle_after: Sample
    wall: float
    warmup: float

    @property
    def errors(self) -> list[str]:
        return [e for c in self.clients for e in c.errors]

    @property
    def latencies(self) -> list[float]:
        return [t for c in self.clients for t in c.latencies]

    def rss_growth_pct(self) -> float:
        """Median RSS of the last third of the samples after the warm-up against that of
        the first third, percent (medians: bulk clients swing RSS by their uploads)."""
        warm = [s.rss for s in self.samples if s.t >= self.warmup] or [
            s.rss for s in self.samples[-1:]
        ]
        third = max(1, len(warm) // 3)
        return (statistics.median(warm[-third:]) / statistics.median(warm[:third]) - 1) * 100


def run_soak(
    server: Any,
    folder: Path,
    sessions: int,
    seconds: float,
    warmup: float,
    every: float = SAMPLE_EVERY,
    on_sample: Callable[[Sample], None] | None = None,
    **kw: Any,
) -> Report:
    """Run ``sessions`` clients for ``seconds`` against ``server`` (a testing.Daemon; its
    ``http`` port, when it has one, gives sessions and held bytes); returns the tally.
    A short pass of one client of every kind runs first, so lazily started threads and
    caches count as the baseline rather than as growth."""
    folder.mkdir(parents=True, exist_ok=True)
    fx = make_fixtures(folder)
    kinds = kinds_for(sessions)
    warm = [Client(k, 900 + i) for i, k in enumerate(dict.fromkeys(kinds))]
    _run_all(server, folder, fx, warm, 2.0, kw)
    _settle(server)
    idle_before = sample(server, time.monotonic())
    clients = [Client(k, i) for i, k in enumerate(kinds)]
    samples: list[Sample] = []
    t0 = time.monotonic()
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(every):
            samples.append(s := sample(server, t0))
            if on_sample is not None:
                on_sample(s)

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    _run_all(server, folder, fx, clients, seconds, kw)
    wall = time.monotonic() - t0
    stop.set()
    watcher.join()
    _settle(server, threads_at_most=idle_before.threads)
    idle_after = sample(server, t0)
    for w in warm:
        for e in w.errors:
            clients[0].errors.append(f"warm-up: {e}")
    return Report(clients, samples, idle_before, idle_after, wall, warmup)


def _run_all(
    server: Any, folder: Path, fx: Fixtures, clients: list[Client], seconds: float, kw: Any
) -> None:
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=run_client,
            args=(server.target, folder / f"key{c.index:04d}", fx, c, until),
            kwargs=kw,
            daemon=True,
        )
        for c in clients
    ]
    for t in threads:
        t.start()
    for t, c in zip(threads, clients, strict=True):
        t.join(max(0.0, until - time.monotonic()) + 120)
        if t.is_alive():
            c.errors.append(f"{c.kind}[{c.index}] still running 120 s past the end")


def _settle(server: Any, threads_at_most: int | None = None) -> None:
    """Wait until the server holds no session (when /metrics says), then a moment more;
    with ``threads_at_most``, also until its threads are back to that many, for at most
    THREAD_RETIRE seconds (idle worker threads retire then: a grown pool is not a leak)."""
    end = time.monotonic() + SETTLE_TIMEOUT
    while server.http and time.monotonic() < end:
        if _metrics(server.http).get("burn_remote_sessions", 0) == 0:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    end = time.monotonic() + THREAD_RETIRE
    while threads_at_most is not None and time.monotonic() < end:
        if _proc(server.proc.pid)[2] <= threads_at_most:
            break
        time.sleep(0.5)


def summary(r: Report) -> list[str]:
    """The figures beside the issue's targets."""

    def mark(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    lat = sorted(r.latencies)
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [float("nan")] * 99
    steps = sum(c.progress for c in r.clients if c.kind in ("captured", "uncaptured", "item"))
    growth = r.rss_growth_pct()
    fd_growth = r.idle_after.fds - r.idle_before.fds
    th_growth = r.idle_after.threads - r.idle_before.threads
    errs = r.errors
    ok = {
        "rss": growth <= TARGETS["rss_growth_pct"],
        "fd": fd_growth <= TARGETS["fd_growth"],
        "th": th_growth <= TARGETS["thread_growth"],
        "p99": q[98] * 1e3 <= TARGETS["p99_ms"],
    }
    by_kind: dict[str, int] = {}
    for c in r.clients:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + c.progress
    return [
        f"sessions {len(r.clients)}  wall {r.wall:.0f} s  progress by kind "
        + "  ".join(f"{k} {n}" for k, n in by_kind.items()),
        f"errors              {len(errs):8d}   target 0          {mark(not errs)}"
        + "".join(f"\n    {e[:300]}" for e in errs[:5]),
        f"RSS growth (>{r.warmup:.0f}s) {growth:8.1f} %  target <= 5 %     {mark(ok['rss'])}"
        f"  (idle {r.idle_before.rss / 2**20:.0f} -> {r.idle_after.rss / 2**20:.0f} MiB)",
        f"fd growth (idle)    {fd_growth:8d}   target 0          {mark(ok['fd'])}"
        f"  ({r.idle_before.fds} -> {r.idle_after.fds})",
        f"thread growth       {th_growth:8d}   target 0          {mark(ok['th'])}"
        f"  ({r.idle_before.threads} -> {r.idle_after.threads})",
        f"small step p50      {q[49] * 1e3:8.1f} ms",
        f"small step p99      {q[98] * 1e3:8.1f} ms  target <= 50 ms  {mark(ok['p99'])}",
        f"steps/s (MLP+item)  {steps / r.wall:8.0f}      ({steps} steps)",
    ]


def _print_sample(s: Sample) -> None:
    print(
        f"  t {s.t:5.0f} s  rss {s.rss / 2**20:7.1f} MiB  fds {s.fds:4d}  threads {s.threads:3d}"
        f"  sessions {s.sessions:3d}  held {s.charged / 2**20:7.1f} MiB"
        f"  store {s.store / 2**20:6.1f} MiB",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                    help="RSS growth is measured from here (default: a fifth of the run)")  # fmt: skip
    args = ap.parse_args()
    sessions = max(1, min(args.sessions, 200))
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else seconds / 5
    home = Path(tempfile.mkdtemp(prefix="burn-remote-soak-"))
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = str(home)
    from burn_remote.server.testing import start_server

    server = start_server(home / "server", "--http", "0")
    print(f"server pid {server.proc.pid}; {sessions} sessions for {seconds:.0f} s "
          f"({', '.join(kinds_for(sessions))})", flush=True)  # fmt: skip
    try:
        report = run_soak(server, home / "client", sessions, seconds, warmup,
                          on_sample=_print_sample)  # fmt: skip
        print(f"idle before: fds {report.idle_before.fds} threads {report.idle_before.threads}"
              f"  after: fds {report.idle_after.fds} threads {report.idle_after.threads}")  # fmt: skip
    finally:
        code = server.stop()
    for line in summary(report):
        print(line)
    print(f"server exit status {code}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs (a shared, loaded machine scales every figure)")  # fmt: skip
    sys.exit(1 if report.errors else 0)


if __name__ == "__main__":
    main()
