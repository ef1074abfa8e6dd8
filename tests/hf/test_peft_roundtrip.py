"""Adapters made here load with real PEFT onto real transformers classes, and back.

The oracle is PEFT itself: `PeftModel.from_pretrained` / `AutoPeftModelForCausalLM` on the
transformers class the base was saved from, compared logit for logit with our model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from burn_remote import Device, lora, nn, optim

from tests.hf.tiny import hf_logits, make_gpt2, token_ids

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

DEV = Device.cpu()
TOL = 1e-4


def _ours(model, ids):
    return model(DEV.tensor(ids)).numpy()


def _tune(model, steps: int = 3, seed: int = 0):
    """A few real LoRA steps, so lora_B is far from its zero init."""
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=["c_attn", "c_proj", "c_fc"]))
    opt = optim.AdamW(model, lr=0.05)
    ids = DEV.tensor(token_ids(seed=seed + 7))
    for _ in range(steps):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_gpt2(tmp_path_factory.mktemp("gpt2"))


def test_from_pretrained_matches_transformers(base):
    ids = token_ids()
    ref = transformers.GPT2LMHeadModel.from_pretrained(base).eval()
    ours = nn.GPT.from_pretrained(base)
    assert ours.config.n_head == 4 and ours.hf_class == "GPT2LMHeadModel"
    np.testing.assert_allclose(_ours(ours, ids), hf_logits(ref, ids), atol=TOL)


def test_adapter_loads_into_gpt2lmheadmodel_with_peft(base, tmp_path):
    ids = token_ids()
    model = _tune(nn.GPT.from_pretrained(base))
    model.save_adapter(tmp_path)
    doc = json.loads((tmp_path / "adapter_config.json").read_text())
    assert doc["task_type"] is None and doc["base_model_name_or_path"] == str(base.resolve())
    keys = nn.load_safetensors(tmp_path / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.transformer.h.") for k in keys)

    hf = transformers.GPT2LMHeadModel.from_pretrained(base).eval()
    plain = hf_logits(hf, ids)
    tuned = peft.PeftModel.from_pretrained(hf, tmp_path).eval()
    expected = hf_logits(tuned, ids)
    assert np.abs(expected - plain).max() > 1e-2  # the adapter does something
    np.testing.assert_allclose(_ours(model, ids), expected, atol=TOL)

    auto = peft.AutoPeftModelForCausalLM.from_pretrained(tmp_path).eval()
    np.testing.assert_allclose(hf_logits(auto, ids), expected, atol=TOL)

    merged = tuned.merge_and_unload()
    model.merge_lora()
    np.testing.assert_allclose(_ours(model, ids), hf_logits(merged, ids), atol=TOL)


def test_adapter_for_the_bare_model_on_request(tmp_path):
    base = make_gpt2(tmp_path / "bare", bare=True)
    ids = token_ids()
    model = _tune(nn.GPT.from_pretrained(base))
    assert model.hf_class == "GPT2Model"
    model.save_adapter(tmp_path / "a")
    keys = nn.load_safetensors(tmp_path / "a" / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.h.") for k in keys)
    hf = transformers.GPT2Model.from_pretrained(base).eval()
    hidden = hf_logits(peft.PeftModel.from_pretrained(hf, tmp_path / "a").eval(), ids)
    wte = hf.wte.weight.detach().numpy()
    np.testing.assert_allclose(_ours(model, ids), hidden @ wte.T, atol=TOL)
    # An LM-head base keyed for the bare class when asked
    lm = make_gpt2(tmp_path / "lm")
    _tune(nn.GPT.from_pretrained(lm)).save_adapter(tmp_path / "b", hf_class="GPT2Model")
    keys = nn.load_safetensors(tmp_path / "b" / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.h.") for k in keys)


def test_our_adapter_loads_back_and_peft_adapter_loads_here(base, tmp_path):
    ids = token_ids()
    model = _tune(nn.GPT.from_pretrained(base))
    model.save_adapter(tmp_path / "ours")
    fresh = nn.GPT.from_pretrained(base)
    fresh.load_adapter(tmp_path / "ours")
    np.testing.assert_allclose(_ours(fresh, ids), _ours(model, ids), atol=1e-6)

    # PEFT's own adapter (trained there) loads here with the same logits
    hf = transformers.GPT2LMHeadModel.from_pretrained(base)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True)
    tuned = peft.get_peft_model(hf, config)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    tuned.save_pretrained(tmp_path / "theirs")
    mine = nn.GPT.from_pretrained(base)
    mine.load_adapter(tmp_path / "theirs")
    np.testing.assert_allclose(_ours(mine, ids), hf_logits(tuned.eval(), ids), atol=TOL)


def test_save_pretrained_loads_in_transformers(base, tmp_path):
    ids = token_ids()
    model = _tune(nn.GPT.from_pretrained(base))
    model.merge_lora()
    model.save_pretrained(tmp_path / "merged")
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
    np.testing.assert_allclose(hf_logits(back, ids), _ours(model, ids), atol=TOL)
    again = nn.GPT.from_pretrained(tmp_path / "merged")
    np.testing.assert_allclose(_ours(again, ids), _ours(model, ids), atol=1e-6)


def test_mlp_adapter_loads_onto_a_torch_sequential(tmp_path):
    nn.seed(0)
    ours = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    ours.apply_lora(lora.LoraConfig(r=2, target_modules=["0", "2"]))
    for _, layer in lora.lora_layers(ours):
        w = layer.lora_B.weight
        w._assign(DEV.tensor(np.random.default_rng(1).normal(size=w.shape).astype(np.float32)))
    ours.save_adapter(tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["task_type"] is None
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for i in (0, 2):
            twin[i].weight.copy_(torch.from_numpy(getattr(ours, str(i)).weight.numpy()))
            twin[i].bias.copy_(torch.from_numpy(getattr(ours, str(i)).bias.numpy()))
    tuned = peft.PeftModel.from_pretrained(twin, tmp_path).eval()
    x = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    with torch.no_grad():
        expected = tuned(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours(DEV.tensor(x)).numpy(), expected, atol=1e-5)


def test_from_gpt2_reads_the_config_beside_the_file(base, tmp_path):
    ids = token_ids()
    ref = hf_logits(transformers.GPT2LMHeadModel.from_pretrained(base).eval(), ids)
    by_file = nn.GPT.from_gpt2(base / "model.safetensors")
    assert by_file.config.n_head == 4
    np.testing.assert_allclose(_ours(by_file, ids), ref, atol=TOL)
    by_dir = nn.GPT.from_gpt2(base)
    np.testing.assert_allclose(_ours(by_dir, ids), ref, atol=TOL)
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes((base / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="attention heads"):
        nn.GPT.from_gpt2(lone)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("activation_function", "relu"),
        ("scale_attn_by_inverse_layer_idx", True),
        ("n_inner", 40),
        ("scale_attn_weights", False),
    ],
)
def test_unsupported_config_fields_are_refused_by_name(tmp_path, field, value):
    d = make_gpt2(tmp_path, **{field: value})
    with pytest.raises(nn.HFConfigError, match=field):
        nn.GPT.from_pretrained(d)


def test_exact_gelu_config_is_honoured(tmp_path):
    d = make_gpt2(tmp_path, activation_function="gelu")
    ids = token_ids()
    ref = hf_logits(transformers.GPT2LMHeadModel.from_pretrained(d).eval(), ids)
    np.testing.assert_allclose(_ours(nn.GPT.from_pretrained(d), ids), ref, atol=TOL)
