"""`generate` against a real `burn-remote serve`, server side: the session's memory quota
covers the KV cache (a cache that does not fit is refused by name before the prefill), and
two client processes generating at once on one server each make progress (their tokens
interleave)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice, nn

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=200, context=1024)
QUOTA = 6 * 2**20
"""The session quota of the quota test: the model (0.7 MB, twice that while it loads) and a
short generation fit, its cache and its graphs (a block of decode steps is charged ~1.6 MB
of plan bookkeeping here, PLAN_BYTES_PER_NODE a node); a cache of 8 rows x 1000 slots (8 MB)
does not."""


def _model_dir(tmp_path):
    nn.seed(5)
    nn.GPT(CFG).save_pretrained(tmp_path / "gpt")
    return tmp_path / "gpt"


def _prompt(rows: int, tokens: int, seed: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, CFG.vocab, (rows, tokens))


def test_a_cache_over_the_peers_share_is_refused_by_name_before_the_prefill(spawn, tmp_path):
    """The peer's share (--peer-memory) binds before the session's quota: another session of
    the same peer holds part of it, and a cache that fits the session's quota but not what
    the peer has left is refused naming --peer-memory, before any graph runs."""
    share = 12 * 2**20
    server = spawn("--session-memory", str(4 * QUOTA), "--peer-memory", str(share))
    from burn_remote.protocol.transport._paths import default_key_path

    # the same key named by its path: a second session of the same peer
    other = RemoteDevice(server.target, key=default_key_path())
    held_elsewhere = other.tensor(np.zeros(8 * 2**20 // 4, np.float32))
    other.sync()
    dev = RemoteDevice(server.target)
    model = nn.GPT.from_pretrained(_model_dir(tmp_path), device=dev)
    dev.sync()
    stats = dev.session_stats()  # one reply: the room and what this session holds
    held, free = stats["session_bytes"], stats["room"]
    assert free == share - 8 * 2**20 - held and dev.memory_room()[1] == "--peer-memory"
    needed = 2 * CFG.n_layer * 8 * (8 + 400) * CFG.d_model * 4  # 6.7 MB: over what is left
    assert held + needed < 4 * QUOTA and needed > free
    before = dev.stats()
    with pytest.raises(nn.KVCacheDoesNotFit, match="bytes are free under --peer-memory"):
        model.generate(_prompt(8, 8), 400, eos_token_id=None)
    after = dev.stats()
    for counter in ("graphs_registered", "replays", "data_bytes_sent", "errors"):
        assert after[counter] == before[counter], counter
    del held_elsewhere
    other.sync()  # the other session's tensor is dropped: the peer's share has room again
    dev.sync()
    stats = dev.session_stats()
    assert stats["room"] == share - stats["session_bytes"]
    assert model.generate(_prompt(8, 8), 400, eos_token_id=None).shape == (8, 408)
    other.close()
    dev.close()


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
    dev.sync()
    before, stats = dev.stats(), dev.session_stats()
    held_before = stats["session_bytes"]
    assert stats["room"] == QUOTA - held_before  # the session quota binds here
    with pytest.raises(nn.KVCacheDoesNotFit, match=f"KVCacheDoesNotFit.*{needed} bytes") as err:
        model.generate(big, 992, eos_token_id=None)
    assert (err.value.needed, err.value.free) == (needed, QUOTA - held_before)
    assert f"{QUOTA - held_before} bytes are free under --session-memory" in str(err.value)
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


def _client(server, tmp_path, directory, name: str, fd: int, new: int, seed: int):  # type: ignore[no-untyped-def]
    script = Path(__file__).with_name("generate_client.py")
    args = [server.target, str(tmp_path / f"key-{name}"), str(directory), name, str(fd)]
    return subprocess.Popen(
        [sys.executable, str(script), *args, str(new), str(seed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(fd,),
    )  # fmt: skip


def test_two_clients_generating_on_one_server_both_make_progress(server, tmp_path):
    """Two client processes (two peers, two sessions) start generating at once; each
    writes a line per token to one shared pipe as it arrives. Each client's tokens arrive
    while the other's generation is under way: the pipe's order is not one whole generation
    and then the other."""
    directory = _model_dir(tmp_path)
    new, names, seeds = 384, ("a", "b"), (7, 8)
    read_fd, write_fd = os.pipe()
    clients = [
        _client(server, tmp_path, directory, n, write_fd, new, s) for n, s in zip(names, seeds)
    ]
    os.close(write_fd)  # the pipe ends when both clients have exited
    try:
        for c in clients:  # loaded and warm: what follows is the two generations only
            assert c.stdout is not None and c.stdin is not None
            assert c.stdout.readline().strip() == "ready"
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        with os.fdopen(read_fd, "rb") as pipe:
            log = pipe.read().decode().split()
        outs = [c.communicate(timeout=300)[0] for c in clients]
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
    assert [c.returncode for c in clients] == [0, 0]
    assert sorted(log) == ["a"] * new + ["b"] * new
    first = {n: log.index(n) for n in names}
    last = {n: len(log) - 1 - log[::-1].index(n) for n in names}
    # neither waited behind the other's whole generation
    assert first["b"] < last["a"] and first["a"] < last["b"], (first, last)
    switches = sum(x != y for x, y in zip(log, log[1:]))
    assert switches >= 4, "".join(log)
    # and each got its own tokens: those of the same generation on the local CPU
    local = nn.GPT.from_pretrained(directory, device=Device.cpu())
    for out, seed in zip(outs, seeds):
        prompt = np.random.default_rng(seed).integers(1, CFG.vocab, (1, 16))
        got = np.array(json.loads(out.strip().splitlines()[-1]))
        np.testing.assert_array_equal(got, local.generate(prompt, new, eos_token_id=None))
