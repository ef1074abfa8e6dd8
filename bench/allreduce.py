"""All-reduce bus bandwidth: burn-remote's ring between servers beside PyTorch's gloo.

One run starts N ``burn-remote serve --device cpu`` processes on loopback (each knowing the
others' addresses), sets up a ``collective.Group`` over them, and N gloo processes
(``torch.distributed``, CPU, loopback TCP). For each size it alternates ring and gloo
measurements (interleaved, so both see the same machine load), and prints medians:

- ring: a float32 tensor already on every server; the time from recording the ``all_reduce``
  on every rank to every rank's ``sync()`` answered (so it includes one small message and
  one round trip per rank from the client; negligible from 1 MiB on);
- gloo: ``dist.all_reduce`` on every rank, the slowest rank's time;
- bus bandwidth = size * 2 (N - 1) / N / time (the bytes each rank sends and receives, as
  nccl-tests reports it), and the ratio ring / gloo (>= 1.0: the ring is as fast or faster).

Usage::

    .venv/bin/python bench/allreduce.py [--ranks 2 3 4] [--mib 1 4 16 64 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
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
        t0 = time.perf_counter()
        dist.all_reduce(t)
        results.put((rank, time.perf_counter() - t0))
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

    def time(self, nbytes: int) -> float:
        for q in self.jobs:
            q.put(nbytes)
        return max(self.results.get(timeout=600)[1] for _ in self.jobs)

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


# -- the ring ----------------------------------------------------------------------------------
class Ring:
    def __init__(self, size: int, tmp: Path) -> None:
        from burn_remote import RemoteDevice
        from burn_remote import collective as C
        from burn_remote.server.testing import start_server

        self.C = C
        self.daemons = [start_server(tmp / f"s{k}", "--session-memory", str(4 * 2**30))
                        for k in range(size)]  # fmt: skip
        for d in self.daemons:
            d.know(*[o for o in self.daemons if o is not d])
        self.devices = [RemoteDevice(d.target) for d in self.daemons]
        self.group = C.Group(self.devices, timeout=600)
        self.tensors: dict[int, list] = {}

    def time(self, nbytes: int) -> float:
        import numpy as np

        xs = self.tensors.get(nbytes)
        if xs is None:
            self.tensors.clear()  # one size at a time on the servers
            xs = self.tensors[nbytes] = [d.tensor(np.ones(nbytes // 4, np.float32))
                                         for d in self.devices]  # fmt: skip
            self.C.sync(self.devices)
        t0 = time.perf_counter()
        outs = [self.C.all_reduce(x, self.group, "sum") for x in xs]
        self.C.sync(self.devices)
        dt = time.perf_counter() - t0
        del outs
        return dt

    def check(self) -> None:
        import numpy as np

        xs = [d.tensor(np.full(1001, float(k), np.float32)) for k, d in enumerate(self.devices)]
        outs = [self.C.all_reduce(x, self.group, "sum") for x in xs]
        want = sum(range(len(xs)))
        assert np.all(outs[-1].numpy() == want), "the ring gave a wrong sum"

    def close(self) -> None:
        self.group.close()
        for d in self.devices:
            d.close()
        for d in self.daemons:
            d.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="bench-allreduce-")
    os.environ.setdefault("BURN_REMOTE_HOME", home)
    os.chmod(home, 0o700)
    print(f"cpus: {os.cpu_count()}  python {sys.version.split()[0]}")
    print(f"{'ranks':>5} {'MiB':>5} {'ring ms':>9} {'gloo ms':>9} {'ring GB/s':>10} "
          f"{'gloo GB/s':>10} {'ring/gloo':>9}")  # fmt: skip
    for n in args.ranks:
        ring = Ring(n, Path(tempfile.mkdtemp(prefix=f"ring{n}-")))
        gloo = Gloo(n)
        try:
            ring.check()
            for mib in args.mib:
                nbytes = mib * MiB
                ring.time(nbytes)  # warm up: allocation, first registration
                gloo.time(nbytes)
                r, g = [], []
                for _ in range(args.repeats):
                    r.append(ring.time(nbytes))
                    g.append(gloo.time(nbytes))
                rt, gt = statistics.median(r), statistics.median(g)
                bus = nbytes * 2 * (n - 1) / n / 1e9
                print(f"{n:>5} {mib:>5} {rt * 1e3:>9.1f} {gt * 1e3:>9.1f} {bus / rt:>10.3f} "
                      f"{bus / gt:>10.3f} {gt / rt:>9.2f}", flush=True)  # fmt: skip
        finally:
            ring.close()
            gloo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
