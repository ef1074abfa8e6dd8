"""A GPT-2 made with transformers, LoRA-tuned here on a RemoteDevice, read back by PEFT.

The base is a small GPT-2 built by `transformers` from a config (random init, nothing is
downloaded) and saved with `save_pretrained`. It is loaded here with `GPT.from_pretrained`
(every hyperparameter from its config.json), tuned with LoRA on a remote server, and the
adapter is saved in PEFT's layout. Then the real PEFT loads it twice, with
`PeftModel.from_pretrained(GPT2LMHeadModel...)` and with `AutoPeftModelForCausalLM`, and the
logits are compared with ours; the same is done for an adapter tuned by a server-side job.

    burn-remote serve --allow-any --data-dir /tmp/br &
    python examples/hf_lora.py PEER@127.0.0.1:PORT

Needs torch, transformers and peft (the project's test extra).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from a hub

import numpy as np
from burn_remote import RemoteDevice, lora, nn, optim

TEXT = Path(__file__).parent / "data" / "tiny.txt"
CONTEXT = 32


def make_base(directory: Path, vocab: int) -> None:
    """A 2-layer GPT-2 from transformers, random init, saved as a save_pretrained directory."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=vocab, n_positions=CONTEXT,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(directory)


def peft_logits(base: Path, adapter: Path, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Logits of the base + adapter as PEFT computes them, three ways."""
    import torch
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import GPT2LMHeadModel

    x = torch.from_numpy(ids)
    with torch.no_grad():
        tuned = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base), adapter).eval()
        auto = AutoPeftModelForCausalLM.from_pretrained(adapter).eval()
        out = {"PeftModel": tuned(x).logits.numpy(), "AutoPeftModel": auto(x).logits.numpy()}
        out["merged"] = tuned.merge_and_unload()(x).logits.numpy()
    return out


def main(target: str, steps: int = 30, job_steps: int = 20) -> dict[str, float]:
    """Run against the server at ``target`` ("peer@host:port"); returns max abs differences."""
    t0 = time.perf_counter()
    text = TEXT.read_text()
    chars = sorted(set(text))
    tokens = np.array([chars.index(c) for c in text], dtype=np.int64)
    rng = np.random.default_rng(0)
    dev = RemoteDevice(target)
    report: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        base = tmp_path / "gpt2"
        make_base(base, len(chars))

        model = nn.GPT.from_pretrained(base, device=dev)
        model.apply_lora(lora.LoraConfig(r=8, alpha=16, target_modules=["c_attn", "c_proj"]))
        model.train()
        opt = optim.AdamW(model, lr=1e-2)
        for step in range(steps):
            starts = rng.integers(0, len(tokens) - CONTEXT - 1, size=8)
            batch = np.stack([tokens[s : s + CONTEXT + 1] for s in starts])
            loss = model.loss(dev.tensor(batch[:, :-1]), dev.tensor(batch[:, 1:]))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step in (0, steps - 1):
                print(f"step {step + 1:3d}  loss {loss.item():.4f}")
        model.eval()
        model.save_adapter(tmp_path / "adapter")

        ids = np.stack([tokens[i : i + CONTEXT] for i in (0, 700, 1400)])
        ours = model(dev.tensor(ids)).numpy()
        for name, logits in peft_logits(base, tmp_path / "adapter", ids).items():
            if name == "merged":
                model.merge_lora()
                ours = model(dev.tensor(ids)).numpy()
            report[name] = float(np.abs(logits - ours).max())
            print(f"{name:14s} vs burn-remote: max abs diff {report[name]:.2e}")

        # The same through a server-side job: the directory travels as weights + config.json
        np.savez(tmp_path / "tokens.npz", tokens=tokens)
        job = dev.jobs.submit(
            {
                "kind": "lora_finetune",
                "steps": job_steps,
                "model": {"weights": str(base)},
                "data": {"path": str(tmp_path / "tokens.npz")},
                "lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn", "c_fc"]},
                "optimizer": {"lr": 1e-2},
            }
        )
        info = job.watch()
        if info["state"] != "succeeded":
            raise RuntimeError(f"LoRA job {job.id} ended {info['state']}: {info['error']}")
        job.fetch(tmp_path / "job-adapter")
        local = nn.GPT.from_pretrained(base)
        local.load_adapter(tmp_path / "job-adapter")
        ours = local(local.device.tensor(ids)).numpy()
        theirs = peft_logits(base, tmp_path / "job-adapter", ids)["AutoPeftModel"]
        report["job AutoPeftModel"] = float(np.abs(theirs - ours).max())
        print(
            f"job {job.id} adapter, AutoPeftModel vs burn-remote: {report['job AutoPeftModel']:.2e}"
        )
    dev.close()
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return report


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: hf_lora.py PEER@HOST:PORT  (a server started with --data-dir)")
    worst = max(main(sys.argv[1]).values())
    sys.exit(0 if worst <= 1e-4 else f"logits differ by {worst:.2e} (> 1e-4)")
