"""Models the data-parallel tests train, built fresh with the same seed, each with a step
written as `fn(model, opt, x, y)`, so one device on the whole batch (the oracle) and
DataParallel on shards of it can be compared. Dropout is off: replicas draw other masks than
one device on the whole batch would, so with dropout the two are not the same computation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from burn_remote import functional as F
from burn_remote import lora, nn, optim

from support.capture_models import _digits

GPT_CFG = nn.GPTConfig(n_layer=2, n_head=2, d_model=32, vocab=40, context=16, dropout=0.0)


def mlp_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def clipped_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    """Clipping after backward: it must see the averaged gradient (the whole batch's norm)."""
    loss = model.loss(x, y) if isinstance(model, nn.GPT) else F.cross_entropy(model(x), y)
    loss.backward()
    optim.clip_grad_norm(model, 0.5)
    opt.step()
    opt.zero_grad()
    return loss


def mlp(batch: int, steps: int) -> tuple[Any, Any, Callable, list[tuple]]:
    """The digits MLP (64-128-10), AdamW with warm-up + cosine."""
    nn.seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = optim.AdamW(net.parameters(), lr=3e-3, schedule=optim.cosine(100, warmup_steps=10))
    x, y = _digits(batch * steps)
    batches = [
        (x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(steps)
    ]
    return net, opt, mlp_step, batches


def gpt_lora(batch: int, steps: int) -> tuple[Any, Any, Callable, list[tuple]]:
    """The tiny GPT with LoRA on attention, AdamW with warm-up + cosine, clipping."""
    nn.seed(2)
    model = nn.GPT(GPT_CFG)
    cfg = lora.LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["c_attn", "c_proj"])
    model = lora.apply_lora(model, cfg)
    opt = optim.AdamW(model, lr=1e-2, schedule=optim.cosine(100, warmup_steps=10))
    rng = np.random.default_rng(3)
    seqs = rng.integers(0, GPT_CFG.vocab, (steps, batch, GPT_CFG.context + 1))
    batches = [(s[:, :-1], s[:, 1:]) for s in seqs]
    return model, opt, clipped_step, batches


def gpt2_small(batch: int, steps: int) -> tuple[Any, Any, Callable, list[tuple]]:
    """A GPT-2-small-sized GPT (124M parameters, context 8), every parameter trained with
    AdamW and clipping: each step all-reduces ~500 MB of gradients between the replicas."""
    cfg = nn.GPTConfig(n_layer=12, n_head=12, d_model=768, vocab=50257, context=8, dropout=0.0)
    nn.seed(5)
    model = nn.GPT(cfg)
    opt = optim.AdamW(model, lr=1e-4)
    seqs = np.random.default_rng(6).integers(0, cfg.vocab, (steps, batch, cfg.context + 1))
    return model, opt, clipped_step, [(s[:, :-1], s[:, 1:]) for s in seqs]


MODELS = {"mlp": mlp, "gpt_lora": gpt_lora}


def train_one(dev: Any, build: Callable, batch: int, steps: int) -> tuple[dict, list[float]]:
    """The oracle: one device, the whole batch each step, captured like the replicas."""
    import burn_remote as br

    model, opt, step, batches = build(batch, steps)
    model.to(dev)
    run = br.compile(lambda x, y: step(model, opt, x, y))
    losses = [run(dev.tensor(x), dev.tensor(y)) for x, y in batches]
    return model.state_dict(), [float(v.item()) for v in losses]


def train_parallel(devices: list, build: Callable, batch: int, steps: int, **opts: Any) -> tuple:
    """DataParallel over `devices`: (its state_dict, the losses, the DataParallel)."""
    import burn_remote as br

    model, opt, step, batches = build(batch, steps)
    dp = br.DataParallel(model, opt, devices=devices, **opts)
    run = dp.compile(step)
    losses = [run(x, y) for x, y in batches]
    return dp.state_dict(), [float(v.item()) for v in losses], dp


def assert_state_close(got: dict, want: dict, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """Equal up to the rounding of a different summation order (a wrong average or a missed
    replica is off by orders of magnitude more): each tensor within ``rtol`` of its norm,
    and each element within 1 % of the tensor's largest value. Not each element within
    ``rtol`` of itself: Adam divides each gradient by its own size, so an element whose
    gradient is near Adam's eps turns the summation order's rounding into a visible share
    of its update (0.6 % of a -7e-4 LoRA B weight seen in the GPT-2-sized test, a 4e-6
    difference, while the tensor's norm agreed to 1e-4)."""
    assert got.keys() == want.keys()
    for name in want:
        a, b = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        assert a.shape == b.shape, name
        err, size = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
        assert err <= rtol * size + atol, f"{name}: |got - want| {err:.3g}, |want| {size:.3g}"
        scale = float(np.abs(b).max(initial=0.0))
        np.testing.assert_allclose(a, b, rtol=0, atol=atol + 100 * rtol * scale, err_msg=name)
