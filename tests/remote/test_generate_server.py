"""`generate` against a real `burn-remote serve`, server side: the session's memory quota
covers the KV cache (a cache that does not fit is refused by name before the prefill), and
two clients generating at once on one server each make progress (their tokens interleave)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice, nn

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=200, context=1024)
QUOTA = 4 * 2**20
"""The session quota of the quota test: the model (0.7 MB, twice that while it loads) and a
short generation's cache fit; a cache of 8 rows x 1000 slots (8 MB) does not."""


def _model_dir(tmp_path):
    nn.seed(5)
    nn.GPT(CFG).save_pretrained(tmp_path / "gpt")
    return tmp_path / "gpt"


def _prompt(rows: int, tokens: int, seed: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, CFG.vocab, (rows, tokens))


def test_a_cache_over_the_session_quota_is_refused_by_name_before_the_prefill(spawn, tmp_path):
    server = spawn("--session-memory", str(QUOTA))
    directory = _model_dir(tmp_path)
    dev = RemoteDevice(server.target)
    model = nn.GPT.from_pretrained(directory, device=dev)
    held, quota = dev.memory_quota()
    assert quota == QUOTA and 0 < held < QUOTA
    big = _prompt(8, 8)
    needed = 2 * CFG.n_layer * 8 * (8 + 992) * CFG.d_model * 4
    assert held + needed > QUOTA
    before, held_before = dev.stats(), dev.session_stats()["session_bytes"]
    with pytest.raises(nn.KVCacheDoesNotFit, match=f"KVCacheDoesNotFit.*{needed} bytes") as err:
        model.generate(big, 992, eos_token_id=None)
    assert (err.value.needed, err.value.quota) == (needed, QUOTA)
    assert str(QUOTA) in str(err.value) and "--session-memory" in str(err.value)
    after = dev.stats()
    # refused before the prefill: no graph ran or was registered, no prompt was sent, and
    # the session holds what it held (no cache was made)
    for counter in ("graphs_registered", "replays", "data_bytes_sent", "errors"):
        assert after[counter] == before[counter], counter
    assert dev.session_stats()["session_bytes"] == held_before
    # the session is as it was: a generation whose cache fits runs, and equals the CPU's
    small = _prompt(1, 8)
    got = model.generate(small, 16, eos_token_id=None)
    local = nn.GPT.from_pretrained(directory, device=Device.cpu())
    np.testing.assert_array_equal(got, local.generate(small, 16, eos_token_id=None))
    dev.close()


class _Arrivals:
    """A streamer per client writing (client, tokens so far) to one shared, ordered log."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.lock = threading.Lock()

    def streamer(self, name: str):  # type: ignore[no-untyped-def]
        arrivals = self

        class Streamer:
            def __init__(self) -> None:
                self.prompt_seen = False

            def put(self, ids: np.ndarray) -> None:
                if not self.prompt_seen:  # the first put is the prompt
                    self.prompt_seen = True
                    return
                with arrivals.lock:
                    arrivals.log.append(name)

            def end(self) -> None:
                pass

        return Streamer()


def test_two_clients_generating_on_one_server_both_make_progress(server, tmp_path):
    """Each client's tokens arrive while the other's generation is under way: the merged
    order of arrivals is not one whole generation and then the other."""
    directory = _model_dir(tmp_path)
    new = 384
    names = ("a", "b")
    devs = [RemoteDevice(server.target, key=tmp_path / f"key-{n}") for n in names]
    models = [nn.GPT.from_pretrained(directory, device=d) for d in devs]
    prompts = [_prompt(1, 16, seed=7), _prompt(1, 16, seed=8)]
    for model, prompt in zip(models, prompts):  # graphs registered, sessions warm
        model.generate(prompt, 8, eos_token_id=None)
    arrivals = _Arrivals()
    start = threading.Barrier(2)
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def client(name: str, model, prompt) -> None:  # type: ignore[no-untyped-def]
        try:
            start.wait(timeout=60)
            results[name] = model.generate(
                prompt, new, eos_token_id=None, streamer=arrivals.streamer(name)
            )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=a) for a in zip(names, models, prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    log = arrivals.log
    assert sorted(log) == ["a"] * new + ["b"] * new
    first = {n: log.index(n) for n in names}
    last = {n: len(log) - 1 - log[::-1].index(n) for n in names}
    # neither waited behind the other's whole generation
    assert first["b"] < last["a"] and first["a"] < last["b"], (first, last)
    switches = sum(x != y for x, y in zip(log, log[1:]))
    assert switches >= 4, "".join(log)
    # and each got its own tokens: those of the same generation on the local CPU
    for name, prompt in zip(names, prompts):
        local = nn.GPT.from_pretrained(directory, device=Device.cpu())
        np.testing.assert_array_equal(results[name], local.generate(prompt, new, eos_token_id=None))
    for d in devs:
        d.close()
