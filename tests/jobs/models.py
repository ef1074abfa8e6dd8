"""Tiny inputs the job tests share: a base GPT checkpoint, a token dataset, LoRA specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from burn_remote import Device, nn

TEXT = Path(__file__).resolve().parents[2] / "examples" / "data" / "tiny.txt"


def make_base(folder: Path) -> tuple[Path, Path]:
    """An untrained tiny GPT (GPT-2 safetensors) and the text as npz tokens."""
    text = TEXT.read_text()
    chars = sorted(set(text))
    tokens = np.array([chars.index(c) for c in text], dtype=np.int64)
    nn.seed(0)
    cfg = nn.GPTConfig(n_layer=1, n_head=2, d_model=32, vocab=len(chars), context=16)
    model = nn.GPT(cfg, device=Device.cpu())
    weights, data = folder / "base.safetensors", folder / "tokens.npz"
    model.save_gpt2(weights)
    np.savez(data, tokens=tokens)
    return weights, data


def lora_spec(weights: Any, data: Any, steps: int = 30, **extra: Any) -> dict[str, Any]:
    spec = {
        "kind": "lora_finetune",
        "seed": 7,
        "steps": steps,
        "batch_size": 4,
        "checkpoint_every": 5,
        "model": {"weights": str(weights), "n_head": 2, "dropout": 0.1},
        "data": {"path": str(data)},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["c_attn", "c_fc"]},
        "optimizer": {"lr": 1e-2, "groups": [{"pattern": "*lora_B*", "lr": 2e-2}]},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
    }
    spec.update(extra)
    return spec


def failing_spec(folder: Path, steps: int = 2) -> dict[str, Any]:
    """A spec accepted at submit whose run fails at once: its weights file is a readable
    safetensors file with no GPT in it (only an embedding), and its one target is a pattern,
    which only the built model can check."""
    from safetensors.numpy import save_file

    weights = folder / "headless.safetensors"
    save_file({"wte.weight": np.zeros((4, 4), np.float32)}, str(weights))
    data = folder / "text.txt"
    data.write_text("some text to train on " * 8)
    return lora_spec(weights, data, steps=steps, lora={"target_modules": "c_attn"})
