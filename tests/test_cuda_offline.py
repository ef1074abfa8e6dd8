"""CUDA checks that need no GPU: every kernel the CUDA backend can generate compiles with
NVRTC for sm_80 and sm_90 (tests/support/cuda_nvrtc.py), including the fused programs of real
training graphs, and the check fails on a broken kernel.

CI installs the pinned CuPy and NVRTC wheels (``make test``); there these tests must run,
not skip.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

CI = os.environ.get("CI") == "true"

if os.environ.get("CI") != "true":  # in CI (`make test` installs CuPy) these must run
    pytest.importorskip("cupy", reason="CuPy is not installed (make test installs it)")

from support import cuda_nvrtc  # noqa: E402

WHY = cuda_nvrtc.cuda_headers_found()
pytestmark = pytest.mark.skipif(WHY is not None and not CI, reason=f"NVRTC: {WHY}")


def test_nvrtc_and_the_cuda_headers_are_installed():
    """`make test` installs them; CuPy 14 cannot compile a single kernel without headers."""
    assert WHY is None, WHY
    env = cuda_nvrtc.env_summary()
    assert env["cupy"].startswith("14.") and env["nvrtc"].startswith("12."), env


@pytest.mark.slow
def test_every_table_kernel_and_cast_compiles_for_sm80_and_sm90():
    sources = list(cuda_nvrtc.table_programs())
    assert len(sources) > 1400, len(sources)
    assert any("bfloat16" in s.in_params for s in sources)
    count, failures = cuda_nvrtc.compile_all(sources)
    assert not failures, "\n\n".join(f"{f.label} sm_{f.arch}:\n{f.log[:600]}" for f in failures)
    assert count >= 2 * len(sources)


def _record_real_graphs(sim) -> list:
    """Train small real models on the simulated GPU (fusion on) and return every fused
    program the backend generated for them."""
    from burn_remote import Device, nn, optim
    from burn_remote import functional as F
    from support.cuda_sim import SimCupyBackend, sim_device

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import gpu as bench_gpu

    dev = sim_device(SimCupyBackend(0, cupy=sys.modules["cupy"]))
    for kind in ("digits-mlp", "transformer"):
        params, loss_fn = bench_gpu._burn_model(dev, kind, bench_gpu.SIZES["smoke"][kind])
        opt = optim.AdamW(params, lr=1e-3, weight_decay=0.01)
        for _ in range(2):
            loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
    rng = np.random.default_rng(0)
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()).to(dev)
    x = dev.tensor(rng.standard_normal((2, 1, 8, 8)).astype(np.float32))
    out = F.max_pool2d(conv(x), 2).reshape(2, 64)
    loss = F.cross_entropy(out, dev.tensor(np.array([1, 3])), label_smoothing=0.1)
    opt = optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    loss.backward()
    opt.step()
    for dt in ("float16", "bfloat16", "float64"):
        t = dev.tensor(rng.standard_normal((4, 4)), dtype=dt)
        (F.gelu(t * 2.0 - 1.0).exp() + F.softmax(t, axis=-1)).numpy()
    from burn_remote import lora

    nn.seed(0)
    cfg = nn.GPTConfig(n_layer=1, n_head=2, d_model=16, vocab=32, context=8)
    for quantize in (None, "nf4"):
        gpt = lora.apply_lora(
            nn.GPT(cfg, device=dev),
            lora.LoraConfig(r=4, target_modules=["c_attn"], quantize=quantize, dropout=0.1),
        )
        opt = optim.AdamW(gpt.parameters(), lr=1e-3)
        ids = rng.integers(0, cfg.vocab, (2, 8))
        logits = gpt(dev.tensor(ids)).reshape(16, cfg.vocab)
        F.cross_entropy(logits, dev.tensor(rng.integers(0, cfg.vocab, 16))).backward()
        opt.step()
        dev.sync()
    b = dev.tensor(np.arange(12).reshape(3, 4))
    ((b // 3 + b * 2) > 4).numpy()
    assert Device.cpu()  # the CPU device is untouched by the simulator
    return list(sim.programs)


@pytest.mark.slow
def test_fused_programs_of_real_training_graphs_compile(monkeypatch):
    from support.cuda_sim import simulated_cuda

    monkeypatch.delenv("BURN_REMOTE_FUSION", raising=False)
    with simulated_cuda() as sim:
        programs = _record_real_graphs(sim)
    fused = [p for p in programs if len(p.instructions) > 1]
    assert len(fused) >= 15, f"only {len(fused)} fused programs recorded"
    sources = list(cuda_nvrtc.recorded_programs(programs))
    count, failures = cuda_nvrtc.compile_all(sources)
    assert not failures, "\n\n".join(f"{f.label} sm_{f.arch}:\n{f.log[:600]}" for f in failures)


def test_the_check_fails_on_a_broken_kernel(monkeypatch):
    """Break one entry of the expression table: the check names exactly the kernels that
    use it, with NVRTC's message, and passes the rest."""
    from burn_remote.engine.backends import cexpr

    monkeypatch.setitem(cexpr.UNARY, "exp", "expp({a})")  # no such function in CUDA
    sources = [s for s in cuda_nvrtc.table_programs() if s.label.split("(")[0] in ("exp", "log")]
    count, failures = cuda_nvrtc.compile_all(sources, archs=("90",), cache=False)
    broken = {f.label for f in failures}
    assert broken and all(label.startswith("exp(") for label in broken), broken
    assert any(label.startswith("log(") for label in (s.label for s in sources))
    assert all('identifier "expp" is undefined' in f.log for f in failures)


def test_bench_gpu_names_why_a_run_failed():
    """bench/gpu.py prints `error[n]` in a cell and the child's reason under the table."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import gpu as bench_gpu

    result = bench_gpu.spawn("cuda:7", "digits-mlp", "smoke", 1, True, True)
    assert "error" in result and "digits-mlp on cuda:7" in result["error"]
    assert "cuda:7" in result["error"].split(":", 2)[-1], result["error"]
    table = bench_gpu.Table()
    assert table.cell(result, "ms") == "error[1]" and table.errors == [result["error"]]
    assert table.cell({"ms": 1.5, "peak": 2**20}, "ms") == "1.50 ms"
