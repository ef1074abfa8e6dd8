"""The step functions the capture tests train, each built fresh with the same seed, so a run
under `br.compile` and a plain run can be compared bit for bit on any device."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from burn_remote import Device, lora, nn, optim
from burn_remote import functional as F

GPT_CFG = nn.GPTConfig(n_layer=2, n_head=2, d_model=32, vocab=40, context=16, dropout=0.1)


def _digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Digit-like batches without scikit-learn: a fixed random 64-pixel pattern per class."""
    rng = np.random.default_rng(seed)
    protos = rng.random((10, 64)).astype(np.float32)
    y = rng.integers(0, 10, n)
    x = protos[y] + 0.3 * rng.standard_normal((n, 64)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def mlp(dev: Device) -> tuple[nn.Module, Callable, Callable[[int], tuple]]:
    """The digits MLP (64-128-10), AdamW with warm-up + cosine, batch 32."""
    nn.seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=3e-3, schedule=optim.cosine(100, warmup_steps=10))
    x, y = _digits(32 * 100)

    def step(xb, yb):
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def batch(i: int) -> tuple:
        s = slice(32 * i, 32 * (i + 1))
        return dev.tensor(x[s]), dev.tensor(y[s])

    return net, step, batch


def cnn(dev: Device) -> tuple[nn.Module, Callable, Callable[[int], tuple]]:
    """A small CNN on 8x8 images: conv, relu, max-pool, linear; SGD with momentum, clipping."""
    nn.seed(1)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 10),
    ).to(dev)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    x, y = _digits(16 * 100, seed=1)

    def step(xb, yb):
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        optim.clip_grad_norm(net, 1.0)
        opt.step()
        opt.zero_grad()
        return loss

    def batch(i: int) -> tuple:
        s = slice(16 * i, 16 * (i + 1))
        return dev.tensor(x[s].reshape(-1, 1, 8, 8)), dev.tensor(y[s])

    return net, step, batch


def gpt_lora(dev: Device, quantize: str | None = None) -> tuple[nn.Module, Callable, Callable]:
    """A tiny GPT with LoRA adapters (dropout in the model and the adapters), AdamW with
    warm-up + cosine, gradient clipping; the step also takes the loss scale as a number."""
    nn.seed(2)
    model = nn.GPT(GPT_CFG, device=dev)
    cfg = lora.LoraConfig(
        r=4, alpha=8, dropout=0.1, target_modules=["c_attn", "c_proj"], quantize=quantize
    )
    model = lora.apply_lora(model, cfg)
    opt = optim.AdamW(model, lr=1e-2, schedule=optim.cosine(100, warmup_steps=10))
    rng = np.random.default_rng(3)
    seqs = rng.integers(0, GPT_CFG.vocab, (100, 4, GPT_CFG.context + 1))

    def step(ids, targets, scale):
        loss = model.loss(ids, targets)
        (loss * scale).backward()
        optim.clip_grad_norm(model, 0.5)
        opt.step()
        opt.zero_grad()
        return loss

    def batch(i: int) -> tuple:
        s = seqs[i]
        return dev.tensor(s[:, :-1]), dev.tensor(s[:, 1:]), 1.0 + (i % 3) * 0.25

    return model, step, batch


MODELS = {"mlp": mlp, "cnn": cnn, "gpt_lora": gpt_lora}


def train(dev: Device, build: Callable, steps: int, compiled: bool) -> dict[str, np.ndarray]:
    """Train `steps` steps plainly (a flush per step) or through `br.compile`; the final
    tensors (parameters, frozen included) as arrays."""
    import burn_remote as br

    model, step, batch = build(dev)
    run = br.compile(step) if compiled else step
    for i in range(steps):
        run(*batch(i))
        if not compiled:
            dev.flush()  # a step boundary, as a plain training loop has
    out = {name: t.numpy() for name, t in model.named_tensors()}
    if compiled:
        out["__stats__"] = run.stats()
    return out


def same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Assert two `train` results hold the same tensors, bit for bit (stats aside)."""
    assert a.keys() - {"__stats__"} == b.keys() - {"__stats__"}
    for name in a:
        if name != "__stats__":
            assert np.array_equal(a[name], b[name]), name
