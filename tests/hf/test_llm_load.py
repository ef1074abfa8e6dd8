"""Llama, Qwen2 and Mistral directories load here with transformers' logits; bad ones are
refused naming what is wrong. The oracle is transformers itself (eager attention), on
checkpoints it wrote with save_pretrained from a random init."""

from __future__ import annotations

import json

import numpy as np
import pytest
from burn_remote import Device, nn

from tests.hf.llm_tiny import LLAMA3_ROPE, edit_config, hf_model, make_llm, token_ids

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
MODELS = ("llama", "llama3", "qwen2", "mistral")


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.float().numpy()


def ours(model, ids: np.ndarray) -> np.ndarray:
    return model(model.device.tensor(ids)).numpy().astype(np.float32)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    return {name: make_llm(root / name, name) for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_logits_equal_transformers(checkpoints, name):
    ids = token_ids()
    model = nn.AutoModelForCausalLM.from_pretrained(checkpoints[name])
    assert isinstance(model, nn.LlamaForCausalLM) and model.dtype == "float32"
    expected = hf_logits(hf_model(checkpoints[name]), ids)
    assert np.abs(expected).max() > 1.0  # logits wide enough for a mix-up to show
    np.testing.assert_allclose(ours(model, ids), expected, atol=TOL)


def test_module_names_and_state_dict_keys_are_transformers(checkpoints):
    for name in ("llama", "qwen2"):
        model = nn.AutoModelForCausalLM.from_pretrained(checkpoints[name])
        ref = hf_model(checkpoints[name])
        ref_state = ref.state_dict()
        state = model.state_dict()
        assert set(state) == set(ref_state)
        for key, value in ref_state.items():
            np.testing.assert_array_equal(state[key], value.numpy(), err_msg=key)
        modules = {p for p, _ in model.named_modules()}
        assert {
            "model.layers.1.self_attn.q_proj",
            "model.layers.0.mlp.gate_proj",
            "lm_head",
        } <= modules


def test_sliding_window_is_honoured(checkpoints, tmp_path):
    """Mistral's window (5) is narrower than the 16 tokens: dropping it changes the logits,
    so matching transformers above means it was honoured."""
    ids = token_ids()
    windowed = ours(nn.AutoModelForCausalLM.from_pretrained(checkpoints["mistral"]), ids)
    import shutil

    shutil.copytree(checkpoints["mistral"], tmp_path / "m")
    edit_config(tmp_path / "m", sliding_window=None)
    full = ours(nn.AutoModelForCausalLM.from_pretrained(tmp_path / "m"), ids)
    assert np.abs(full - windowed)[:, 5:].max() > 1e-2
    np.testing.assert_allclose(full[:, :5], windowed[:, :5], atol=1e-6)
    np.testing.assert_allclose(full, hf_logits(hf_model(tmp_path / "m"), ids), atol=TOL)


def test_both_rope_spellings_load(checkpoints, tmp_path):
    """transformers 5 writes `rope_parameters`; older files say rope_theta + rope_scaling."""
    import shutil

    ids = token_ids(length=24)
    expected = hf_logits(hf_model(checkpoints["llama3"]), ids)
    new = nn.AutoModelForCausalLM.from_pretrained(checkpoints["llama3"])
    np.testing.assert_allclose(ours(new, ids), expected, atol=TOL)
    old_dir = tmp_path / "old"
    shutil.copytree(checkpoints["llama3"], old_dir)
    scaling = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    edit_config(old_dir, rope_parameters=None, rope_theta=LLAMA3_ROPE["rope_theta"],
                rope_scaling=scaling)  # fmt: skip
    old = nn.AutoModelForCausalLM.from_pretrained(old_dir)
    np.testing.assert_allclose(ours(old, ids), expected, atol=TOL)
    np.testing.assert_allclose(hf_logits(hf_model(old_dir), ids), expected, atol=1e-6)
    # linear scaling, old spelling, against transformers reading the same file
    edit_config(old_dir, rope_scaling={"rope_type": "linear", "factor": 3.0})
    linear = nn.AutoModelForCausalLM.from_pretrained(old_dir)
    np.testing.assert_allclose(ours(linear, ids), hf_logits(hf_model(old_dir), ids), atol=TOL)
    assert np.abs(ours(linear, ids) - expected).max() > 1e-2


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("rope_parameters.rope_type", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                                            "rope_theta": 10000.0}}),
        ("hidden_act", {"hidden_act": "gelu_fast"}),
        ("attention_dropout", {"attention_dropout": 0.1}),
        ("partial_rotary_factor", {"partial_rotary_factor": 0.5}),
        ("quantization_config", {"quantization_config": {"quant_method": "bitsandbytes"}}),
        ("model_type", {"model_type": "gemma"}),
    ],
)  # fmt: skip
def test_fields_that_change_the_numbers_are_refused_by_name(checkpoints, tmp_path, field, changes):
    import shutil

    shutil.copytree(checkpoints["llama"], tmp_path / "m")
    edit_config(tmp_path / "m", **changes)
    with pytest.raises(nn.HFConfigError, match=field.replace(".", r"\.")):
        nn.AutoModelForCausalLM.from_pretrained(tmp_path / "m")


def test_missing_extra_and_misshapen_tensors_are_refused(checkpoints, tmp_path):
    import shutil

    src = checkpoints["qwen2"]
    state = nn.load_safetensors(src / "model.safetensors")
    for case, edit, pattern in [
        ("missing", lambda s: s.pop("model.layers.1.self_attn.k_proj.bias"),
         r"missing model\.layers\.1\.self_attn\.k_proj\.bias"),
        ("extra", lambda s: s.__setitem__("model.layers.2.mlp.up_proj.weight", np.zeros((48, 32), np.float32)),
         r"unexpected model\.layers\.2\.mlp\.up_proj\.weight"),
        ("shape", lambda s: s.__setitem__("model.layers.0.mlp.down_proj.weight", np.zeros((32, 40), np.float32)),
         r"down_proj\.weight has shape \(32, 40\), but config.json implies \(32, 48\)"),
    ]:  # fmt: skip
        d = tmp_path / case
        shutil.copytree(src, d)
        broken = dict(state)
        edit(broken)
        nn.save_safetensors(broken, d / "model.safetensors", {"format": "pt"})
        with pytest.raises(nn.CheckpointError, match=pattern):
            nn.AutoModelForCausalLM.from_pretrained(d)


def test_sharded_bf16_checkpoint_loads_in_bf16(tmp_path):
    d = make_llm(tmp_path / "bf16", "qwen2", dtype=torch.bfloat16, max_shard_size="8KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    ids = token_ids()
    model = nn.AutoModelForCausalLM.from_pretrained(d)
    assert model.dtype == "bfloat16"
    assert all(t.dtype == "bfloat16" for _, t in model.named_tensors())
    got = ours(model, ids)
    ref = hf_logits(hf_model(d, dtype=torch.bfloat16), ids)
    exact = hf_logits(hf_model(d, dtype=torch.float32), ids)
    # bf16 rounding on both sides: ours is as close to the float32 run as transformers' bf16
    scale = np.abs(exact).max()
    assert np.abs(got - ref).max() < 0.03 * scale
    assert np.abs(got - exact).max() < 2 * np.abs(ref - exact).max() + 1e-3 * scale
    # saved back in bf16, bit for bit: transformers gives the same logits as from the original
    model.save_pretrained(tmp_path / "saved")
    again = hf_logits(hf_model(tmp_path / "saved", dtype=torch.bfloat16), ids)
    np.testing.assert_array_equal(again, ref)
    # dtype= overrides the storage: float32 compute of the bf16 weights, as transformers'
    wide = nn.AutoModelForCausalLM.from_pretrained(d, dtype="float32")
    assert wide.dtype == "float32"
    np.testing.assert_allclose(ours(wide, ids), exact, atol=TOL)


def test_save_pretrained_loads_in_transformers(checkpoints, tmp_path):
    ids = token_ids()
    for name in ("llama", "mistral"):
        model = nn.AutoModelForCausalLM.from_pretrained(checkpoints[name])
        model.save_pretrained(tmp_path / name)
        back = hf_model(tmp_path / name)
        np.testing.assert_allclose(hf_logits(back, ids), ours(model, ids), atol=TOL)
        again = nn.AutoModelForCausalLM.from_pretrained(tmp_path / name)
        np.testing.assert_allclose(ours(again, ids), ours(model, ids), atol=0)


def test_gpt2_through_the_same_door(tmp_path):
    from tests.hf.tiny import hf_logits as gpt2_logits
    from tests.hf.tiny import make_gpt2
    from tests.hf.tiny import token_ids as gpt2_ids

    d = make_gpt2(tmp_path / "gpt2")
    model = nn.AutoModelForCausalLM.from_pretrained(d, device=Device.cpu())
    assert isinstance(model, nn.GPT)
    ids = gpt2_ids()
    ref = gpt2_logits(transformers.GPT2LMHeadModel.from_pretrained(d).eval(), ids)
    np.testing.assert_allclose(ours(model, ids), ref, atol=TOL)
