"""Run as a script: load a checkpoint directory onto a device and print the peak RSS growth
(bytes over the RSS after imports) and the checkpoint's size, as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def peak_rss() -> int:
    """This process's peak resident set (VmHWM), bytes. Not ru_maxrss: it survives execve, so
    a child of a large process (pytest) would report its parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def write_checkpoint(
    directory: Path, hidden: int = 1024, vocab: int = 32000, layers: int = 2
) -> int:
    """A bf16 Llama checkpoint written from random bits (no transformers: the loader's
    memory, not the writer's, is measured); by default 2 layers and ~160 MB, most of it the
    embedding and the head. Returns its size in bytes."""
    import numpy as np
    from burn_remote import nn
    from burn_remote.nn._llm_config import decoder_config
    from burn_remote.nn._llm_io import expected_tensors
    from burn_remote.protocol import dtypes

    doc = {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(doc))
    rng = np.random.default_rng(0)
    bf16 = dtypes.to_numpy("bfloat16")
    state = {
        name: (rng.standard_normal(shape, np.float32) * 0.02).astype(bf16)
        for name, shape in expected_tensors(decoder_config(doc)).items()
    }
    nn.save_safetensors(state, directory / "model.safetensors", {"format": "pt"})
    return (directory / "model.safetensors").stat().st_size


def main() -> None:
    directory, target = Path(sys.argv[1]), sys.argv[2]
    from burn_remote import nn
    from burn_remote.nn import _llm_io

    if len(sys.argv) > 3:
        _llm_io.STREAM_SYNC_BYTES = int(sys.argv[3])
    dev = nn.Module().device if target == "cpu" else None
    if target != "cpu":
        from burn_remote import RemoteDevice

        dev = RemoteDevice(target)
    dev.tensor([1.0]).numpy()  # the device's own start-up is not the load's
    before = peak_rss()
    model = nn.AutoModelForCausalLM.from_pretrained(directory, device=dev)
    peak = peak_rss()
    size = (directory / "model.safetensors").stat().st_size
    print(json.dumps({"growth": peak - before, "size": size, "dtype": model.dtype}))


if __name__ == "__main__":
    main()
