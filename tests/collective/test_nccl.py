"""The NCCL engine: imports everywhere, skips without GPUs, and between two CUDA servers
all-reduces through NCCL (the engine the client picks when every rank is a GPU server).
``make gpu-check`` runs the GPU test on machines with two GPUs or more."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote.engine.collective import nccl


def _gpus() -> int:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def test_nccl_module_imports_and_says_why_it_cannot_run_here():
    reason = nccl.available()
    if _gpus() == 0:
        assert reason, "without a GPU NCCL cannot be available"


def test_the_unique_id_crosses_the_wire_as_bytes_and_back():
    wire = bytes(range(128))
    as_chars = nccl._as_uid(wire)
    assert len(as_chars) == 128 and min(as_chars) >= -128 and max(as_chars) <= 127
    assert bytes(b & 0xFF for b in as_chars) == wire


@pytest.mark.skipif(_gpus() < 2, reason="NCCL between servers needs two CUDA GPUs")
def test_gpu_servers_all_reduce_through_nccl(servers):
    import os

    why = nccl.available()
    if why is not None:  # two GPUs but no NCCL: `make gpu-check` (REQUIRE_CUDA) must say so
        if os.environ.get("BURN_REMOTE_REQUIRE_CUDA") == "1":
            pytest.fail(f"NCCL is not usable on this multi-GPU machine: {why}")
        pytest.skip(f"NCCL is not usable here: {why}")
    from burn_remote import RemoteDevice
    from burn_remote import collective as C
    from burn_remote.server.testing import start_daemon

    tmp = servers(1, "--allow-any")[0].data_dir.parent
    gpu = [start_daemon("serve", tmp / f"gpu{k}", "--device", f"cuda:{k}", "--allow-any")
           for k in range(2)]  # fmt: skip
    try:
        for d in gpu:
            d.know(*[o for o in gpu if o is not d])
        devs = [RemoteDevice(d.target) for d in gpu]
        with C.Group(devs) as g:
            assert g._impl.engine == "nccl"
            xs = [np.random.default_rng(k).standard_normal(1_000_003).astype(np.float32)
                  for k in range(2)]  # fmt: skip
            outs = [C.all_reduce(d.tensor(x), g, "sum") for d, x in zip(devs, xs)]
            got = [o.numpy() for o in outs]
            np.testing.assert_allclose(got[0], xs[0] + xs[1], rtol=1e-5, atol=1e-5)
            assert got[0].tobytes() == got[1].tobytes()
            scalars = [
                C.all_reduce(d.tensor(np.float32(k + 1)), g, "sum") for k, d in enumerate(devs)
            ]
            assert scalars[0].numpy().shape == () and scalars[0].numpy() == 3.0
    finally:
        for d in gpu:
            d.stop()
