"""LoRA fine-tuning of a tiny GPT on a RemoteDevice: the same code and the same numbers as on
Device.cpu(), with only the adapters changing."""

from __future__ import annotations

import numpy as np
from burn_remote import Device, RemoteDevice, lora, nn
from burn_remote.engine.backends import cpu_threads
from support.cycle_training import cycle_steps

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=40, context=16)


def _finetune(dev) -> tuple[list[float], bool]:
    nn.seed(4)
    model = nn.GPT(CFG, device=dev)
    cycle_steps(model, dev, 40, stride=1)  # "pretraining" on t -> t+1
    model.apply_lora(lora.LoraConfig(r=8, alpha=16, target_modules=["c_attn", "c_proj", "c_fc"]))
    base = {n: a for n, a in model.state_dict().items() if ".lora_" not in n}
    losses = cycle_steps(model, dev, 40, stride=3)  # adapters alone learn t -> t+3
    after = model.state_dict()
    return losses, all(np.array_equal(a, after[n]) for n, a in base.items())


def test_lora_finetune_on_a_remote_device_equals_the_cpu_run(spawn) -> None:
    """Stated margin: over 40 adapter steps the mean of the last five losses falls below a
    quarter of the first; the remote run is bitwise the CPU run (the server at this
    process's thread count: some products' last bits depend on BLAS's count)."""
    server = spawn("--threads", str(cpu_threads.threads()))
    remote = RemoteDevice(server.target)
    local_losses, local_base_kept = _finetune(Device.cpu())
    remote_losses, remote_base_kept = _finetune(remote)
    assert local_base_kept and remote_base_kept
    assert remote_losses == local_losses
    assert np.mean(remote_losses[-5:]) < 0.25 * remote_losses[0], remote_losses
    remote.close()
