"""ONNX export of causal LMs for generation, checked in onnxruntime (the oracle runs the
file): the no-cache export at other batch sizes and lengths, and the decoder export with
past_key_values in and present out (optimum's layout), whose greedy loop in onnxruntime
gives `generate`'s tokens, for the GPT and tiny Llama, Qwen2 and Mistral models."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, nn
from burn_remote.onnx import ExportError, export, export_decoder

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
NEW = 24
LLAMA_FAMILY = ("llama", "llama3", "qwen2", "mistral")
"""tests/hf/llm_tiny.py's shapes: GQA + tied head, MQA + llama3 RoPE + biases, Qwen2's q/k/v
biases, Mistral's sliding window (5, narrower than prompt + new tokens)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> our model: a GPT-2 and the Llama family from transformers checkpoints whose
    logits are spread wide, so greedy choices are no near-ties that float rounding flips."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.hf.llm_tiny import edit_config, make_llm

    torch.manual_seed(0)
    gpt2 = GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=300, n_positions=64, initializer_range=0.2
    )
    gpt_dir = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(gpt2).eval().save_pretrained(gpt_dir)
    out = {"gpt": nn.GPT.from_pretrained(gpt_dir, device=Device.cpu())}
    for family in LLAMA_FAMILY:
        directory = make_llm(tmp_path_factory.mktemp(family), family)
        edit_config(directory, max_position_embeddings=64)  # room for a prompt and NEW tokens
        out[family] = nn.AutoModelForCausalLM.from_pretrained(directory, device=Device.cpu())
    return out


def _vocab(model) -> int:  # type: ignore[no-untyped-def]
    return int(model.config.vocab)


def _prompts(model, batch: int = 3, length: int = 9):  # type: ignore[no-untyped-def]
    """Left-padded prompts: rows after the first have 2 and 5 padding tokens."""
    ids = np.random.default_rng(2).integers(1, _vocab(model), (batch, length))
    mask = np.ones_like(ids)
    for row, pad in zip(range(1, batch), (2, 5)):
        mask[row, :pad] = 0
    ids[mask == 0] = 0
    return ids.astype(np.int64), mask.astype(np.int64)


def _session(path):  # type: ignore[no-untyped-def]
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _ort_greedy(sess, model, ids, mask, new):  # type: ignore[no-untyped-def]
    """transformers' greedy loop over the exported decoder: the prompt with an empty past,
    then one token a call, each call fed the presents of the one before."""
    spec = model.cache_spec()
    b = ids.shape[0]
    past = {
        f"past_key_values.{i}.{kv}": np.zeros((b, spec.n_kv_head, 0, spec.head_dim), np.float32)
        for i in range(spec.n_layer)
        for kv in ("key", "value")
    }
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    feed_ids, out = ids, []
    for _ in range(new):
        outs = sess.run(
            None,
            {"input_ids": feed_ids, "attention_mask": mask, "position_ids": positions, **past},
        )
        token = outs[0][:, -1].argmax(axis=-1)
        out.append(token)
        past = {k.replace("present", "past_key_values"): v for k, v in zip(
            [o.name for o in sess.get_outputs()][1:], outs[1:])}  # fmt: skip
        feed_ids = token[:, None].astype(np.int64)
        positions = positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((b, 1), np.int64)], axis=1)
    return np.concatenate([ids, np.stack(out, axis=1)], axis=1)


@pytest.mark.parametrize("name", ["gpt", *LLAMA_FAMILY])
def test_decoder_export_greedy_loop_in_onnxruntime_equals_generate(models, name, tmp_path):
    model = models[name]
    path = export_decoder(model, tmp_path / "decoder.onnx")
    proto = onnx.load(str(path))
    dims = {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in [*proto.graph.input, *proto.graph.output]
    }
    spec = model.cache_spec()
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert dims["past_key_values.0.key"] == [
        "batch_size", spec.n_kv_head, "past_sequence_length", spec.head_dim,
    ]  # fmt: skip
    assert dims[f"present.{spec.n_layer - 1}.value"] == [
        "batch_size", spec.n_kv_head, "past_sequence_length + sequence_length", spec.head_dim,
    ]  # fmt: skip
    assert dims["logits"] == ["batch_size", "sequence_length", _vocab(model)]
    sess = _session(path)
    for batch in (1, 3):
        ids, mask = _prompts(model, batch)
        want = model.generate(ids, NEW, attention_mask=mask, eos_token_id=None, pad_token_id=0)
        got = _ort_greedy(sess, model, ids, mask, NEW)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_no_cache_export_runs_at_other_batch_sizes_and_lengths(models, name, tmp_path):
    model = models[name]
    example = np.zeros((2, 6), np.int64)
    path = export(
        model, example, tmp_path / "lm.onnx", input_names=["input_ids"],
        output_names=["logits"], dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}},
    )  # fmt: skip
    sess = _session(path)
    for b, t in ((2, 6), (1, 11), (3, 2), (4, 1)):
        ids = np.random.default_rng(b * 10 + t).integers(0, _vocab(model), (b, t))
        got = sess.run(None, {"input_ids": ids.astype(np.int64)})[0]
        want = model(Device.cpu().tensor(ids.astype(np.int64))).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_decoder_export_refuses_a_model_without_a_cache_forward(tmp_path):
    with pytest.raises(ExportError, match="no forward_cached"):
        export_decoder(nn.Linear(3, 2), tmp_path / "x.onnx")


def test_an_axis_named_as_a_sum_grows_with_its_parts(tmp_path):
    """dynamic_axes may name an axis "a + b" (as long as axes a and b together): it is
    traced growing with its parts, named so in the file, and sized at run time from them."""
    from burn_remote import functional as F

    def fn(x, y, z):  # type: ignore[no-untyped-def]
        return F.cat([x, y], axis=1) * z

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(2, 4)).astype(np.float32)
    z = rng.normal(size=(2, 7)).astype(np.float32)
    axes = {0: {1: "a"}, 1: {1: "b"}, 2: {1: "a + b"}}
    path = export(fn, (x, y, z), tmp_path / "sum.onnx", dynamic_axes=axes)
    proto = onnx.load(str(path))
    dims = proto.graph.input[2].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == [2, "a + b"]
    sess = _session(path)
    for a, b in ((3, 4), (1, 9), (5, 1)):
        xs = [rng.normal(size=(2, n)).astype(np.float32) for n in (a, b, a + b)]
        want = fn(*[Device.cpu().tensor(v) for v in xs]).numpy()
        got = sess.run(None, dict(zip(["input_0", "input_1", "input_2"], xs)))[0]
        np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(ExportError, match="not the sum of its parts"):
        export(fn, (x, y, z[:, :6]), tmp_path / "bad.onnx", dynamic_axes=axes)
    with pytest.raises(ExportError, match="'c' is no other input's axis"):
        export(fn, (x, y, z), tmp_path / "bad.onnx", dynamic_axes={0: {1: "a"}, 2: {1: "a + c"}})
