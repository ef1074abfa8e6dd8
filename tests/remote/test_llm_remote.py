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


def _lora_run(dev, base, quantize=None, steps: int = 5):
    """LoRA (or QLoRA) steps captured with br.compile; the adapter tensors and losses."""
    import burn_remote as br
    from burn_remote import lora, optim

    model = nn.AutoModelForCausalLM.from_pretrained(base, device=dev)
    nn.seed(0)  # the same lora_A draws on both devices
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules="all-linear", quantize=quantize))
    opt = optim.AdamW(model, lr=0.02)

    @br.compile
    def step(ids):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    batch = dev.tensor(token_ids(seed=7, length=17))
    losses = [step(batch).item() for _ in range(steps)]
    return model, losses


def test_lora_and_qlora_on_a_remote_device_equal_the_cpu_and_load_in_peft(server, tmp_path):
    from burn_remote import Device

    peft = pytest.importorskip("peft")
    dev = RemoteDevice(server.target)
    base = make_llm(tmp_path / "base", "qwen2")
    ids = token_ids()
    for quantize in (None, "nf4"):
        remote, remote_losses = _lora_run(dev, base, quantize)
        local, local_losses = _lora_run(Device.cpu(), base, quantize)
        assert remote_losses[-1] < remote_losses[0]
        np.testing.assert_allclose(remote_losses, local_losses, rtol=1e-6)
        got = remote.eval()(dev.tensor(ids)).numpy()
        np.testing.assert_allclose(got, local.eval()(local.device.tensor(ids)).numpy(), atol=1e-6)
        out = tmp_path / f"adapter-{quantize}"
        remote.save_adapter(out)
        remote.save_pretrained(tmp_path / f"base-{quantize}")  # NF4 dequantised, or as loaded
        tuned = peft.PeftModel.from_pretrained(hf_model(tmp_path / f"base-{quantize}"), out)
        with torch.no_grad():
            expected = tuned(torch.from_numpy(ids)).logits.numpy()
        np.testing.assert_allclose(got, expected, atol=TOL)
    dev.close()


def test_loading_onto_a_remote_device_never_holds_the_model_in_the_client(server, tmp_path):
    """Stated margin: a ~190 MB checkpoint of many ~6 MB tensors (12 layers, a small vocab),
    the loader syncing every 16 MiB: the client's peak RSS grows by less than half the file
    (it grows by the whole file when it holds the model; the peak is a few tensors in flight,
    each copied for the wire)."""
    from tests.hf.stream_load import write_checkpoint
    from tests.hf.test_llm_streaming import run_load

    size = write_checkpoint(tmp_path / "ckpt", vocab=4000, layers=12)
    got = run_load(tmp_path / "ckpt", server.target, str(16 << 20))
    assert got["dtype"] == "bfloat16"
    assert got["growth"] < 0.5 * size, got
