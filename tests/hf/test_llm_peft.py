"""LoRA on Llama-family models, shared with real PEFT on transformers' classes both ways:
adapters trained here load with `PeftModel.from_pretrained` / `AutoPeftModelForCausalLM`,
PEFT's adapters load here, merged saves load in transformers, and `target_modules` picks the
same layers PEFT picks (names, regex, "all-linear")."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from burn_remote import lora, nn, optim

from tests.hf.llm_tiny import hf_model, make_llm, token_ids

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOL = 1e-4
ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.float().numpy()


def ours(model, ids: np.ndarray) -> np.ndarray:
    return model(model.device.tensor(ids)).numpy().astype(np.float32)


def train(model, steps: int = 5, lr: float = 0.02):
    """`steps` AdamW steps on a next-token loss, so every lora_B is far from zero."""
    opt = optim.AdamW(model, lr=lr)
    ids = model.device.tensor(token_ids(seed=7, length=17))
    losses = []
    for _ in range(steps):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {name: make_llm(root / name, name) for name in ("llama", "qwen2", "mistral")}


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
def test_adapter_trained_here_loads_in_peft(bases, tmp_path, name):
    ids = token_ids()
    model = nn.AutoModelForCausalLM.from_pretrained(bases[name])
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=ALL_PROJ))
    losses = train(model)
    assert losses[-1] < losses[0]
    model.eval().save_adapter(tmp_path)
    doc = json.loads((tmp_path / "adapter_config.json").read_text())
    assert doc["base_model_name_or_path"] == str(bases[name].resolve())
    keys = nn.load_safetensors(tmp_path / "adapter_model.safetensors")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys

    hf = hf_model(bases[name])
    plain = hf_logits(hf, ids)
    tuned = peft.PeftModel.from_pretrained(hf, tmp_path).eval()
    expected = hf_logits(tuned, ids)
    assert np.abs(expected - plain).max() > 1e-2  # the adapter does something
    np.testing.assert_allclose(ours(model, ids), expected, atol=TOL)

    auto = peft.AutoPeftModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    np.testing.assert_allclose(hf_logits(auto.eval(), ids), expected, atol=TOL)

    # merge_and_unload + save_pretrained: transformers loads the merged checkpoint
    merged_hf = hf_logits(tuned.merge_and_unload(), ids)
    model.merge_and_unload()
    assert not lora.lora_layers(model)
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.Linear)
    np.testing.assert_allclose(ours(model, ids), merged_hf, atol=TOL)
    model.save_pretrained(tmp_path / "merged")
    back = hf_logits(hf_model(tmp_path / "merged"), ids)
    np.testing.assert_allclose(back, merged_hf, atol=TOL)


def test_peft_trained_adapter_loads_here(bases, tmp_path):
    ids = token_ids()
    hf = hf_model(bases["qwen2"])
    config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"])
    tuned = peft.get_peft_model(hf, config)
    opt = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=0.05)
    batch = torch.from_numpy(token_ids(seed=3, length=17))
    for _ in range(5):  # PEFT trains it, on transformers' class
        out = tuned(input_ids=batch[:, :-1], labels=batch[:, :-1])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    tuned.save_pretrained(tmp_path)
    expected = hf_logits(tuned.eval(), ids)
    mine = nn.AutoModelForCausalLM.from_pretrained(bases["qwen2"])
    mine.load_adapter(tmp_path)
    assert {p.rsplit(".", 1)[-1] for p, _ in lora.lora_layers(mine)} == {
        "q_proj",
        "v_proj",
        "down_proj",
    }
    np.testing.assert_allclose(ours(mine, ids), expected, atol=TOL)


def _peft_targets(directory, target_modules) -> set[str]:
    hf = hf_model(directory)
    tuned = peft.get_peft_model(hf, peft.LoraConfig(r=2, target_modules=target_modules))
    return {
        name.removeprefix("base_model.model.")
        for name, mod in tuned.named_modules()
        if isinstance(mod, peft.tuners.lora.LoraLayer)
    }


@pytest.mark.parametrize(
    "target",
    [
        ["q_proj", "up_proj"],
        r".*layers\.1\.(self_attn\.[kv]_proj|mlp\.down_proj)",
        "all-linear",
    ],
    ids=["names", "regex", "all-linear"],
)
def test_target_modules_pick_the_layers_peft_picks(bases, target):
    for name in ("llama", "qwen2"):  # llama's head is tied, qwen2's a Linear of its own
        model = nn.AutoModelForCausalLM.from_pretrained(bases[name])
        mine = set(lora.find_targets(model, target))
        assert mine == _peft_targets(bases[name], target), name
        assert "lm_head" not in mine


def test_qlora_trains_and_merges_into_a_dense_checkpoint(bases, tmp_path):
    ids = token_ids()
    model = nn.AutoModelForCausalLM.from_pretrained(bases["llama"])
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules="all-linear", quantize="nf4"))
    assert lora.lora_stats(model).bytes_per_base_param < 0.6
    losses = train(model, steps=8)
    assert losses[-1] < losses[0]
    model.eval().save_adapter(tmp_path / "adapter")
    model.save_pretrained(tmp_path / "base")  # the NF4 base, dequantised; no adapter
    tuned = ours(model, ids)
    dequantised = hf_model(tmp_path / "base")
    expected = hf_logits(peft.PeftModel.from_pretrained(dequantised, tmp_path / "adapter"), ids)
    np.testing.assert_allclose(tuned, expected, atol=TOL)
    model.merge_and_unload()
    np.testing.assert_allclose(ours(model, ids), tuned, atol=TOL)
    model.save_pretrained(tmp_path / "merged")
    np.testing.assert_allclose(hf_logits(hf_model(tmp_path / "merged"), ids), tuned, atol=TOL)


def test_lora_on_a_bf16_base_keeps_the_base_in_bf16(tmp_path):
    d = make_llm(tmp_path / "bf16", "llama", dtype=torch.bfloat16)
    ids = token_ids()
    model = nn.AutoModelForCausalLM.from_pretrained(d)
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    losses = train(model)
    assert losses[-1] < losses[0]
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.weight.dtype == "bfloat16" and layer.lora_A.weight.dtype == "float32"
    model.eval().save_adapter(tmp_path / "a")
    got = ours(model, ids)
    tuned = peft.PeftModel.from_pretrained(hf_model(d, dtype=torch.bfloat16), tmp_path / "a")
    ref = hf_logits(tuned.eval(), ids)
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()
    assert re.fullmatch(r"bfloat16", model.dtype)
