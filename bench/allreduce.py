"""All-reduce bus bandwidth: burn-remote's ring between servers beside PyTorch's gloo.

One run starts N ``burn-remote serve --device cpu`` processes on loopback (each knowing the
others' addresses), sets up a ``collective.Group`` over them, and N gloo processes
(``torch.distributed``, CPU, loopback TCP). For each size it alternates ring and gloo
measurements (interleaved, so both see the same machine load), and prints medians:

- ring: a float32 tensor already on every server; the time from recording the ``all_reduce``
  on every rank to every rank's ``sync()`` answered (so it includes one small message to and
  one answer from every rank: the client sends all of them within ~0.6 ms, but each server
  must wake and run its message first, which on a busy 2-core machine takes it 1-3 ms);
- gloo: ``dist.all_reduce`` on every rank, the slowest rank's time;
- coll: the ring's all-reduce as the servers timed it (their debug log): from the moment
  the last rank entered it to the moment the last rank finished -- what gloo's figure is
  (timed after a barrier), without the client's messages and the ranks' start skew;
- enter: from the client's start to the moment the last rank entered the all-reduce;
  reply: from the moment the last rank finished to the client holding every answer
  (ring = enter + coll + reply, on one host's clock; the part gloo's figure has no
  counterpart of);
- bus bandwidth = size * 2 (N - 1) / N / time (the bytes each rank sends and receives, as
  nccl-tests reports it), and the ratio ring / gloo (>= 1.0: the ring is as fast or faster).

- cpu-s/op: CPU seconds (user + system, from /proc) each ring server spent per
  all-reduce, a figure the machine's load inflates far less than wall time; gloo cpu: the
  same for a gloo rank (its process time around ``dist.all_reduce``).

``--planes shm tcp sealed quic`` measures side by side the servers' data plane as it runs
on one host (shm: the byte stream through a shared-memory buffer, counts over TCP; the
default), the same over loopback TCP (plain records after an authenticated hello), with
AES-256-GCM records (as between hosts) and the fallback over their QUIC links.

Usage::

    .venv/bin/python bench/allreduce.py [--ranks 2 3 4] [--mib 1 4 16 64 256] [--repeats 5]
        [--planes shm tcp sealed quic]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- gloo ---------------------------------------------------------------------------------------
def _gloo_worker(rank: int, size: int, port: int, jobs, results) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    tensors: dict[int, torch.Tensor] = {}
    while (job := jobs.get()) is not None:
        nbytes = job
        t = tensors.get(nbytes)
        if t is None:
            t = tensors[nbytes] = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        results.put((rank, time.perf_counter() - t0, time.process_time() - c0))
    dist.destroy_process_group()


class Gloo:
    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.jobs = [ctx.Queue() for _ in range(size)]
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(target=_gloo_worker, args=(r, size, port, self.jobs[r], self.results))
            for r in range(size)
        ]
        for p in self.procs:
            p.start()
        self.cpu = 0.0
        """CPU seconds per rank, summed over the all-reduces timed (process time of the
        gloo worker around dist.all_reduce: its own threads included)."""

    def time(self, nbytes: int) -> float:
        """The slowest rank's time; ``self.cpu`` adds the ranks' CPU seconds."""
        for q in self.jobs:
            q.put(nbytes)
        got = [self.results.get(timeout=600) for _ in self.jobs]
        self.cpu += sum(c for _, _, c in got) / len(got)
        return max(t for _, t, _ in got)

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


# -- the ring ----------------------------------------------------------------------------------
class Ring:
    def __init__(self, size: int, tmp: Path, plane: str = "shm") -> None:
        from burn_remote import RemoteDevice
        from burn_remote import collective as C
        from burn_remote.server.testing import start_server

        self.C = C
        flags = ["--session-memory", str(4 * 2**30), "--log-level", "debug"]
        if plane == "quic":  # the fallback: no TCP data plane, ring data on the QUIC links
            flags += ["--ring-port", "off"]
        if plane == "sealed":  # AES-256-GCM records, as between servers on different hosts
            flags += ["--ring-seal-loopback"]
        if plane == "tcp":  # plain records over loopback TCP, not through shared memory
            flags += ["--ring-loopback-tcp"]
        self.daemons = [start_server(tmp / f"s{k}", *flags) for k in range(size)]
        for d in self.daemons:
            d.know(*[o for o in self.daemons if o is not d])
        self.devices = [RemoteDevice(d.target) for d in self.daemons]
        self.group = C.Group(self.devices, timeout=600)
        self.tensors: dict[int, list] = {}
        self.calls = 0
        self.started = self.ended = 0.0
        """time.time() around the last timed all-reduce (the clock of the servers' log)."""

    def collective(self) -> tuple[float, float, float]:
        """The last all-reduce as the servers saw it: from the moment the last rank entered
        it to the moment the last rank finished (their debug log; one clock, one host);
        with the client's wait before it (its start to the last entry) and after it (the
        last finish to its end)."""
        seq = self.calls - 1
        deadline = time.monotonic() + 10
        while True:
            spans = [_span(d.output(), seq) for d in self.daemons]
            if all(spans) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if not all(spans):
            return (float("nan"),) * 3
        entered, done = max(a for a, _ in spans), max(b for _, b in spans)
        return done - entered, entered - self.started, self.ended - done

    def time(self, nbytes: int) -> float:
        import numpy as np

        xs = self.tensors.get(nbytes)
        if xs is None:
            self.tensors.clear()  # one size at a time on the servers
            xs = self.tensors[nbytes] = [d.tensor(np.ones(nbytes // 4, np.float32))
                                         for d in self.devices]  # fmt: skip
            self.C.sync(self.devices)
        self.started = time.time()  # the servers' log clock
        t0 = time.perf_counter()
        outs = [self.C.all_reduce(x, self.group, "sum") for x in xs]
        self.C.sync(self.devices)
        dt = time.perf_counter() - t0
        self.ended = time.time()
        self.calls += 1
        del outs
        return dt

    def check(self) -> None:
        import numpy as np

        xs = [d.tensor(np.full(1001, float(k), np.float32)) for k, d in enumerate(self.devices)]
        outs = [self.C.all_reduce(x, self.group, "sum") for x in xs]
        self.calls += 1
        want = sum(range(len(xs)))
        assert np.all(outs[-1].numpy() == want), "the ring gave a wrong sum"

    def close(self) -> None:
        self.group.close()
        for d in self.devices:
            d.close()
        for d in self.daemons:
            d.stop()


_SPAN = re.compile(r"all_reduce #(\d+) \(\d+ bytes, \w+\): entered ([\d.]+), done ([\d.]+)")


def _span(log: str, seq: int) -> tuple[float, float] | None:
    for found in _SPAN.finditer(log):
        if int(found.group(1)) == seq:
            return float(found.group(2)), float(found.group(3))
    return None


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (/proc; load inflates it far less
    than wall time)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="unmeasured all-reduces per size first, for both (default 4: a server reuses "
        "a former result's memory once the client has dropped it, which the client tells "
        "it with its next messages; until then each result is new memory, whose first "
        "touch costs page faults and, with transparent huge pages, compaction)",
    )
    ap.add_argument(
        "--planes",
        nargs="+",
        choices=("shm", "tcp", "sealed", "quic"),
        default=["shm", "tcp"],
        help="the ring's data plane: shm (as it runs between servers of one host: "
        "authenticated over TCP, the bytes through a shared-memory buffer), tcp (the same "
        "bytes over loopback TCP: --ring-loopback-tcp), sealed (AES-256-GCM records over "
        "TCP, as between hosts: --ring-seal-loopback) and/or quic (the fallback over the "
        "QUIC links: --ring-port off); default: shm and tcp",
    )
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="bench-allreduce-")
    os.environ.setdefault("BURN_REMOTE_HOME", home)
    os.chmod(home, 0o700)
    print(f"cpus: {os.cpu_count()}  python {sys.version.split()[0]}  load {os.getloadavg()}")
    print(f"{'plane':>5} {'ranks':>5} {'MiB':>5} {'ring ms':>9} {'coll ms':>9} "
          f"{'gloo ms':>9} {'ring GB/s':>10} {'coll GB/s':>10} {'gloo GB/s':>10} "
          f"{'ring/gloo':>9} {'coll/gloo':>9} {'cpu-s/op':>9} {'gloo cpu':>9} {'enter ms':>8} "
          f"{'reply ms':>8}")  # fmt: skip
    for n in args.ranks:
        rings = {p: Ring(n, Path(tempfile.mkdtemp(prefix=f"ring{n}{p}-")), p) for p in args.planes}
        gloo = Gloo(n)
        try:
            for ring in rings.values():
                ring.check()
            for mib in args.mib:
                nbytes = mib * MiB
                times: dict[str, list[float]] = {p: [] for p in rings}
                coll: dict[str, list[tuple[float, float, float]]] = {p: [] for p in rings}
                cpu: dict[str, float] = dict.fromkeys(rings, 0.0)
                for _ in range(args.warmup):  # steady state, as in a training loop
                    for ring in rings.values():
                        ring.time(nbytes)
                    gloo.time(nbytes)
                g = []
                gloo.cpu = 0.0
                for _ in range(args.repeats):  # interleaved: every plane and gloo per round
                    for p, ring in rings.items():
                        pids = [d.proc.pid for d in ring.daemons]
                        c0 = _cpu_seconds(pids)
                        times[p].append(ring.time(nbytes))
                        cpu[p] += _cpu_seconds(pids) - c0
                        coll[p].append(ring.collective())
                    g.append(gloo.time(nbytes))
                gt = statistics.median(g)
                bus = nbytes * 2 * (n - 1) / n / 1e9
                for p in rings:
                    rt = statistics.median(times[p])
                    ct, enter, reply = (statistics.median(c) for c in zip(*coll[p]))
                    per = cpu[p] / args.repeats / n  # per server per all-reduce
                    print(f"{p:>5} {n:>5} {mib:>5} {rt * 1e3:>9.1f} {ct * 1e3:>9.1f} "
                          f"{gt * 1e3:>9.1f} {bus / rt:>10.3f} {bus / ct:>10.3f} "
                          f"{bus / gt:>10.3f} {gt / rt:>9.2f} {gt / ct:>9.2f} {per:>9.3f} "
                          f"{gloo.cpu / args.repeats:>9.3f} {enter * 1e3:>8.1f} "
                          f"{reply * 1e3:>8.1f}", flush=True)  # fmt: skip
        finally:
            for ring in rings.values():
                ring.close()
            gloo.close()
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
