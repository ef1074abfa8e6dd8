"""`generate` against transformers' `generate` on the same GPT-2 checkpoint (random init,
saved with save_pretrained): greedy token for token, EOS and the repetition penalty; the
top-k/top-p filters against transformers' warpers; draws reproducible by key on every
backend; the decode step one captured graph replayed."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, nn
from burn_remote.nn import _generate, _sampling
from burn_remote.nn._decode_state import DECODE_BLOCK
from conftest import BACKENDS

VOCAB, PROMPT, NEW = 300, 12, 32


def _decode_calls(new: int) -> tuple[int, int]:
    """(blocks, single steps) a call of `new` tokens without EOS queues: whole blocks of
    DECODE_BLOCK decode steps, then single steps to the end."""
    return divmod(new - 1, DECODE_BLOCK)


def _first_recordings(new: int) -> int:
    """Each of the two captures records twice before it replays."""
    return sum(min(2, n) for n in _decode_calls(new))


@pytest.fixture
def short_reads(monkeypatch):
    """Reads of DECODE_BLOCK tokens, so that a stop before NEW tokens shows in the counts of
    these short generations (with the default, NEW tokens are queued before the second read)."""
    monkeypatch.setattr(_generate, "TOKEN_BLOCK", DECODE_BLOCK)
    return DECODE_BLOCK


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A GPT-2 whose logits are spread wide (initializer_range 0.2), so greedy choices are
    not near-ties that float rounding could flip between two correct implementations."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hf_model(gpt2_dir):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()


def _prompts(batch: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch` prompts of PROMPT tokens, rows after the first left-padded (with id 0)."""
    ids = np.random.default_rng(1).integers(1, VOCAB, (batch, PROMPT))
    mask = np.ones_like(ids)
    for row, pad in zip(range(1, batch), (3, 7)):
        mask[row, :pad] = 0
    ids[mask == 0] = 0
    return ids, mask


def _hf_generate(hf_model, ids, mask, **kw) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = hf_model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **kw)
    return out.numpy()


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_32_tokens_equal_transformers(gpt2_dir, hf_model, batch) -> None:
    ids, mask = _prompts(batch)
    model = nn.GPT.from_pretrained(gpt2_dir)
    got = model.generate(ids, NEW, attention_mask=mask, eos_token_id=None, pad_token_id=0)
    want = _hf_generate(
        hf_model, ids, mask, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
        pad_token_id=0,
    )  # fmt: skip
    assert got.shape == (batch, PROMPT + NEW)
    np.testing.assert_array_equal(got, want)
    stats = model.generation_stats
    # two captured decode graphs (a block of steps, a single step): each recorded twice
    # (until two recordings agree), then replayed
    assert stats["decode_steps"] == NEW - 1
    assert stats["decode_calls"] == sum(_decode_calls(NEW))
    assert stats["decode_recordings"] == _first_recordings(NEW) == 4
    assert stats["decode_replays"] == stats["decode_calls"] - 4
    assert stats["reads"] <= 2 + NEW // _generate.TOKEN_BLOCK


def test_eos_stops_and_repetition_penalty_equal_transformers(
    gpt2_dir, hf_model, short_reads
) -> None:
    ids, mask = _prompts(3)
    model = nn.GPT.from_pretrained(gpt2_dir)
    kw = dict(repetition_penalty=1.3, eos_token_id=29, pad_token_id=5)
    got = model.generate(ids, NEW, attention_mask=mask, **kw)
    want = _hf_generate(hf_model, ids, mask, max_new_tokens=NEW, do_sample=False, **kw)
    assert want.shape[1] < PROMPT + NEW  # EOS ended every row early here...
    np.testing.assert_array_equal(got, want)  # ...at the same length, pads after each EOS
    assert model.generation_stats["decode_steps"] < NEW - 1  # the loop stopped early too


def test_top_k_top_p_equal_transformers_warpers(cpu) -> None:
    import torch
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 500)).astype(np.float32) * 3
    logits[1, :40] = logits[1, 0]  # a tie across the k-th place: all of it kept
    for k, p in [(1, 1.0), (10, 1.0), (50, 1.0), (50, 0.9), (20, 0.5), (200, 0.95)]:
        got = _sampling.top_k_top_p(cpu.tensor(logits), k, p).numpy()
        want = TopKLogitsWarper(k)(None, torch.from_numpy(logits))
        if p < 1:
            want = TopPLogitsWarper(p)(None, want)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want.numpy()), f"{k} {p}")
        np.testing.assert_array_equal(got[np.isfinite(got)], logits[np.isfinite(got)])


def test_gumbel_draws_follow_softmax(cpu) -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0, float("-inf")], np.float32)
    rows = 20000
    draws = _sampling.gumbel_argmax(cpu.tensor(np.tile(logits, (rows, 1))), cpu.tensor(np.int64(5)))
    counts = np.bincount(draws.numpy(), minlength=5) / rows
    want = np.exp(logits - logits.max())
    want /= want.sum()
    np.testing.assert_allclose(counts, want, atol=0.015)
    assert counts[4] == 0


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cpu"])
def test_sampling_is_reproducible_by_key_on_every_backend(gpt2_dir, backend) -> None:
    ids, mask = _prompts(3)
    kw = dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.8, repetition_penalty=1.1)
    cpu = nn.GPT.from_pretrained(gpt2_dir)
    first = cpu.generate(ids, NEW, attention_mask=mask, key=7, **kw)
    again = cpu.generate(ids, NEW, attention_mask=mask, key=7, **kw)
    other = cpu.generate(ids, NEW, attention_mask=mask, key=8, **kw)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    model = nn.GPT.from_pretrained(gpt2_dir, device=Device.parse(backend))
    np.testing.assert_array_equal(model.generate(ids, NEW, attention_mask=mask, key=7, **kw), first)


def test_streamer_gets_the_prompt_then_each_token_in_order_then_end(gpt2_dir) -> None:
    events: list = []

    class Recorder:
        def put(self, value):
            events.append(np.array(value))

        def end(self):
            events.append("end")

    ids, mask = _prompts(3)
    model = nn.GPT.from_pretrained(gpt2_dir)
    out = model.generate(ids, NEW, attention_mask=mask, eos_token_id=29, streamer=Recorder())
    assert events[-1] == "end"
    np.testing.assert_array_equal(events[0], ids)
    np.testing.assert_array_equal(np.stack(events[1:-1], axis=1), out[:, PROMPT:])


def test_stream_yields_generates_tokens_in_order_and_stops_at_eos(
    gpt2_dir, hf_model, short_reads
) -> None:
    ids, mask = _prompts(3)
    model = nn.GPT.from_pretrained(gpt2_dir)
    kw = dict(repetition_penalty=1.3, eos_token_id=29, pad_token_id=5)
    want = _hf_generate(hf_model, ids, mask, max_new_tokens=NEW, do_sample=False, **kw)
    assert want.shape[1] < PROMPT + NEW  # EOS ends every row before NEW tokens
    columns = list(model.stream(ids, NEW, attention_mask=mask, **kw))
    assert all(c.shape == (3,) and c.dtype == np.int64 for c in columns)
    np.testing.assert_array_equal(np.stack(columns, axis=1), want[:, PROMPT:])
    assert model.generation_stats["new_tokens"] == len(columns)
    assert model.generation_stats["decode_steps"] < NEW - 1  # stopped at EOS, not at NEW
    # without EOS: every token, equal to generate's (sampled by key too)
    for extra in ({}, dict(do_sample=True, top_k=20, key=3)):
        full = model.generate(ids, NEW, attention_mask=mask, eos_token_id=None, **extra)
        got = list(model.stream(ids, NEW, attention_mask=mask, eos_token_id=None, **extra))
        np.testing.assert_array_equal(np.stack(got, axis=1), full[:, PROMPT:])


def test_a_later_call_replays_the_decode_step_the_model_kept(gpt2_dir, hf_model) -> None:
    ids, mask = _prompts(3)
    hf = dict(eos_token_id=None, pad_token_id=0, repetition_penalty=1.3, do_sample=False)
    kw = dict(attention_mask=mask, eos_token_id=None, pad_token_id=0, repetition_penalty=1.3)
    want = _hf_generate(hf_model, ids, mask, max_new_tokens=NEW, **hf)
    model = nn.GPT.from_pretrained(gpt2_dir)
    np.testing.assert_array_equal(model.generate(ids, NEW, **kw), want)
    # other prompts of the same shape: nothing recorded, every step replayed over the reset
    # state (cache, mask, offsets, tokens seen), tokens as a fresh model's
    other = (ids * 7 + 5) % VOCAB
    other[mask == 0] = 0
    got = model.generate(other, NEW, **kw)
    stats = model.generation_stats
    assert stats["decode_recordings"] == 0 and stats["decode_replays"] == sum(_decode_calls(NEW))
    np.testing.assert_array_equal(got, nn.GPT.from_pretrained(gpt2_dir).generate(other, NEW, **kw))
    np.testing.assert_array_equal(model.generate(ids, NEW, **kw), want)
    # another length records anew (the kept state is dropped), and is still right
    short = _hf_generate(hf_model, ids, mask, max_new_tokens=NEW - 4, **hf)
    np.testing.assert_array_equal(model.generate(ids, NEW - 4, **kw), short)
    assert model.generation_stats["decode_recordings"] == _first_recordings(NEW - 4)
    # sampling: the kept step draws from the key of each call
    sample = dict(do_sample=True, top_k=20, attention_mask=mask, eos_token_id=None)
    a = model.generate(ids, NEW, key=3, **sample)
    b = model.generate(ids, NEW, key=4, **sample)
    assert model.generation_stats["decode_recordings"] == 0
    np.testing.assert_array_equal(model.generate(ids, NEW, key=3, **sample), a)
    assert (a != b).any()
    # a stream left open holds the kept state: a call meanwhile gets a state of its own
    it = model.stream(ids, NEW, key=3, **sample)
    first = next(it)
    np.testing.assert_array_equal(model.generate(ids, NEW, key=4, **sample), b)
    rest = list(it)
    np.testing.assert_array_equal(np.stack([first, *rest], axis=1), a[:, PROMPT:])


def test_stream_stopped_early_queues_no_more_steps(gpt2_dir, short_reads) -> None:
    model = nn.GPT.from_pretrained(gpt2_dir)
    ids = _prompts(1)[0]
    full = model.generate(ids, NEW, eos_token_id=None)
    it = model.stream(ids, NEW, eos_token_id=None)
    first = [next(it) for _ in range(3)]
    it.close()
    np.testing.assert_array_equal(np.stack(first, axis=1), full[:, PROMPT : PROMPT + 3])
    # the first token read alone, then one read's tokens while the next were queued
    assert model.generation_stats["decode_steps"] <= 1 + 2 * short_reads < NEW - 1
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.stream(ids, 0)  # refused at the call, not at the first token


def test_bad_arguments_are_refused_by_name(gpt2_dir) -> None:
    model = nn.GPT.from_pretrained(gpt2_dir)
    ids = np.ones((2, 5), np.int64)
    right = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="right padding"):
        model.generate(ids, 4, attention_mask=right)
    with pytest.raises(ValueError, match="context of 64"):
        model.generate(ids, 60)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(ids, 4, do_sample=True, top_k=0, top_p=0.9)
    with pytest.raises(ValueError, match="vocabulary"):
        model.generate(np.full((1, 3), VOCAB), 4)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(ids, 4, do_sample=True, temperature=0.0)


@pytest.fixture(scope="module")
def llm_dirs(tmp_path_factory):
    """The Llama-family checkpoints of tests/hf/llm_tiny.py (GQA, MQA + llama3 RoPE, Qwen2's
    biases, Mistral's sliding window of 5), with room for a prompt and 32 new tokens."""
    from tests.hf.llm_tiny import configs, edit_config, make_llm

    out = {}
    for name in configs():
        directory = make_llm(tmp_path_factory.mktemp(name), name)
        edit_config(directory, max_position_embeddings=64)
        out[name] = directory
    return out


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2", "mistral"])
def test_llama_family_greedy_32_tokens_equal_transformers(llm_dirs, family, batch) -> None:
    from tests.hf.llm_tiny import VOCAB as LLM_VOCAB
    from tests.hf.llm_tiny import hf_model

    ids, mask = _prompts(batch)
    ids %= LLM_VOCAB
    ids[mask == 0] = 0
    model = nn.AutoModelForCausalLM.from_pretrained(llm_dirs[family])
    got = model.generate(ids, NEW, attention_mask=mask, eos_token_id=None, pad_token_id=0)
    want = _hf_generate(
        hf_model(llm_dirs[family]), ids, mask, max_new_tokens=NEW, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    np.testing.assert_array_equal(got, want)
    stats = model.generation_stats
    assert (
        stats["decode_recordings"] == 4 and stats["decode_replays"] == sum(_decode_calls(NEW)) - 4
    )
