"""The GPT decoder: shapes, causality, and GPT-2-format safetensors round trips."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, nn

DEV = Device.cpu()
CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=32, vocab=50, context=16)
GPT2_KEYS = {
    "wte.weight",
    "wpe.weight",
    "ln_f.weight",
    "ln_f.bias",
    *(
        f"h.{i}.{name}"
        for i in range(2)
        for name in (
            "ln_1.weight",
            "ln_1.bias",
            "ln_2.weight",
            "ln_2.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        )
    ),
}


def _ids(seed=0, t=16):
    return DEV.tensor(np.random.default_rng(seed).integers(0, CFG.vocab, (2, t)))


def test_gpt_shapes_causality_and_tied_head():
    nn.seed(0)
    model = nn.GPT(CFG)
    ids = np.random.default_rng(0).integers(0, CFG.vocab, (2, 16))
    logits = model(DEV.tensor(ids)).numpy()
    assert logits.shape == (2, 16, CFG.vocab)
    ids[:, 10:] = (ids[:, 10:] + 1) % CFG.vocab
    changed = model(DEV.tensor(ids)).numpy()
    np.testing.assert_allclose(logits[:, :10], changed[:, :10], rtol=1e-5, atol=1e-6)
    assert model(DEV.tensor(ids[:, :5])).shape == (2, 5, CFG.vocab)
    assert "lm_head.weight" not in model.state_dict()  # tied to wte
    assert set(model.state_dict()) == GPT2_KEYS
    with pytest.raises(ValueError, match="exceed the context"):
        model(DEV.tensor(np.zeros((1, 17), np.int64)))


def test_gpt2_format_roundtrip(tmp_path):
    nn.seed(1)
    model = nn.GPT(CFG)
    path = tmp_path / "model.safetensors"
    model.save_gpt2(path)
    raw = nn.load_safetensors(path)
    assert set(raw) == GPT2_KEYS
    d = CFG.d_model
    assert raw["h.0.attn.c_attn.weight"].shape == (d, 3 * d)  # Conv1D: (in, out)
    assert raw["h.1.mlp.c_proj.weight"].shape == (4 * d, d)
    np.testing.assert_array_equal(
        raw["h.0.attn.c_attn.weight"], model.h[0].attn.c_attn.weight.numpy().T
    )
    loaded = nn.GPT.from_gpt2(path)
    assert loaded.config == model.config
    ids = _ids()
    np.testing.assert_array_equal(model(ids).numpy(), loaded(ids).numpy())
    for name, arr in model.state_dict().items():
        np.testing.assert_array_equal(arr, loaded.state_dict()[name], err_msg=name)


def test_gpt2_loads_transformers_style_keys(tmp_path):
    """Files from `transformers` carry a `transformer.` prefix, mask buffers, a head copy."""
    nn.seed(2)
    model = nn.GPT(CFG)
    raw = {f"transformer.{k}": v for k, v in nn.load_safetensors(_save(model, tmp_path)).items()}
    raw["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    raw["lm_head.weight"] = raw["transformer.wte.weight"]
    hf = tmp_path / "hf.safetensors"
    nn.save_safetensors(raw, hf, {"format": "pt"})
    loaded = nn.GPT.from_gpt2(hf, n_head=CFG.n_head)
    ids = _ids(1)
    np.testing.assert_array_equal(model(ids).numpy(), loaded(ids).numpy())
    del raw["transformer.ln_f.bias"]
    nn.save_safetensors(raw, hf)
    with pytest.raises(KeyError, match="ln_f.bias"):
        nn.GPT(CFG).load_gpt2(hf)


def _save(model, tmp_path):
    path = tmp_path / "plain.safetensors"
    model.save_gpt2(path)
    return path


def test_gpt_training_step_replays_one_graph():
    nn.seed(3)
    from burn_remote import optim

    model = nn.GPT(nn.GPTConfig(**{**CFG.__dict__, "dropout": 0.1}))
    opt = optim.AdamW(model, lr=1e-3, schedule=optim.cosine(10, 2))
    ids = _ids(2)
    counts = []
    for _ in range(4):
        loss = model.loss(ids, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        counts.append(DEV.stats()["graphs_registered"])
    assert counts[2:] == [counts[1]] * 2
