"""A KV cache over a local device's memory quota is refused by name before the prefill (the
server's session quota is tested against a real server in tests/remote/test_generate_server.py)."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import nn
from burn_remote._device import Device, LocalRuntime

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=200, context=1024)
LIMIT = 4 * 2**20


def test_a_cache_over_a_local_quota_is_refused_by_name_and_a_small_one_runs():
    dev = Device("cpu", LocalRuntime("cpu", memory_limit=LIMIT, pooled=True))
    nn.seed(5)
    model = nn.GPT(CFG, device=dev)
    held, limit = dev.memory_quota()
    assert limit == LIMIT and 0 < held < LIMIT
    ids = np.random.default_rng(6).integers(1, CFG.vocab, (8, 8))
    needed = 2 * CFG.n_layer * 8 * 1000 * CFG.d_model * 4
    with pytest.raises(nn.KVCacheDoesNotFit, match=f"needs {needed} bytes") as err:
        model.generate(ids, 992, eos_token_id=None)
    assert (err.value.needed, err.value.free) == (needed, LIMIT - held)
    assert dev.memory_room() == (LIMIT - held, "the device's memory limit")
    assert dev.memory_quota() == (held, LIMIT)  # nothing was allocated
    # a cache that fits runs, with the tokens of the same model without a quota
    unlimited = nn.GPT(CFG, device=Device.cpu())
    unlimited.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(
        model.generate(ids[:1], 8, eos_token_id=None),
        unlimited.generate(ids[:1], 8, eos_token_id=None),
    )


def test_a_device_without_a_quota_has_none():
    assert Device.cpu().memory_quota() is None
