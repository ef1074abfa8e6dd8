"""GPU check: training-step time and peak reserved memory, side by side, in one table.

On one CUDA GPU (about 2 minutes) it prints, for the digits MLP, a small transformer and a
GPT-2-small LoRA step: the step time (median over steps) on cuda:0 fused and unfused,
PyTorch CUDA on the same model when torch with CUDA is installed, and the peak reserved
memory with the adaptive pool against CuPy's default pool. A run that fails shows `error[n]`
in its cell and its reason under the table. Without CUDA it says why and runs the same table
on the OpenCL (PoCL) and CPU devices with smaller models, so the script itself stays tested.

    .venv/bin/python bench/gpu.py [--steps N] [--smoke]
    .venv/bin/python bench/gpu.py --need-gpu   # exit 0 when cuda:0 works, else 2 and why

Every configuration runs in a child process: the pool is installed as CuPy's allocator once
per process and fusion is decided when a graph is compiled, so children keep them apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

SIZES = {  # model -> (batch, width, layers, seq, vocab) ; the smoke sizes are for PoCL/CPU
    "full": {
        "digits-mlp": (64, 128, 0, 0, 0),  # examples/digits.py: 64-128-10, batch 64
        "transformer": (16, 256, 2, 64, 512),
        "gpt2-lora": (4, 768, 12, 128, 50257),  # GPT-2 small, LoRA r=8 on c_attn
    },
    "smoke": {
        "digits-mlp": (64, 128, 0, 0, 0),
        "transformer": (4, 32, 1, 16, 64),
        "gpt2-lora": (2, 32, 1, 16, 64),
    },
}
MODELS = ("digits-mlp", "transformer", "gpt2-lora")
CHILD_TIMEOUT_S = 240


def cuda_unavailable() -> str | None:
    """None when cuda:0 can run here, otherwise why not."""
    try:
        import cupy  # type: ignore[import-not-found]

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any failure means no CUDA here
        return f"CuPy is not usable ({type(exc).__name__}: {exc})"
    return None


# --- the models, on burn_remote -------------------------------------------------------------


def _burn_model(dev, kind: str, size: tuple[int, ...]):
    from burn_remote import functional as F
    from burn_remote import nn

    batch, width, layers, seq, vocab = size
    rng = np.random.default_rng(0)
    if kind == "gpt2-lora":
        from burn_remote import lora

        nn.seed(0)
        heads = max(1, width // 64)
        cfg = nn.GPTConfig(n_layer=layers, n_head=heads, d_model=width, vocab=vocab, context=seq)
        gpt = lora.apply_lora(
            nn.GPT(cfg, device=dev), lora.LoraConfig(r=8, target_modules=["c_attn"])
        )
        ids = rng.integers(0, vocab, (batch, seq))
        tgt = rng.integers(0, vocab, (batch * seq,))

        def lm_loss():
            logits = gpt(dev.tensor(ids)).reshape(batch * seq, vocab)
            return F.cross_entropy(logits, dev.tensor(tgt))

        return gpt.parameters(), lm_loss
    if kind == "digits-mlp":
        net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10)).to(dev)
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        y = rng.integers(0, 10, batch)
        return net.parameters(), lambda: F.cross_entropy(net(dev.tensor(x)), dev.tensor(y))

    def p(*shape, scale=0.02):
        return dev.tensor(rng.normal(0, scale, shape).astype(np.float32), requires_grad=True)

    emb, head = p(vocab, width), p(width, vocab)
    blocks = [
        [p(width, 3 * width), p(width, width), p(width, 4 * width), p(4 * width, width)]
        for _ in range(layers)
    ]
    params = [emb, head, *(w for b in blocks for w in b)]
    ids = rng.integers(0, vocab, (batch, seq))
    tgt = rng.integers(0, vocab, (batch * seq,))

    def loss():
        x = F.embedding(dev.tensor(ids), emb)
        for qkv, proj, ff1, ff2 in blocks:
            h = F.layer_norm(x) @ qkv
            q, k, v = (h[:, :, i * width : (i + 1) * width] for i in range(3))
            att = F.softmax((q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(width)), axis=-1)
            x = x + (att @ v) @ proj
            x = x + F.gelu(F.layer_norm(x) @ ff1) @ ff2
        logits = (x @ head).reshape(batch * seq, vocab)
        return F.cross_entropy(logits, dev.tensor(tgt))

    return params, loss


def run_burn(device: str, kind: str, size: tuple[int, ...], steps: int) -> dict:
    from burn_remote import Device, optim

    dev = Device.parse(device)
    params, loss_fn = _burn_model(dev, kind, size)
    opt = optim.AdamW(params, lr=1e-3)
    backend = dev._rec.runtime.backend
    peak_default = 0

    def step() -> float:
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    for _ in range(3):  # register, then replay the cached graph
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()  # ends with loss.item(): the step's work is done when it returns
        times.append(time.perf_counter() - t0)
        if device.startswith("cuda") and getattr(backend, "memory", None) is None:
            import cupy  # type: ignore[import-not-found]

            peak_default = max(peak_default, cupy.get_default_memory_pool().total_bytes())
    ms = float(np.median(times)) * 1e3
    stats = dev.memory_stats()
    peak = stats.peak_reserved if stats is not None else peak_default
    return {"ms": ms, "peak": peak}


def run_torch(kind: str, size: tuple[int, ...], steps: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    batch, width, layers, seq, vocab = size
    dev = torch.device("cuda:0")
    if kind == "gpt2-lora":
        try:
            import peft
            import transformers
        except ImportError:
            return None
        cfg = transformers.GPT2Config(
            n_layer=layers,
            n_head=max(1, width // 64),
            n_embd=width,
            vocab_size=vocab,
            n_positions=seq,
        )
        base = transformers.GPT2LMHeadModel(cfg)
        net = peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules=["c_attn"])).to(dev)
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        tgt = torch.randint(0, vocab, (batch * seq,), device=dev)

        def loss_fn():
            logits = net(input_ids=ids).logits.reshape(-1, vocab)
            return torch.nn.functional.cross_entropy(logits, tgt)
    elif kind == "digits-mlp":
        net = torch.nn.Sequential(
            torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
        ).to(dev)
        x = torch.randn(batch, 64, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)

        def loss_fn():
            return torch.nn.functional.cross_entropy(net(x), y)
    else:
        layer = torch.nn.TransformerEncoderLayer(width, 1, 4 * width, 0.0, batch_first=True)
        net = torch.nn.Sequential(
            torch.nn.Embedding(vocab, width),
            torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
            torch.nn.Linear(width, vocab),
        ).to(dev)
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        tgt = torch.randint(0, vocab, (batch * seq,), device=dev)

        def loss_fn():
            return torch.nn.functional.cross_entropy(net(ids).reshape(-1, vocab), tgt)

    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return {"ms": float(np.median(times)) * 1e3, "peak": torch.cuda.max_memory_reserved()}


# --- driver --------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    size = SIZES[args.sizes][args.model]
    if args.device == "torch":
        out = run_torch(args.model, size, args.steps)
    else:
        out = run_burn(args.device, args.model, size, args.steps)
    print("RESULT " + json.dumps(out))


DEADLINE: list[float] = []
"""Monotonic time by which the table must be done (--budget); empty: no limit."""


def spawn(device: str, model: str, sizes: str, steps: int, fusion: bool, pool: bool):
    env = {**os.environ, "BURN_REMOTE_FUSION": "1" if fusion else "0"}
    env["BURN_REMOTE_POOL"] = "1" if pool else "0"
    cmd = [sys.executable, __file__, "--child", "--device", device, "--model", model]
    cmd += ["--sizes", sizes, "--steps", str(steps)]
    what = f"{model} on {device} (fusion {'on' if fusion else 'off'}, "
    what += f"{'adaptive' if pool else 'default'} pool)"
    limit = float(CHILD_TIMEOUT_S)
    if DEADLINE:
        limit = min(limit, DEADLINE[0] - time.monotonic())
        if limit < 5:
            return {"error": "not run: the time budget (--budget) was spent"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"{what}: no result within {limit:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"{what}: exit {proc.returncode}: {_reason(proc.stderr or proc.stdout)}"}


def _reason(output: str) -> str:
    """The line of a child's output that says what went wrong (its exception, if any)."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Failed", "Unavailable", "Exceeded")):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


class Table:
    """Rows of cells; failed runs get `error[n]` and their reason below the table."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def cell(self, r: dict | None, key: str) -> str:
        if r is None:
            return "-"
        if "error" in r:
            if r["error"] not in self.errors:
                self.errors.append(r["error"])
            return f"error[{self.errors.index(r['error']) + 1}]"
        return f"{r[key]:.2f} ms" if key == "ms" else f"{r[key] / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="small models on OpenCL/CPU")
    ap.add_argument("--need-gpu", action="store_true", help="exit 2 (and say why) without CUDA")
    ap.add_argument(
        "--budget", type=float, default=None, metavar="S", help="finish the table within S seconds"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda:0", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="digits-mlp", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="full", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    why = cuda_unavailable()
    if args.need_gpu:
        if why is not None:
            print(f"bench/gpu.py: this needs a CUDA GPU, and cuda:0 is not usable here: {why}")
            return 2
        return 0
    smoke = args.smoke or why is not None
    if args.budget is not None:
        DEADLINE.append(time.monotonic() + args.budget)
    if why is not None:
        print(f"bench/gpu.py: no CUDA here ({why}); running the OpenCL/CPU parts only.\n")
    sizes = "smoke" if smoke else "full"
    steps = args.steps or (5 if smoke else 50)
    devices = ["opencl", "cpu"] if smoke else ["cuda:0"]
    header = f"{'model':<12} {'device':<8} {'fused':>10} {'unfused':>10} {'torch':>10}"
    header += f" {'peak adaptive':>14} {'peak default':>13}"
    print(header)
    table = Table()
    cell = table.cell
    for model in MODELS:
        for device in devices:
            fused = spawn(device, model, sizes, steps, True, True)
            unfused = spawn(device, model, sizes, steps, False, True)
            torch_r = spawn("torch", model, sizes, steps, True, True) if not smoke else None
            default = spawn(device, model, sizes, steps, True, False) if not smoke else None
            row = f"{model:<12} {device:<8} {cell(fused, 'ms'):>10} {cell(unfused, 'ms'):>10}"
            row += f" {cell(torch_r, 'ms'):>10} {cell(fused, 'peak'):>14}"
            row += f" {cell(default, 'peak'):>13}"
            print(row, flush=True)
    for n, error in enumerate(table.errors, 1):
        print(f"error[{n}]: {error}")
    if smoke:
        print("\n(fused/unfused: OpenCL fuses elementwise chains; the CPU engine never fuses;")
        print(" peak adaptive: the CPU pools; OpenCL buffers come from PyOpenCL's pool.)")
    else:
        print("\n(ms: median step time, forward + backward + AdamW + loss read; torch: PyTorch")
        print(" CUDA on the same model, '-' without torch+CUDA (gpt2-lora: transformers + peft);")
        print(" peak: reserved device memory, adaptive pool vs CuPy's default pool.)")
    return 1 if table.errors else 0


if __name__ == "__main__":
    sys.exit(main())
