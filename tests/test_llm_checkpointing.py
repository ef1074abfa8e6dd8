"""gradient_checkpointing_enable(): the same gradients and steps as keeping activations
(the oracle is the plain run), with each decoder layer on the tape as one recomputed node.
The memory/compute trade itself is measured by bench/llm.py."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import lora, nn, optim
from support.dp_models import assert_state_close

DOC = dict(
    model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=48,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=32,
)  # fmt: skip


def _run(checkpointing: bool, dropout: float = 0.0, steps: int = 3):
    nn.seed(0)
    model = nn.AutoModelForCausalLM.from_config(DOC)
    model.apply_lora(lora.LoraConfig(r=4, alpha=8, target_modules="all-linear", dropout=dropout))
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = optim.AdamW(model, lr=0.02)
    ids = model.device.tensor(np.random.default_rng(0).integers(0, 50, (2, 17)))
    losses = []
    for _ in range(steps):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        if checkpointing:
            kinds = _tape_kinds(loss)
            assert kinds.count("checkpoint") == DOC["num_hidden_layers"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: t.numpy() for n, t in model.named_parameters()}


def _tape_kinds(root) -> list[str]:
    from burn_remote._autograd import _topo

    return [node.op.name for node in _topo(root)]


def test_checkpointed_steps_equal_the_plain_ones():
    plain_losses, plain = _run(False)
    losses, params = _run(True)
    assert losses == plain_losses and losses[-1] < losses[0]
    # The recomputed forward gives the same bits (the losses above); the backward's plan
    # differs (recomputed activations are other values of the graph), so the CPU engine may
    # merge a weight gradient's products into one GEMM in one plan and not the other: the
    # gradients then differ by float32 rounding, which Adam's division by each gradient's
    # own size turns into up to 3e-5 of a weight near eps (seen), not by a wrong gradient.
    assert_state_close(params, plain)


def test_dropout_inside_a_checkpointed_layer_is_refused():
    with pytest.raises(ValueError, match=r"lora_dropout.*drops out \(p=0.1\)"):
        _run(True, dropout=0.1, steps=1)


def test_eval_and_no_grad_skip_the_recomputation():
    nn.seed(0)
    model = nn.AutoModelForCausalLM.from_config(DOC)
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    ids = model.device.tensor(np.arange(8).reshape(1, 8))
    model.train()
    trained = model(ids)
    assert "checkpoint" in _tape_kinds(trained)
    model.eval()
    np.testing.assert_array_equal(model(ids).numpy(), trained.numpy())
