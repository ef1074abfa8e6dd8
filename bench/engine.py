"""The CPU engine at real size, side by side with its baselines in one run.

Prints:
  - a GPT-2-small AdamW training step (12 x 768, vocab 50257, batch 2 x 128 tokens, forward,
    cross-entropy, backward, AdamW) on ``Device.cpu()`` against PyTorch eager
    (transformers' ``GPT2LMHeadModel``, ``torch.optim.AdamW``) with the same thread count,
    and each side's peak RSS. Each side runs in a process of its own (so each RSS is its
    own), the two alternating round by round; the step time is the median over every timed
    step of every round;
  - the digits-MLP step (64-128-10, batch 64, AdamW) as the engine replays its cached plan,
    against the same step written by hand in NumPy (bench/ops.py's), interleaved, medians;
  - the LoRA step of the LLM work (r 8 on q_proj/v_proj, batch 4 x 128 tokens, AdamW) on a
    SmolLM2-135M-shaped Llama (its config: hidden 576, 30 layers, 9 heads, 3 KV heads,
    intermediate 1536, vocab 49152, tied; random init by transformers, saved with
    save_pretrained, nothing downloaded), captured with ``br.compile`` on ``Device.cpu()``,
    against PEFT on transformers' LlamaForCausalLM, eager, the same threads; peak RSS each.

Both sides get the same threads: ``--threads`` (default: BURN_REMOTE_THREADS, else every
core) goes to BURN_REMOTE_THREADS (BLAS and the engine's pool) and to
``torch.set_num_threads``. The machine's load average is printed before and after.

Run: .venv/bin/python bench/engine.py [--threads N] [--rounds R] [--steps S]
         [--skip-gpt2] [--skip-lora]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPT2 = dict(n_layer=12, n_head=12, d_model=768, vocab=50257, context=128)
BATCH, TOKENS = 2, 128
WARMUP = 3
"""Untimed steps first. ``br.compile`` records the step on its first two calls and replays
from the third, which compiles the plan and first touches its memory; PyTorch's first steps
allocate too. Each side is timed from its fourth step on."""


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tokens() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, GPT2["vocab"], (BATCH, TOKENS + 1)).tolist()


def worker_ours(steps: int) -> dict:
    import burn_remote as br
    import numpy as np
    from burn_remote import nn, optim

    dev = br.Device.cpu()
    nn.seed(0)
    model = nn.GPT(nn.GPTConfig(**GPT2, dropout=0.0), device=dev)
    opt = optim.AdamW(model, lr=1e-4)
    seq = np.asarray(tokens(), dtype=np.int64)
    x, y = dev.tensor(seq[:, :-1]), dev.tensor(seq[:, 1:])

    def step() -> float:
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.item())

    return _timed(step, steps)


def worker_torch(steps: int, threads: int) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=GPT2["n_layer"], n_head=GPT2["n_head"], n_embd=GPT2["d_model"],
        vocab_size=GPT2["vocab"], n_positions=GPT2["context"],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seq = torch.tensor(tokens())
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def step() -> float:
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.item())

    return _timed(step, steps)


SMOLLM2 = dict(
    hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5,
    rope_theta=100000.0, hidden_act="silu", max_position_embeddings=2048,
)  # fmt: skip
LORA_BATCH, LORA_TOKENS = 4, 128


def make_smollm2(directory: Path) -> None:
    """The SmolLM2-135M-shaped base, random init by transformers (float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SMOLLM2)).save_pretrained(directory)


def lora_tokens() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(1)
    return rng.integers(0, SMOLLM2["vocab_size"], (LORA_BATCH, LORA_TOKENS + 1)).tolist()


def worker_lora_ours(steps: int, base: str) -> dict:
    import burn_remote as br
    import numpy as np
    from burn_remote import lora, nn, optim

    model = nn.AutoModelForCausalLM.from_pretrained(base)
    model.apply_lora(lora.LoraConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"]))
    opt = optim.AdamW(model, lr=1e-4)
    dev = model.device
    seq = np.asarray(lora_tokens(), dtype=np.int64)
    x, y = dev.tensor(seq[:, :-1]), dev.tensor(seq[:, 1:])

    def one(x, y):  # noqa: ANN001, ANN202
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = br.compile(one)
    return _timed(lambda: float(run(x, y).item()), steps)


def worker_lora_peft(steps: int, threads: int, base: str) -> dict:
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager")
    model = peft.get_peft_model(
        model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    seq = torch.tensor(lora_tokens())
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def step() -> float:
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y.view(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.item())

    return _timed(step, steps)


def _timed(step, steps: int) -> dict:
    for _ in range(WARMUP):
        step()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"times": times, "cpu": cpu, "peak_rss_mib": peak_rss_mib()}


def run_worker(side: str, steps: int, threads: int, base: str = "") -> dict:
    env = dict(os.environ, BURN_REMOTE_THREADS=str(threads), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", side, "--steps", str(steps), "--threads", str(threads),
         "--base", base],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{side} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def side_by_side(
    title: str, sides: tuple[tuple[str, str], tuple[str, str]], target: str,
    rounds: int, steps: int, threads: int, base: str = "",
) -> None:  # fmt: skip
    """Alternate the two workers ``sides`` ((label, worker) baseline first) round by round,
    each in a process of its own; print medians, CPU per step, peak RSS and the ratios."""
    (base_label, theirs), (our_label, ours) = sides
    results: dict[str, list[dict]] = {ours: [], theirs: []}
    for r in range(rounds):
        for side in (ours, theirs) if r % 2 == 0 else (theirs, ours):
            results[side].append(run_worker(side, steps, threads, base))
            res = results[side][-1]
            print(f"  round {r + 1}/{rounds} {side}: wall {[round(t, 3) for t in res['times']]} "
                  f"CPU {[round(t, 3) for t in res['cpu']]}  ({load()})", flush=True)  # fmt: skip
    med = {s: statistics.median(t for res in rs for t in res["times"]) for s, rs in results.items()}
    cpu = {s: statistics.median(t for res in rs for t in res["cpu"]) for s, rs in results.items()}
    rss = {s: statistics.median(res["peak_rss_mib"] for res in rs) for s, rs in results.items()}
    print(f"{title} ({threads} threads), medians of {rounds} rounds x {steps} steps, each side "
          "in its own process:")  # fmt: skip
    for label, side in ((base_label, theirs), (our_label, ours)):
        print(
            f"  {label:28} : {med[side]:7.3f} s/step (CPU {cpu[side]:6.3f} s)  "
            f"peak RSS {rss[side]:6.0f} MiB"
        )
    print(
        f"  {'ratio (ours / theirs)':28} : time {med[ours] / med[theirs]:5.2f}x (target <= "
        f"{target})  CPU {cpu[ours] / cpu[theirs]:5.2f}x  peak RSS "
        f"{rss[ours] / rss[theirs]:5.2f}x (target <= 1.00x)"
    )


def bench_mlp(rounds: int, iters: int) -> None:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import burn_remote as br
    from burn_remote import functional as F
    from ops import median_time, numpy_step_factory

    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    dev = br.Device.cpu()
    br.nn.seed(0)
    model = br.nn.Sequential(br.nn.Linear(64, 128), br.nn.ReLU(), br.nn.Linear(128, 10)).to(dev)
    opt = br.optim.AdamW(model.parameters(), lr=1e-3)
    xb, yb = dev.tensor(x), dev.tensor(y)
    np_step = numpy_step_factory([p.numpy().copy() for p in model.parameters()], 64)

    def engine_step() -> None:
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dev.sync()

    for _ in range(5):
        engine_step()
        np_step(x, y)
    # the replay alone: a step's cached plan run again on that step's inputs (no recording)
    runtime = dev._rec.runtime
    seen: dict = {}
    real_execute = runtime.execute

    def spy(capture) -> None:
        seen["cap"], seen["inputs"] = capture, [runtime.store[i] for i in capture.input_ids]
        real_execute(capture)

    runtime.execute = spy
    engine_step()
    runtime.execute = real_execute
    cap, inputs = seen["cap"], seen["inputs"]
    plan = runtime.executor.plan(cap.digest)
    t_np, t_rep = [], []
    for _ in range(rounds):
        t_np.append(median_time(lambda: np_step(x, y), iters, 1))
        t_rep.append(median_time(lambda: runtime.executor.run(plan, inputs, cap.values), iters, 1))
    tn, tr = statistics.median(t_np), statistics.median(t_rep)
    print(f"digits MLP step (batch 64, 64-128-10, AdamW), medians of {rounds} interleaved rounds:")
    print(f"  hand-written NumPy           : {tn * 1e6:8.1f} us/step")
    print(
        f"  engine, cached plan replayed : {tr * 1e6:8.1f} us/step  ratio {tr / tn:5.2f}x (target <= 1.00x)"
    )


WORKERS = {
    "ours": lambda steps, threads, base: worker_ours(steps),
    "torch": lambda steps, threads, base: worker_torch(steps, threads),
    "lora_ours": lambda steps, threads, base: worker_lora_ours(steps, base),
    "lora_peft": worker_lora_peft,
}
"""Worker name -> fn(steps, threads, base directory): the dict of its timed steps."""


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for both sides (default: BURN_REMOTE_THREADS, else every core)",
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="GPT-2 rounds (one process per side each)"
    )
    ap.add_argument("--steps", type=int, default=3, help="timed GPT-2 steps per process")
    ap.add_argument("--mlp-rounds", type=int, default=9)
    ap.add_argument("--mlp-iters", type=int, default=200)
    ap.add_argument("--skip-gpt2", action="store_true")
    ap.add_argument("--skip-lora", action="store_true")
    ap.add_argument("--lora-rounds", type=int, default=2)
    ap.add_argument("--worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--base", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.steps, args.threads or 1, args.base)))
        return
    try:
        from burn_remote.engine.backends.cpu_threads import default_threads
    except ImportError:  # an engine from before the thread setting (an A/B run)
        default_threads = os.cpu_count

    threads = args.threads or default_threads()
    os.environ["BURN_REMOTE_THREADS"] = str(threads)
    print(f"start: {load()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')!r} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '')!r}", flush=True)  # fmt: skip
    bench_mlp(args.mlp_rounds, args.mlp_iters)
    if not args.skip_gpt2:
        side_by_side(
            f"GPT-2-small AdamW step (batch {BATCH} x {TOKENS})",
            (("PyTorch eager (transformers)", "torch"), ("Device.cpu()", "ours")),
            "0.90x", args.rounds, args.steps, threads,
        )  # fmt: skip
    if not args.skip_lora:
        with tempfile.TemporaryDirectory(prefix="bench-smollm2-") as tmp:
            make_smollm2(Path(tmp))
            side_by_side(
                f"SmolLM2-135M-shaped LoRA step (r 8 q/v, batch {LORA_BATCH} x {LORA_TOKENS})",
                (("PEFT + transformers eager", "lora_peft"),
                 ("Device.cpu(), br.compile", "lora_ours")),
                "1.00x", args.lora_rounds, args.steps, threads, tmp,
            )  # fmt: skip
    print(f"end: {load()}")


if __name__ == "__main__":
    main()
