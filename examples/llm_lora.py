"""Fine-tune an open LLM on a server and hand the adapter to PEFT.

1. A SmolLM2-shaped Llama (SmolLM2-135M's config: hidden 576, 9 heads, 3 kv heads, SwiGLU
   1536 wide, tied embeddings; fewer layers unless --layers 30) is built by transformers
   from its config, random init (nothing is downloaded), and saved with save_pretrained.
2. A byte-level BPE tokenizer is trained with Hugging Face `tokenizers` on this repository's
   text and saved beside it with a ChatML chat template.
3. A chat data set (questions about the repository's README headings) goes to a
   `lora_finetune` job on a server: the base directory is uploaded file by file, the loss
   counts the assistant turns only, rows are packed, two micro-batches a step.
4. The job's adapter is loaded with PEFT onto transformers' LlamaForCausalLM, and with
   `load_adapter` here: the logits are compared; the merged model it wrote loads in
   transformers.

    burn-remote serve --allow-any --data-dir /tmp/br &
    python examples/llm_lora.py PEER@127.0.0.1:PORT

Needs torch, transformers, peft (the test extra) and the hf extra (tokenizers, jinja2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from a hub

import numpy as np
from burn_remote import RemoteDevice, nn

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = dict(
    hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
    tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0, hidden_act="silu",
    max_position_embeddings=2048,
)  # fmt: skip
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(directory: Path, vocab: int) -> None:
    """BPE on the repository's README and Python sources, saved as transformers saves it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [p.read_text(errors="replace") for p in [ROOT / "README.md",
             *sorted((ROOT / "client").rglob("*.py"))]]  # fmt: skip
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ))  # fmt: skip
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    fast.save_pretrained(directory)


def make_base(directory: Path, layers: int, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(**SMOLLM2, num_hidden_layers=layers, vocab_size=vocab)
    ).save_pretrained(directory)
    train_tokenizer(directory, vocab)


def chat_data(path: Path) -> int:
    """Questions about the README's sections, answered with their first words."""
    text = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)\n+([^\n#`|]+)", text, re.M)
    rows = [
        {"messages": [
            {"role": "user", "content": f"What is the section '{title.strip()}' about?"},
            {"role": "assistant", "content": " ".join(body.split()[:12])},
        ]}
        for title, body in sections
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return len(rows)


def main(target: str, layers: int = 2, steps: int = 20, vocab: int = 1000) -> dict[str, Any]:
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    work = Path(tempfile.mkdtemp(prefix="llm-lora-"))
    try:
        base = work / "smollm2"
        make_base(base, layers, vocab)
        n = chat_data(work / "chat.jsonl")
        print(f"base: SmolLM2-shaped, {layers} layers, tokenizer of {vocab} ids; {n} chats")
        dev = RemoteDevice(target)
        job = dev.jobs.submit({
            "kind": "lora_finetune", "name": "smollm2-chat", "steps": steps,
            "batch_size": 2, "gradient_accumulation_steps": 2, "merge": True,
            "model": {"base": str(base)},
            "data": {"path": str(work / "chat.jsonl"), "seq_len": 64},
            "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"},
            "optimizer": {"lr": 3e-3}, "schedule": {"kind": "cosine", "warmup_steps": 2},
        })  # fmt: skip
        info = job.watch(progress=sys.stderr.isatty())
        if info["state"] != "succeeded":
            raise SystemExit(f"job {job.id} {info['state']}: {info.get('error')}")
        files = job.fetch(work / "out")
        adapter, merged = work / "adapter", work / "merged"
        adapter.mkdir()
        merged.mkdir()
        for name, path in files.items():
            if name.startswith("merged-"):
                shutil.copyfile(path, merged / name.removeprefix("merged-"))
            else:
                shutil.copyfile(path, adapter / name)

        ids = np.random.default_rng(0).integers(0, vocab, (2, 24))
        hf = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager").eval()
        with torch.no_grad():
            tuned = peft.PeftModel.from_pretrained(hf, adapter).eval()
            theirs = tuned(torch.from_numpy(ids)).logits.numpy()
            merged_hf = AutoModelForCausalLM.from_pretrained(merged).eval()
            merged_logits = merged_hf(torch.from_numpy(ids)).logits.numpy()
        ours = nn.AutoModelForCausalLM.from_pretrained(base)
        ours.load_adapter(adapter)
        mine = ours(ours.device.tensor(ids)).numpy()
        report = {
            "PeftModel vs ours": float(np.abs(theirs - mine).max()),
            "merged (transformers) vs PeftModel": float(np.abs(merged_logits - theirs).max()),
        }
        for name, diff in report.items():
            print(f"max |logit difference| {name}: {diff:.2e}")
        dev.close()
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="the server: PEER@HOST:PORT or a known peer id")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (SmolLM2: 30)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    main(args.target, args.layers, args.steps)
