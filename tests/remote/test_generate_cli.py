"""`burn-remote generate` as a user runs it: a real process against a real `burn-remote serve`
(and on the local CPU without --peer); what it prints equals `generate_text` in this process
(itself checked against transformers in tests/hf/test_generate_text.py), with and without a
LoRA adapter and a chat template; bad input is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from burn_remote import lora, nn

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

EXE = Path(sys.executable).with_name("burn-remote")
NEW = 16
PROMPT = "The server replays"
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 2, "bos_token_id": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A random tiny Llama (built and saved by burn_remote) beside a BPE tokenizer with a
    ChatML template, weights spread wide so greedy choices are no near-ties."""
    from tests.hf.tokenizer_dir import make_tokenizer

    directory = make_tokenizer(tmp_path_factory.mktemp("cli_model"))
    nn.seed(5)
    model = nn.AutoModelForCausalLM.from_config({**LLAMA, "vocab_size": 400})
    rng = np.random.default_rng(5)
    state = {k: rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def adapter_dir(model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter with nonzero B (a fresh adapter would change nothing)."""
    model = nn.AutoModelForCausalLM.from_pretrained(model_dir)
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    rng = np.random.default_rng(6)
    state = {
        k: rng.normal(0, 0.3, v.shape).astype(v.dtype)
        for k, v in model.state_dict().items()
        if "lora_B" in k
    }
    model.load_state_dict(state, strict=False)
    directory = tmp_path_factory.mktemp("cli_adapter")
    model.save_adapter(directory)
    return directory


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(EXE), "generate", *args], capture_output=True, timeout=300,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )  # fmt: skip


def test_generate_streams_the_text_of_a_remote_model(server, model_dir) -> None:
    want = nn.AutoModelForCausalLM.from_pretrained(model_dir).generate_text(PROMPT, NEW)
    out = _run("--peer", server.target, "--model", str(model_dir), "--max-new-tokens",
               str(NEW), "--stats", PROMPT)  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode() == want + "\n"
    assert f"{NEW} tokens; first token" in out.stderr.decode()


def test_generate_locally_with_an_adapter_and_a_chat(model_dir, adapter_dir) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    model = nn.AutoModelForCausalLM.from_pretrained(model_dir)
    plain = model.generate_text(chat, NEW)
    model.load_adapter(adapter_dir)
    want = model.generate_text(chat, NEW)
    assert want != plain  # the adapter matters here
    out = _run("--model", str(model_dir), "--adapter", str(adapter_dir), "--chat", "--system",
               "Be brief.", "--max-new-tokens", str(NEW), PROMPT)  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode() == want + "\n"


def test_generate_refuses_bad_input_by_name(model_dir, tmp_path) -> None:
    out = _run("--model", str(tmp_path / "nothing"), PROMPT)
    assert out.returncode == 1 and b"nothing" in out.stderr and b"config.json" in out.stderr
    out = _run("--model", str(model_dir), "--system", "x", PROMPT)
    assert out.returncode == 2 and b"--system needs --chat" in out.stderr
    out = _run("--model", str(model_dir), "--max-new-tokens", "0", PROMPT)
    assert out.returncode == 2 and b"must be at least 1" in out.stderr
    out = _run("--model", str(model_dir), "--max-new-tokens", "500", PROMPT)
    assert out.returncode == 1 and b"context of 128" in out.stderr
