"""GPU check: training-step time and peak reserved memory, side by side.

On one CUDA GPU (well under 5 minutes) it prints, for the digits MLP and a small transformer:
the step time on cuda:0 fused and unfused, PyTorch CUDA on the same model when torch is
installed, and the peak reserved memory with the adaptive pool against CuPy's default pool.
Without CUDA it says why and runs the same table on the OpenCL (PoCL) and CPU devices with
smaller models, so the script itself stays tested.

    .venv/bin/python bench/gpu.py [--steps N] [--smoke]

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
    "full": {"mlp": (256, 512, 0, 0, 0), "transformer": (16, 256, 2, 64, 512)},
    "smoke": {"mlp": (64, 128, 0, 0, 0), "transformer": (4, 32, 1, 16, 64)},
}


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
    if kind == "mlp":
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
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
        if device.startswith("cuda") and getattr(backend, "memory", None) is None:
            import cupy  # type: ignore[import-not-found]

            peak_default = max(peak_default, cupy.get_default_memory_pool().total_bytes())
    ms = (time.perf_counter() - t0) / steps * 1e3
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
    if kind == "mlp":
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

    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for i in range(steps + 3):
        if i == 3:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
    return {
        "ms": (time.perf_counter() - t0) / steps * 1e3,
        "peak": torch.cuda.max_memory_reserved(),
    }


# --- driver --------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    size = SIZES[args.sizes][args.model]
    if args.device == "torch":
        out = run_torch(args.model, size, args.steps)
    else:
        out = run_burn(args.device, args.model, size, args.steps)
    print("RESULT " + json.dumps(out))


def spawn(device: str, model: str, sizes: str, steps: int, fusion: bool, pool: bool):
    env = {**os.environ, "BURN_REMOTE_FUSION": "1" if fusion else "0"}
    env["BURN_REMOTE_POOL"] = "1" if pool else "0"
    cmd = [sys.executable, __file__, "--child", "--device", device, "--model", model]
    cmd += ["--sizes", sizes, "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": tail[0][:80]}


def _cell(r: dict | None, key: str) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return "error"
    return f"{r[key]:.2f} ms" if key == "ms" else f"{r[key] / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="small models on OpenCL/CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda:0", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="full", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    why = cuda_unavailable()
    smoke = args.smoke or why is not None
    if why is not None:
        print(f"bench/gpu.py: no CUDA here ({why}); running the OpenCL/CPU parts only.\n")
    sizes = "smoke" if smoke else "full"
    steps = args.steps or (5 if smoke else 50)
    devices = ["opencl", "cpu"] if smoke else ["cuda:0"]
    header = f"{'model':<12} {'device':<8} {'fused':>10} {'unfused':>10} {'torch':>10}"
    header += f" {'peak adaptive':>14} {'peak default':>13}"
    print(header)
    for model in ("mlp", "transformer"):
        for device in devices:
            fused = spawn(device, model, sizes, steps, True, True)
            unfused = spawn(device, model, sizes, steps, False, True)
            torch_r = spawn("torch", model, sizes, steps, True, True) if not smoke else None
            default = spawn(device, model, sizes, steps, True, False) if not smoke else None
            row = f"{model:<12} {device:<8} {_cell(fused, 'ms'):>10} {_cell(unfused, 'ms'):>10}"
            row += f" {_cell(torch_r, 'ms'):>10} {_cell(fused, 'peak'):>14}"
            row += f" {_cell(default, 'peak'):>13}"
            print(row, flush=True)
    if smoke:
        print("\n(fused/unfused: OpenCL fuses elementwise chains; the CPU engine never fuses;")
        print(" peak adaptive: the CPU pools; OpenCL buffers come from PyOpenCL's pool.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
