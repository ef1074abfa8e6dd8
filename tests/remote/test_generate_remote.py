"""`generate` through a real `burn-remote serve`: the same tokens as on the local CPU (greedy
and sampled by key), the KV cache never crossing the wire, each decode step one small
replayed graph, and tokens read in blocks."""

from __future__ import annotations

import numpy as np
from burn_remote import Device, RemoteDevice, nn

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=200, context=64)
PROMPT, NEW = 10, 32


def _model_dir(tmp_path):
    nn.seed(3)
    nn.GPT(CFG).save_pretrained(tmp_path / "gpt")
    return tmp_path / "gpt"


def _prompts():
    ids = np.random.default_rng(4).integers(1, CFG.vocab, (3, PROMPT))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    ids[mask == 0] = 0
    return ids, mask


def test_remote_generate_equals_local_and_keeps_the_cache_on_the_server(server, tmp_path):
    directory = _model_dir(tmp_path)
    ids, mask = _prompts()
    local = nn.GPT.from_pretrained(directory, device=Device.cpu())
    dev = RemoteDevice(server.target)
    remote = nn.GPT.from_pretrained(directory, device=dev)
    sample = dict(do_sample=True, top_k=10, top_p=0.95, key=11)
    for kw in ({}, sample):
        want = local.generate(ids, NEW, attention_mask=mask, eos_token_id=None, **kw)
        remote.generate(ids, NEW, attention_mask=mask, eos_token_id=None, **kw)  # registers
        before = dev.stats()
        got = remote.generate(ids, NEW, attention_mask=mask, eos_token_id=None, **kw)
        after = dev.stats()
        np.testing.assert_array_equal(got, want)
        stats = remote.generation_stats
        # the model kept its decode step from the first call: every step replays
        assert stats["decode_recordings"] == 0 and stats["decode_replays"] == stats["decode_calls"]
        assert stats["decode_steps"] == NEW - 1 and stats["decode_calls"] < NEW // 2  # in blocks
        cache = stats["cache_bytes"]
        assert cache == 2 * CFG.n_layer * 3 * (PROMPT + NEW) * CFG.d_model * 4
        # the cache (and the logits) stayed on the server: what came back is about the tokens
        received = after["data_bytes_received"] - before["data_bytes_received"]
        assert received <= 3 * NEW * 8 + 64 * stats["reads"], received
        # a repeated call registers nothing (the server keeps the graphs by hash); what it
        # sends is the prompt, its masks and a few hundred bytes per replayed decode step
        sent = after["bytes_sent"] - before["bytes_sent"]
        assert after["graphs_registered"] == before["graphs_registered"]
        assert sent < 4096 + 300 * NEW and sent < cache / 8, (sent, cache)
        assert after["replays"] - before["replays"] >= stats["decode_calls"]
        assert stats["reads"] <= 2 + NEW // 8
    dev.close()


def test_remote_stream_yields_generates_tokens_in_order_read_in_blocks(server, tmp_path):
    directory = _model_dir(tmp_path)
    ids, mask = _prompts()
    local = nn.GPT.from_pretrained(directory, device=Device.cpu())
    want = local.generate(ids, NEW, attention_mask=mask, eos_token_id=None)
    dev = RemoteDevice(server.target)
    remote = nn.GPT.from_pretrained(directory, device=dev)
    columns = list(remote.stream(ids, NEW, attention_mask=mask, eos_token_id=None))
    np.testing.assert_array_equal(np.stack(columns, axis=1), want[:, PROMPT:])
    stats = remote.generation_stats
    assert stats["new_tokens"] == NEW and stats["reads"] <= 2 + NEW // 8  # no read per token
    # EOS: the stream ends after the step where the last row emitted it, as locally
    eos = int(want[0, PROMPT + 5])
    done = local.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    got = list(remote.stream(ids, NEW, attention_mask=mask, eos_token_id=eos, pad_token_id=0))
    np.testing.assert_array_equal(np.stack(got, axis=1), done[:, PROMPT:])
    dev.close()
