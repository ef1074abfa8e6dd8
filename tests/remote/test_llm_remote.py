"""Llama-family checkpoints streamed onto a real `burn-remote serve`: the same logits as
transformers, in fp32 and bf16."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from burn_remote import RemoteDevice, nn  # noqa: E402

from tests.hf.llm_tiny import hf_model, make_llm, token_ids  # noqa: E402

TOL = 1e-4


def _hf(directory, ids, **kw):
    with torch.no_grad():
        return hf_model(directory, **kw)(torch.from_numpy(ids)).logits.float().numpy()


def test_four_models_load_onto_a_remote_device_with_transformers_logits(server, tmp_path):
    dev = RemoteDevice(server.target)
    ids = token_ids()
    for name in ("llama", "llama3", "qwen2", "mistral"):
        d = make_llm(tmp_path / name, name)
        model = nn.AutoModelForCausalLM.from_pretrained(d, device=dev)
        assert model.device is dev
        got = model(dev.tensor(ids)).numpy()
        np.testing.assert_allclose(got, _hf(d, ids), atol=TOL, err_msg=name)
    d = make_llm(tmp_path / "bf16", "llama", dtype=torch.bfloat16, max_shard_size="8KB")
    model = nn.AutoModelForCausalLM.from_pretrained(d, device=dev)
    local = nn.AutoModelForCausalLM.from_pretrained(d)
    assert model.dtype == "bfloat16"
    np.testing.assert_array_equal(
        model(dev.tensor(ids)).numpy(), local(local.device.tensor(ids)).numpy()
    )
    dev.close()
