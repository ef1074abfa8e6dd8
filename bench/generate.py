"""Text generation, side by side in one run: ours on `Device.cpu()`, ours on a `RemoteDevice`
(a `burn-remote serve --device cpu` on loopback) and transformers' `generate`.

The model is SmolLM2-135M-shaped (bench/llm.py's config: hidden 576, 30 layers, 9 heads, 3
kv heads, vocab 49152, tied embeddings; random init by transformers, float32, saved with
save_pretrained). Batch 1, a PROMPT-token prompt, NEW new tokens, greedy, no EOS. Each
contender runs in a process of its own with the same thread count (BLAS, OpenMP, torch),
the server too; each generates WARMUP (2) times untimed (graphs recorded and confirmed, the
server's plans compiled), then `--repeats` times. Printed, medians over the repeats:

- time to first token (the prefill and the first choice, until the client holds it);
- tokens/s after the first (the decode rate);
- for the remote run, the client's CPU time (all its threads) per new token after the first
  (recording nothing: each step is a replay) and for the prefill (recorded and sent anew);
- time to first token once more, local and remote taking turns in one process
  (ALTERNATE_REPEATS each): the same host load for both, where the runs above are minutes
  apart on a shared machine;
- the weight bytes read per second at that decode rate (batch-1 decoding reads every weight
  once per token, so this is bound by memory bandwidth) beside this machine's memory
  bandwidth, measured here as a NumPy copy of 256 MiB (bytes read + written per second).

Targets (issue #33): local tokens/s >= 1.0x transformers'; remote tokens/s >= 0.9x local;
remote time to first token <= local + 5 ms; client CPU per remote token <= 50 us.

Run: flock /tmp/burn-bench.lock .venv/bin/python bench/generate.py [--new N] [--prompt T]
     [--repeats R] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llm import SMOLLM2_135M, make_checkpoint

WARMUP = 2
"""Untimed calls before the timed ones, on every side: a prompt's prefill is replayed from
the third call of its length on (`br.compile` replays once two recordings agree; the first
two calls record it), as a chat server's turns after the first two see it."""

ALTERNATE_NEW = 2
"""New tokens per call when local and remote take turns (only the first token is timed)."""

ALTERNATE_REPEATS = 8
"""Timed turns of each when local and remote take turns in one process (after WARMUP)."""

BANDWIDTH_BYTES = 256 * 2**20
"""The array a memory-bandwidth probe copies: far larger than any cache."""


def _prompt(length: int) -> Any:
    import numpy as np

    return np.random.default_rng(0).integers(0, SMOLLM2_135M["vocab_size"], (1, length))


# --- workers (each in a process of its own) --------------------------------------------------
def worker_ours(directory: str, target: str, prompt: int, new: int, repeats: int) -> dict:
    import burn_remote as br
    from burn_remote import nn

    dev = br.Device.cpu() if target == "cpu" else br.RemoteDevice(target)
    model = nn.AutoModelForCausalLM.from_pretrained(directory, device=dev).eval()
    ids = _prompt(prompt)
    runs = []
    for _ in range(repeats + WARMUP):
        cpu0, t0 = time.process_time(), time.perf_counter()
        first = cpu_first = None
        count = 0
        for _column in model.stream(ids, new, eos_token_id=None):
            if first is None:
                first, cpu_first = time.perf_counter(), time.process_time()
            count += 1
        end, cpu_end = time.perf_counter(), time.process_time()
        assert count == new and first is not None and cpu_first is not None, (count, new)
        runs.append({
            "ttft": first - t0, "decode": end - first, "tokens": count,
            "cpu_prefill": cpu_first - cpu0, "cpu_decode": cpu_end - cpu_first,
        })  # fmt: skip
    from burn_remote.protocol import dtypes

    unique = {id(t): t for _, t in model.named_tensors()}  # tied embeddings count once
    weights = sum(math.prod(t.shape) * dtypes.itemsize(t.dtype) for t in unique.values())
    if target != "cpu":
        dev.close()
    return {"runs": runs[WARMUP:], "weight_bytes": weights}


def worker_alternate(directory: str, target: str, prompt: int, repeats: int) -> dict:
    """Time to first token on `Device.cpu()` and on the RemoteDevice, taking turns in one
    process: both see the same host load at the same moments, where the side-by-side runs
    (a process each, minutes apart) see whatever load each minute brings."""
    import burn_remote as br
    from burn_remote import nn

    remote = br.RemoteDevice(target)
    models = {
        where: nn.AutoModelForCausalLM.from_pretrained(directory, device=dev).eval()
        for where, dev in (("cpu", br.Device.cpu()), ("remote", remote))
    }
    ids = _prompt(prompt)
    ttft: dict[str, list[float]] = {where: [] for where in models}
    for i in range(repeats + WARMUP):
        for where, model in models.items():
            t0 = time.perf_counter()
            first = None
            for _column in model.stream(ids, ALTERNATE_NEW, eos_token_id=None):
                first = first or time.perf_counter()
            if i >= WARMUP and first is not None:
                ttft[where].append(first - t0)
    remote.close()
    return {where: statistics.median(times) for where, times in ttft.items()}


def worker_hf(directory: str, threads: int, prompt: int, new: int, repeats: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    ids = torch.from_numpy(_prompt(prompt))

    class FirstToken:
        """Records when the first new token arrives (the first put is the prompt)."""

        def __init__(self) -> None:
            self.puts, self.first = 0, None

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 2:
                self.first = time.perf_counter()

        def end(self) -> None:
            pass

    runs = []
    for _ in range(repeats + WARMUP):
        streamer = FirstToken()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                eos_token_id=None, pad_token_id=0, streamer=streamer,
            )  # fmt: skip
        end = time.perf_counter()
        assert out.shape[1] == prompt + new
        runs.append({"ttft": streamer.first - t0, "decode": end - streamer.first, "tokens": new})
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"runs": runs[WARMUP:], "weight_bytes": weights}


def memory_bandwidth(repeats: int = 5) -> float:
    """Bytes per second a NumPy copy moves (read + write) over BANDWIDTH_BYTES, median."""
    import numpy as np

    src = np.ones(BANDWIDTH_BYTES // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return 2 * src.nbytes / statistics.median(times)


def run_worker(args: list[str], threads: int) -> dict[str, Any]:
    env = {**os.environ, **_thread_env(threads), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _thread_env(threads: int) -> dict[str, str]:
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return {v: str(threads) for v in names}


def _medians(result: dict[str, Any]) -> dict[str, float]:
    runs = result["runs"]
    decode_rate = [(r["tokens"] - 1) / r["decode"] for r in runs]
    out = {
        "ttft": statistics.median(r["ttft"] for r in runs),
        "tok_s": statistics.median(decode_rate),
        "weight_bytes": result["weight_bytes"],
    }
    if "cpu_decode" in runs[0]:
        out["cpu_per_token"] = statistics.median(r["cpu_decode"] / (r["tokens"] - 1) for r in runs)
        out["cpu_prefill"] = statistics.median(r["cpu_prefill"] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens (default 64)")
    parser.add_argument("--new", type=int, default=128, help="new tokens (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after WARMUP untimed")
    parser.add_argument("--threads", type=int, default=2, help="BLAS / torch threads")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, directory, where, *rest = args.worker
        prompt, new, repeats = (int(x) for x in rest)
        if kind == "ours":
            result = worker_ours(directory, where, prompt, new, repeats)
        elif kind == "alternate":
            result = worker_alternate(directory, where, prompt, repeats)
        else:
            result = worker_hf(directory, int(where), prompt, new, repeats)
        print(json.dumps(result))
        return

    os.environ["HF_HUB_OFFLINE"] = "1"
    from burn_remote.server.testing import start_server

    sizes = [str(args.prompt), str(args.new), str(args.repeats)]
    with tempfile.TemporaryDirectory() as home:
        root = Path(home)
        print(f"load: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores; threads "
              f"{args.threads}; batch 1, {args.prompt}-token prompt, {args.new} new tokens, "
              f"greedy, {args.repeats} repeats after {WARMUP} untimed", flush=True)  # fmt: skip
        smol = make_checkpoint(root / "smollm2", SMOLLM2_135M, "float32")
        server = start_server(root / "server", env={**os.environ, **_thread_env(args.threads)})
        remote = f"{server.peer_id}@{server.address}"
        try:
            results = {
                "hf": run_worker(["hf", str(smol), str(args.threads), *sizes], args.threads),
                "cpu": run_worker(["ours", str(smol), "cpu", *sizes], args.threads),
                "remote": run_worker(["ours", str(smol), remote, *sizes], args.threads),
            }
            turns = [str(args.prompt), "0", str(ALTERNATE_REPEATS)]
            alternate = run_worker(["alternate", str(smol), remote, *turns], args.threads)
        finally:
            server.stop()
        bandwidth = memory_bandwidth()
    m = {k: _medians(v) for k, v in results.items()}
    print(f"\nSmolLM2-135M-shaped Llama, float32 ({m['cpu']['weight_bytes'] / 2**20:,.0f} MiB "
          f"of weights); memory bandwidth (NumPy copy, 1 thread) {bandwidth / 1e9:.1f} GB/s")  # fmt: skip
    print(
        f"{'':28}{'first token':>12}{'tokens/s':>10}{'weights GB/s':>14}{'client CPU per token':>30}"
    )
    for name, label in (("hf", "transformers generate"), ("cpu", "ours, Device.cpu()"),
                        ("remote", "ours, RemoteDevice")):  # fmt: skip
        r = m[name]
        weights_rate = r["weight_bytes"] * r["tok_s"]
        cpu = ""
        if name == "remote":
            cpu = f"{1e6 * r['cpu_per_token']:.0f} us, prefill {1e3 * r['cpu_prefill']:.0f} ms"
        print(
            f"{label:28}{1e3 * r['ttft']:9.1f} ms{r['tok_s']:10.2f}"
            f"{weights_rate / 1e9:9.2f} ({weights_rate / bandwidth:.0%}){cpu:>30}"
        )
    print(
        f"ratios: local/transformers tokens/s {m['cpu']['tok_s'] / m['hf']['tok_s']:.2f} "
        f"(target >= 1.0), remote/local {m['remote']['tok_s'] / m['cpu']['tok_s']:.2f} "
        f"(>= 0.9); remote - local first token "
        f"{1e3 * (m['remote']['ttft'] - m['cpu']['ttft']):+.1f} ms (<= +5); client CPU per "
        f"remote token {1e6 * m['remote']['cpu_per_token']:.0f} us (<= 50)"
    )
    print(
        f"first token with local and remote taking turns in one process ({ALTERNATE_REPEATS} "
        f"each): local {1e3 * alternate['cpu']:.1f} ms, remote {1e3 * alternate['remote']:.1f} "
        f"ms, remote - local {1e3 * (alternate['remote'] - alternate['cpu']):+.1f} ms"
    )


if __name__ == "__main__":
    main()
