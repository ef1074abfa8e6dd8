"""LoRA and QLoRA fine-tuning of a tiny character-level GPT on examples/data/tiny.txt.

The base model is first trained briefly on the whole text (standing in for a pretrained
checkpoint), saved as a GPT-2-format safetensors file and reloaded; adapters are then
trained on top of the frozen base, saved in the PEFT layout and loaded back. Everything runs
on the device given to `main` (Device.cpu() by default; a RemoteDevice works the same).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from burn_remote import Device, lora, nn, optim

TEXT = Path(__file__).parent / "data" / "tiny.txt"


def load_corpus(path: Path = TEXT) -> tuple[np.ndarray, list[str]]:
    """Character ids of the text and its alphabet (id -> char)."""
    text = path.read_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return np.array([index[c] for c in text], dtype=np.int64), chars


def batch(data: np.ndarray, rng: np.random.Generator, size: int, context: int):
    """`size` random windows and the same windows shifted by one (next-token targets)."""
    starts = rng.integers(0, len(data) - context - 1, size)
    x = np.stack([data[s : s + context] for s in starts])
    y = np.stack([data[s + 1 : s + context + 1] for s in starts])
    return x, y


def train(
    model: nn.GPT,
    opt: optim.Optimizer,
    data: np.ndarray,
    steps: int,
    dev: Device,
    size: int = 16,
    seed: int = 0,
    clip: float | None = 1.0,
) -> list[float]:
    """Run `steps` optimizer steps; returns the loss of each (read once per step)."""
    rng = np.random.default_rng(seed)
    context = model.config.context
    losses = []
    for _ in range(steps):
        x, y = batch(data, rng, size, context)
        loss = model.loss(dev.tensor(x), dev.tensor(y))
        loss.backward()
        if clip is not None:
            optim.clip_grad_norm(model, clip)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return losses


def eval_loss(model: nn.GPT, data: np.ndarray, dev: Device, size: int = 32) -> float:
    """Loss on fixed windows with dropout off (the model's mode is restored)."""
    mode = model.training
    model.eval()
    x, y = batch(data, np.random.default_rng(1234), size, model.config.context)
    loss = float(model.loss(dev.tensor(x), dev.tensor(y)).item())
    model.train(mode)
    return loss


def _finetune(path: Path, data: np.ndarray, dev: Device, config: lora.LoraConfig, steps: int):
    model = nn.GPT.from_gpt2(path, device=dev)
    model.apply_lora(config)
    model.train()
    sched = optim.cosine(total_steps=steps, warmup_steps=steps // 10, min_ratio=0.1)
    opt = optim.AdamW(model, lr=1e-2, weight_decay=0.0, schedule=sched)
    start = eval_loss(model, data, dev)
    graphs = dev.stats()["graphs_registered"]
    losses = train(model, opt, data, steps, dev, seed=1)
    new_graphs = dev.stats()["graphs_registered"] - graphs
    return model, start, eval_loss(model, data, dev), losses, new_graphs


def main(dev: Device | None = None, base_steps: int = 200, lora_steps: int = 100) -> dict:
    dev = dev or Device.cpu()
    nn.seed(0)
    data, chars = load_corpus()
    config = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=len(chars), context=32)
    t0 = time.perf_counter()
    base = nn.GPT(config, device=dev)
    opt = optim.AdamW(base, lr=3e-3, schedule=optim.linear_warmup(10))
    base_losses = train(base, opt, data[: len(data) // 2], base_steps, dev)
    print(
        f"base model: {base.num_parameters():,} parameters, loss "
        f"{base_losses[0]:.3f} -> {base_losses[-1]:.3f} in {base_steps} steps (first half)"
    )
    tail = data[len(data) // 2 :]
    report = {"base_loss": (base_losses[0], base_losses[-1])}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.safetensors"
        base.save_gpt2(ckpt)
        for name, quantize in (("LoRA", None), ("QLoRA", "nf4")):
            cfg = lora.LoraConfig(
                r=8,
                alpha=16,
                dropout=0.05,
                target_modules=["c_attn", "c_proj", "c_fc"],
                quantize=quantize,
            )
            model, start, end, losses, graphs = _finetune(ckpt, tail, dev, cfg, lora_steps)
            stats = lora.lora_stats(model)
            print(
                f"{name}: {stats}; held-out loss on the second half {start:.3f} -> {end:.3f} "
                f"(train {losses[0]:.3f} -> {losses[-1]:.3f}); {graphs} graphs registered "
                f"over {lora_steps} steps"
            )
            adapter = Path(tmp) / name.lower()
            model.save_adapter(adapter, base_model_name_or_path="tiny-gpt")
            fresh = nn.GPT.from_gpt2(ckpt, device=dev)
            if quantize:
                fresh.apply_lora(cfg)
            fresh.load_adapter(adapter)
            fresh.eval()
            reloaded = eval_loss(fresh, tail, dev)
            print(f"  adapter saved to {adapter.name}/ and reloaded: loss {reloaded:.3f}")
            report[name] = {
                "trainable_share": stats.trainable_share,
                "bytes_per_base_param": stats.bytes_per_base_param,
                "loss": (start, end),
            }
    print(f"done in {time.perf_counter() - t0:.1f} s on {dev}")
    return report


if __name__ == "__main__":
    main()
