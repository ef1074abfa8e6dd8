"""lora_finetune on a Llama-family base directory, on a real `burn-remote serve`: a chat
dataset (loss on assistant turns only), packing, gradient accumulation, a schedule; the
adapter loads in PEFT on transformers' class with our logits, the merged model loads in
transformers. Typos and bad data are refused by key path / line number."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from burn_remote import RemoteDevice, nn
from burn_remote._jobs import JobError

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("jinja2")

from tests.hf.llm_tiny import hf_model  # noqa: E402
from tests.hf.tokenizer_dir import make_tokenizer  # noqa: E402

CHATS = [
    [{"role": "user", "content": f"What is {a} plus {b}?"},
     {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]
    for a in range(6) for b in range(5)
]  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A qwen2-shaped model whose vocab fits a tokenizer trained on the repository's text."""
    import transformers

    root = tmp_path_factory.mktemp("llmjob")
    tok = make_tokenizer(root / "tok", vocab=300)
    config = transformers.Qwen2Config(
        vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(root / "base")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(tok / name, root / "base" / name)
    data = root / "chat.jsonl"
    data.write_text("\n".join(json.dumps({"messages": c}) for c in CHATS) + "\n")
    return root


def _spec(base, **over):
    spec = {
        "kind": "lora_finetune",
        "seed": 0,
        "steps": 12,
        "batch_size": 2,
        "gradient_accumulation_steps": 2,
        "checkpoint_every": 5,
        "merge": True,
        "model": {"base": str(base / "base")},
        "data": {"path": str(base / "chat.jsonl"), "seq_len": 48},
        "lora": {"r": 4, "alpha": 8, "target_modules": "all-linear"},
        "optimizer": {"lr": 0.02},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
    }
    for key, value in over.items():
        spec[key] = value
    return spec


def test_chat_lora_job_on_a_real_server_loads_in_peft_and_transformers(base, spawn, tmp_path):
    server = spawn("--data-dir", str(tmp_path / "d"))
    dev = RemoteDevice(server.target)
    job = dev.jobs.submit(_spec(base))
    info = job.watch(progress=False, timeout=300)
    assert info["state"] == "succeeded", info.get("error")
    files = job.fetch(tmp_path / "out")
    assert {"adapter_model.safetensors", "adapter_config.json", "merged-config.json",
            "merged-model.safetensors", "merged-tokenizer.json"} <= set(files)  # fmt: skip
    losses = [e["loss"] for e in job.events() if e.get("loss") is not None]
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(files[name], adapter / name)
    doc = json.loads((adapter / "adapter_config.json").read_text())
    assert doc["base_model_name_or_path"] == str((base / "base").resolve())
    ids = np.random.default_rng(3).integers(0, 300, (2, 12))
    hf = hf_model(base / "base")
    with torch.no_grad():
        plain = hf(torch.from_numpy(ids)).logits.numpy()
        tuned = peft.PeftModel.from_pretrained(hf, adapter).eval()
        expected = tuned(torch.from_numpy(ids)).logits.numpy()
    assert np.abs(expected - plain).max() > 1e-3  # the job trained something
    ours = nn.AutoModelForCausalLM.from_pretrained(base / "base")
    ours.load_adapter(adapter)
    np.testing.assert_allclose(ours(ours.device.tensor(ids)).numpy(), expected, atol=1e-4)
    merged = tmp_path / "merged"
    merged.mkdir()
    for name, path in files.items():
        if name.startswith("merged-"):
            shutil.copyfile(path, merged / name.removeprefix("merged-"))
    with torch.no_grad():
        got = hf_model(merged)(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    dev.close()


def test_typos_and_bad_lines_are_refused_by_key_path_and_line(base, spawn, tmp_path):
    server = spawn("--data-dir", str(tmp_path / "d"))
    dev = RemoteDevice(server.target)
    with pytest.raises(
        JobError, match=r"lora\.target_modulez: unknown key; did you mean 'target_modules'"
    ):
        dev.jobs.submit(_spec(base, lora={"target_modulez": ["q_proj"]}))
    with pytest.raises(JobError, match=r"data\.packng: unknown key; did you mean 'packing'"):
        dev.jobs.submit(_spec(base, data={"path": str(base / "chat.jsonl"), "packng": False}))
    with pytest.raises(JobError, match=r"model\.dtype: expected one of"):
        dev.jobs.submit(_spec(base, model={"base": str(base / "base"), "dtype": "fp8"}))
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"messages": c}) for c in CHATS[:3]]
    bad.write_text("\n".join([*lines[:2], '{"messages": [', lines[2]]) + "\n")
    job = dev.jobs.submit(_spec(base, data={"path": str(bad)}))
    info = job.watch(progress=False, timeout=120)
    assert info["state"] == "failed"
    assert "data.path: line 3 is not valid JSON" in info["error"], info["error"]
    dev.close()
