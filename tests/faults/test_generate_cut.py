"""A remote `generate` through a 3 s link cut (the project's UDP fault proxy): the session
resumes and the tokens are those of the same generation without the cut."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import RemoteDevice, nn
from burn_remote.protocol.transport.faultproxy import FaultProxy

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

CFG = nn.GPTConfig(n_layer=2, n_head=4, d_model=64, vocab=200, context=128)
NEW = 64
CUT_AFTER = 12
"""New tokens streamed before the link is cut (the decode loop is then mid-generation)."""


class _CutAfter:
    """A streamer that cuts the link once `after` new tokens have arrived."""

    def __init__(self, proxy: FaultProxy, after: int) -> None:
        self.proxy, self.after, self.seen, self.cut_at = proxy, after, -1, None

    def put(self, ids: np.ndarray) -> None:
        self.seen += 1  # the first put is the prompt
        if self.seen == self.after:
            self.proxy.cut(3.0)
            self.cut_at = self.seen

    def end(self) -> None:
        pass


def test_remote_generate_through_a_3s_link_cut_equals_the_uncut_run(spawn, tmp_path) -> None:
    # A 1 s idle timeout makes both ends drop the QUIC connection during the cut, so the
    # client really reconnects and resumes (a cut under the idle timeout is plain QUIC loss).
    server = spawn("--idle-timeout", "1", "--resume-grace", "30")
    nn.seed(9)
    nn.GPT(CFG).save_pretrained(tmp_path / "gpt")
    ids = np.random.default_rng(10).integers(1, CFG.vocab, (2, 12))
    mask = np.ones_like(ids)
    mask[1, :5] = 0
    ids[mask == 0] = 0
    host, port = server.address.rsplit(":", 1)
    proxy = FaultProxy.start_thread((host, int(port)), seed=11)
    ph, pp = proxy.address
    try:
        dev = RemoteDevice(f"{server.peer_id}@{ph}:{pp}", key=tmp_path / "key")
        model = nn.GPT.from_pretrained(tmp_path / "gpt", device=dev)
        sample = dict(do_sample=True, top_k=20, key=12)
        for kw in ({}, sample):
            want = model.generate(ids, NEW, attention_mask=mask, eos_token_id=None, **kw)
            cutter = _CutAfter(proxy, CUT_AFTER)
            got = model.generate(
                ids, NEW, attention_mask=mask, eos_token_id=None, streamer=cutter, **kw
            )
            assert cutter.cut_at == CUT_AFTER
            np.testing.assert_array_equal(got, want)
        stats = dev.stats()
        dev.close()
    finally:
        proxy.stop()
    assert proxy.stats.cut > 0
    assert stats["errors"] == 0
