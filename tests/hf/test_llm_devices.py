"""Llama-family models on every local backend (OpenCL on PoCL here, CUDA where present):
fp32 logits equal transformers', a bf16 checkpoint computes as on the CPU engine, and a
captured LoRA step trains."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, lora, nn, optim
from conftest import BACKEND_PARAMS

from tests.hf.llm_tiny import hf_model, make_llm, token_ids

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("spec", BACKEND_PARAMS)
def test_llama_on_every_backend(spec, tmp_path):
    import burn_remote as br

    dev = Device.parse(spec)
    ids = token_ids()
    d = make_llm(tmp_path / "m", "qwen2")
    with torch.no_grad():
        expected = hf_model(d)(torch.from_numpy(ids)).logits.numpy()
    model = nn.AutoModelForCausalLM.from_pretrained(d, device=dev)
    np.testing.assert_allclose(model(dev.tensor(ids)).numpy(), expected, atol=1e-4)

    b = make_llm(tmp_path / "bf16", "llama", dtype=torch.bfloat16)
    here = nn.AutoModelForCausalLM.from_pretrained(b, device=dev)
    cpu = nn.AutoModelForCausalLM.from_pretrained(b)
    got, ref = here(dev.tensor(ids)).numpy(), cpu(cpu.device.tensor(ids)).numpy()
    assert got.dtype == ref.dtype and str(got.dtype) == "bfloat16"
    got, ref = got.astype(np.float32), ref.astype(np.float32)
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()  # bf16 rounding apart

    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    opt = optim.AdamW(model, lr=0.02)
    batch = dev.tensor(token_ids(seed=7, length=17))

    @br.compile
    def step(x):
        loss = model.loss(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    losses = [step(batch).item() for _ in range(5)]
    assert losses[-1] < losses[0]
