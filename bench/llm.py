"""Open-LLM fine-tuning and loading, side by side in one run, against PyTorch + PEFT.

1. A SmolLM2-135M-shaped Llama (its public config: hidden 576, 30 layers, 9 heads, 3 kv
   heads, intermediate 1536, vocab 49152, tied embeddings; random init by transformers, saved
   with save_pretrained): the LoRA step (r 8 on q_proj/v_proj, batch 4 x 128 tokens, AdamW)
   captured with `br.compile` on `Device.cpu()`, captured on a `RemoteDevice` (a
   `burn-remote serve --device cpu` on loopback), and in PEFT + transformers eager, each in
   a process of its own with the same thread count (BLAS and torch), so each one's peak RSS
   is its own (the server's too, for the remote run). Medians over the steps after the first
   WARMUP: `br.compile` records on two calls and replays from the third, which compiles.
   The same step with `model.gradient_checkpointing_enable()` on `Device.cpu()` gives both
   sides of that trade: its step time, and the memory a step adds to the loaded model.
2. A Qwen2.5-0.5B-shaped bf16 checkpoint (its public config, random init): load time and
   peak RSS of `AutoModelForCausalLM.from_pretrained` onto `Device.cpu()`, next to the file
   size and transformers' own `from_pretrained`.

Targets (issue #32): local step <= 1.0x PEFT, remote <= 1.1x local, peak RSS <= 1.0x PEFT's;
load peak RSS <= 1.3x the file.

Run: .venv/bin/python bench/llm.py [--steps N] [--threads T] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2_135M = dict(
    model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, hidden_act="silu",
)  # fmt: skip
QWEN25_05B = dict(
    model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
    max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
    use_sliding_window=False, sliding_window=32768, max_window_layers=21,
)  # fmt: skip
BATCH, TOKENS, RANK = 4, 128, 8
WARMUP = 3
"""Steps of each run not counted: two recordings and the first replay (which compiles the plan)
on our side; PyTorch's first steps allocate. Every side drops the same number."""


def peak_rss() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: it survives execve, so a
    worker would report the size its parent had when it started."""
    return process_peak("self")


def process_peak(pid: int | str) -> int:
    """VmHWM (the peak resident set) of a live process, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def make_checkpoint(directory: Path, doc: dict[str, Any], dtype: str) -> Path:
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**doc)
    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(directory)
    return directory


def _batch():
    import numpy as np

    return np.random.default_rng(0).integers(0, SMOLLM2_135M["vocab_size"], (BATCH, TOKENS + 1))


# --- workers (each in a process of its own) --------------------------------------------------
def worker_ours(directory: str, steps: int, target: str, checkpointing: bool) -> dict[str, Any]:
    import burn_remote as br
    from burn_remote import lora, nn, optim

    dev = br.Device.cpu() if target == "cpu" else br.RemoteDevice(target)
    model = nn.AutoModelForCausalLM.from_pretrained(directory, device=dev)
    model.apply_lora(lora.LoraConfig(r=RANK, alpha=16, target_modules=["q_proj", "v_proj"]))
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = optim.AdamW(model, lr=1e-4)

    @br.compile
    def step(x):
        loss = model.loss(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    batch = dev.tensor(_batch())
    loaded = peak_rss()  # the model, its adapters and the batch, before any step
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(batch).item()
        times.append(time.perf_counter() - t)
    return {"times": times, "peak_rss": peak_rss(), "loaded_rss": loaded}


def worker_peft(directory: str, steps: int, threads: int) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(model, config).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = torch.from_numpy(_batch())
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        out.loss.item()
        times.append(time.perf_counter() - t)
    return {"times": times, "peak_rss": peak_rss()}


def worker_load(directory: str, which: str) -> dict[str, Any]:
    t = time.perf_counter()
    if which == "ours":
        from burn_remote import nn

        before = peak_rss()
        nn.AutoModelForCausalLM.from_pretrained(directory)
    else:
        import torch
        import transformers

        before = peak_rss()
        transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "peak_rss": peak_rss(), "imports_rss": before}


def run_worker(args: list[str], threads: int) -> dict[str, Any]:
    env = {**os.environ}
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=WARMUP + 3,
        help=f"LoRA steps per run (the first {WARMUP} not counted)",
    )
    parser.add_argument("--threads", type=int, default=2, help="BLAS / torch threads")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the three step runs")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= WARMUP:
        parser.error(
            f"--steps {args.steps}: the first {WARMUP} are warm-up, give at least {WARMUP + 1}"
        )
    if args.worker:
        kind, *rest = args.worker
        if kind == "ours":
            result = worker_ours(rest[0], int(rest[1]), rest[2], rest[3:] == ["checkpointing"])
        elif kind == "peft":
            result = worker_peft(rest[0], int(rest[1]), int(rest[2]))
        else:
            result = worker_load(rest[0], rest[1])
        print(json.dumps(result))
        return

    os.environ["HF_HUB_OFFLINE"] = "1"
    from burn_remote.server.testing import start_server

    with tempfile.TemporaryDirectory() as home:
        root = Path(home)
        print(f"load: {os.getloadavg()[0]:.1f} (1 min); threads {args.threads}", flush=True)
        smol = make_checkpoint(root / "smollm2", SMOLLM2_135M, "float32")
        server = start_server(root / "server", env={
            **os.environ, **{v: str(args.threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
        })  # fmt: skip
        remote = f"{server.peer_id}@{server.address}"
        runs: dict[str, list[dict[str, Any]]] = {"cpu": [], "remote": [], "peft": [], "ckpt": []}
        server_peak = 0
        try:
            for _ in range(args.rounds):
                runs["peft"].append(
                    run_worker(
                        ["peft", str(smol), str(args.steps), str(args.threads)], args.threads
                    )
                )
                runs["cpu"].append(
                    run_worker(["ours", str(smol), str(args.steps), "cpu"], args.threads)
                )
                runs["remote"].append(
                    run_worker(["ours", str(smol), str(args.steps), remote], args.threads)
                )
                runs["ckpt"].append(run_worker(
                    ["ours", str(smol), str(args.steps), "cpu", "checkpointing"], args.threads
                ))  # fmt: skip
                server_peak = max(server_peak, process_peak(server.proc.pid))
        finally:
            server.stop()
        step = {
            k: statistics.median(t for r in v for t in r["times"][WARMUP:]) for k, v in runs.items()
        }
        rss = {k: max(r["peak_rss"] for r in v) for k, v in runs.items()}
        print(f"\nSmolLM2-135M-shaped LoRA step (r {RANK} q/v, batch {BATCH}x{TOKENS}, AdamW)")
        print(f"{'':24}{'step s':>9}{'peak RSS':>12}")
        for name, label in (("peft", "PEFT + transformers"), ("cpu", "ours, Device.cpu()"),
                            ("remote", "ours, RemoteDevice")):  # fmt: skip
            print(f"{label:24}{step[name]:9.2f}{mib(rss[name]):>12}")
        print(f"{'  (its server)':24}{'':9}{mib(server_peak):>12}")
        print(
            f"ratios: local/PEFT {step['cpu'] / step['peft']:.2f} (target <= 1.0), "
            f"remote/local {step['remote'] / step['cpu']:.2f} (<= 1.1), "
            f"RSS local/PEFT {rss['cpu'] / rss['peft']:.2f} (<= 1.0)"
        )
        grown = {k: max(r["peak_rss"] - r["loaded_rss"] for r in runs[k]) for k in ("cpu", "ckpt")}
        print(
            f"gradient_checkpointing_enable() on Device.cpu(): step {step['ckpt']:.2f} s "
            f"({step['ckpt'] / step['cpu']:.2f}x), peak RSS {mib(rss['ckpt'])} "
            f"({rss['ckpt'] / rss['cpu']:.2f}x); a step's memory above the loaded model "
            f"{mib(grown['ckpt'])} against {mib(grown['cpu'])} ({grown['ckpt'] / grown['cpu']:.2f}x)"
        )

        qwen = make_checkpoint(root / "qwen05", QWEN25_05B, "bfloat16")
        size = (qwen / "model.safetensors").stat().st_size
        ours = run_worker(["load", str(qwen), "ours"], args.threads)
        theirs = run_worker(["load", str(qwen), "transformers"], args.threads)
        print(f"\nQwen2.5-0.5B-shaped bf16 checkpoint ({mib(size)}) onto the CPU")
        for label, r in (("ours", ours), ("transformers", theirs)):
            grown = r["peak_rss"] - r["imports_rss"]
            print(
                f"{label:14} load {r['seconds']:6.2f} s, peak RSS {mib(r['peak_rss'])} "
                f"({r['peak_rss'] / size:.2f}x the file; {grown / size:.2f}x over its imports)"
            )
        print(f"load time ours/transformers {ours['seconds'] / theirs['seconds']:.2f}")


if __name__ == "__main__":
    main()
