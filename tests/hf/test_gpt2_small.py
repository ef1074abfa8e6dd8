"""At the size users bring: a GPT-2-small-shaped model (124M parameters, ~500 MB of float32
weights) made by transformers, loaded here, LoRA-tuned one step, its adapter read by PEFT."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, lora, nn, optim

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.mark.slow
def test_gpt2_small_round_trip_with_peft(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config()  # GPT-2 small: 12 layers, 12 heads, 768 wide, 50257 tokens
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path / "gpt2")
    assert (tmp_path / "gpt2" / "model.safetensors").stat().st_size > 400 * 2**20
    del hf

    dev = Device.cpu()
    model = nn.GPT.from_pretrained(tmp_path / "gpt2", device=dev)
    assert (model.config.n_layer, model.config.n_head, model.config.d_model) == (12, 12, 768)
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=["c_attn"]))
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 9)).astype(np.int64)
    opt = optim.AdamW(model, lr=1e-2)
    model.loss(dev.tensor(ids[:, :-1]), dev.tensor(ids[:, 1:])).backward()
    opt.step()
    model.save_adapter(tmp_path / "adapter")
    ours = model(dev.tensor(ids)).numpy()
    del model, opt

    base = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    tuned = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = tuned(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=1e-4)
