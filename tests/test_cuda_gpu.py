"""The CUDA backend on a real GPU (skipped without one; `make gpu-check` runs them).

Each defect of issue 17 has its test here; test_cuda_sim.py checks the same behaviour on a
simulated GPU in CI. The op suites (test_ops_*) also run on cuda:0 through the `device`
fixture.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice, optim
from burn_remote import functional as F
from burn_remote import linalg as la
from burn_remote import signal as sg
from conftest import _UNAVAILABLE

CUDA_WHY = _UNAVAILABLE["cuda:0"]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA_WHY is not None, reason=CUDA_WHY or ""),
    pytest.mark.timeout(300),
]
EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
sys.path.insert(0, EXAMPLES)


@pytest.fixture(scope="module")
def gpu() -> Device:
    return Device.cuda(0)


def test_digits_mlp_trains_on_cuda(gpu):
    import digits

    _, losses, acc = digits.train(gpu, epochs=12)
    assert losses[-1] < losses[0] / 4
    assert acc >= 0.95, f"test accuracy {acc:.3f} on cuda:0"


def test_replayed_steps_reserve_no_device_memory(gpu):
    """The pool's dry run sizes it: after the first steps' graphs have run once, steps
    make no page reservation (cudaMalloc) and no release (cudaFree)."""
    import digits

    xtr, ytr, _, _ = digits.load(0)
    net = digits.model(gpu, hidden=512)
    opt = optim.AdamW(net.parameters(), lr=1e-3)
    counts = []
    for step, (xb, yb) in enumerate(digits.batches(xtr, ytr, 64, 0)):
        loss = F.cross_entropy(net(gpu.tensor(xb)), gpu.tensor(yb))
        loss.backward()
        opt.step()
        opt.zero_grad()
        gpu.flush()
        stats = gpu.memory_stats()
        counts.append(sum(r.page_allocs + r.page_releases for r in stats.pools))
        if step == 20:
            break
    from burn_remote.engine.memory import installed_allocator

    assert gpu._rec.runtime.backend.memory is installed_allocator().memories[0]
    assert counts[0] > 0, "the pool reserved nothing: is it CuPy's allocator?"
    assert counts[-1] == counts[0], f"page reservations/releases per step: {counts}"


def test_gradients_of_conv_pool_gather_scatter_match_the_cpu(gpu, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    idx = rng.integers(0, 6, (2, 3, 6, 2))
    grads = {}
    for dev in (gpu, Device.cpu()):
        t = dev.tensor(x, requires_grad=True)
        k = dev.tensor(w, requires_grad=True)
        y = F.max_pool2d(F.relu(F.conv2d(t, k, padding=1)), 2)
        picked = F.gather(t, dev.tensor(idx), -1)
        scattered = F.scatter_add(t, dev.tensor(idx), picked, -1)
        target = dev.tensor(np.array([1, 5, -100, 7]))
        ce = F.cross_entropy(y.reshape(4, 18), target, ignore_index=-100, label_smoothing=0.1)
        (ce + (scattered * scattered).mean()).backward()
        grads[dev.spec] = (t.grad.numpy(), k.grad.numpy())
    for got, want in zip(grads["cuda:0"], grads["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool", "int32", "float16"])
def test_scatter_add_small_dtypes_on_cuda(gpu, dtype):
    base = (np.arange(15).reshape(3, 5) % (2 if dtype == "bool" else 7)).astype(dtype)
    idx = np.array([[0, 1, 1, 4], [2, 2, 2, 0], [3, 0, 4, 4]])
    got = F.scatter_add(gpu.tensor(base), gpu.tensor(idx), gpu.tensor(base[:, :4]), 1)
    cpu = Device.cpu()
    want = F.scatter_add(cpu.tensor(base), cpu.tensor(idx), cpu.tensor(base[:, :4]), 1)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_bfloat16_and_uniform_on_cuda(gpu):
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    out = {}
    for dev in (gpu, Device.cpu()):
        t = dev.tensor(x, dtype="bfloat16")
        y = F.softmax(t * 2.0 + 1.0, axis=-1) @ dev.tensor(np.ones((6, 2)), dtype="bfloat16")
        out[dev.spec] = (
            y.numpy().astype(np.float32),
            dev.uniform((1000,), key=2**40 + 3).numpy(),
            dev.uniform((7,), key=5, dtype="bfloat16").numpy().astype(np.float32),
        )
    np.testing.assert_allclose(out["cuda:0"][0], out["cpu"][0], rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(out["cuda:0"][1], out["cpu"][1])
    np.testing.assert_array_equal(out["cuda:0"][2], out["cpu"][2])


def test_linalg_and_signal_on_cuda_match_the_cpu(gpu, rng):
    a = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    b = rng.standard_normal((2, 3, 4))
    m = rng.standard_normal((5, 3))
    s = rng.standard_normal((16,)).astype(np.float32)
    res = {}
    for dev in (gpu, Device.cpu()):
        A = dev.tensor(a, requires_grad=True)
        x = la.solve(A, dev.tensor(b))
        (x.sum() + la.det(A).sum()).backward()
        q, r = la.qr(dev.tensor(m))
        spec = sg.rfft(dev.tensor(s))
        res[dev.spec] = [
            x.numpy(),
            A.grad.numpy(),
            la.inv(dev.tensor(a)).numpy(),
            q.numpy() @ r.numpy(),
            la.svdvals(dev.tensor(m)).numpy(),
            spec.numpy(),
            sg.irfft(spec, n=16).numpy(),
        ]
    for got, want in zip(res["cuda:0"], res["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_host_fallback_reads_what_the_plan_wrote(gpu, rng):
    """An extension op with only a NumPy kernel runs as a host copy in the middle of a plan:
    the copy must wait for the matmuls queued before it on the plan's stream."""
    from support.extdemo_ops import scale_shift

    x = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
    out = {}
    for dev in (gpu, Device.cpu()):
        t = dev.tensor(x)
        y = t @ t @ t @ t  # keeps the stream busy when the fallback copies
        out[dev.spec] = (scale_shift(y, scale=3.0, shift=1.0) @ t).numpy()
    np.testing.assert_allclose(out["cuda:0"], out["cpu"], rtol=1e-4, atol=1e-4)


def test_sessions_on_other_streams_share_plans_and_constants(gpu):
    """One plan (with a constant) compiled by one session and replayed concurrently by
    others on their own streams: every result is right."""
    from burn_remote.engine.backend import get_backend
    from burn_remote.engine.executor import Executor

    base = get_backend("cuda:0")
    executor = Executor(base.session())
    dev = Device.cpu()
    t = dev.tensor(np.ones((256, 256), np.float32))
    out = (t + dev.full((256, 256), 2.0)) * 3.0
    out.numpy()
    graph = next(reversed(dev._rec.runtime.executor._plans.values())).graph
    plan = executor.register("g", graph)
    errors: list[BaseException] = []

    def run() -> None:
        view = base.session()
        try:
            for _ in range(20):
                x = view.from_numpy(np.full((256, 256), 5.0, np.float32))
                (y,) = Executor(view).run(plan, [x], [])
                np.testing.assert_array_equal(view.to_numpy(y), np.full((256, 256), 21.0))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]


def test_a_second_gpu_keeps_its_own_pool_and_streams():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    zero, one = Device.cuda(0), Device.cuda(1)
    before = zero.memory_stats().in_use
    x = np.arange(1 << 20, dtype=np.float32)
    np.testing.assert_array_equal((one.tensor(x) * 2.0 + one.full(x.shape, 1.0)).numpy(), x * 2 + 1)
    backend = one._rec.runtime.backend
    assert backend.memory is not zero._rec.runtime.backend.memory
    assert backend.stream.device_id == 1
    assert one.memory_stats().in_use >= x.nbytes and zero.memory_stats().in_use == before


def test_serve_cuda_trains_digits_with_a_client(tmp_path, monkeypatch):
    import digits
    from burn_remote.server.testing import start_server

    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    server = start_server(tmp_path / "server", device="cuda:0")
    try:
        dev = RemoteDevice(server.target)
        _, losses, acc = digits.train(dev, epochs=8)
        dev.close()
    finally:
        assert server.stop() == 0, server.output()
    assert acc >= 0.93, f"test accuracy {acc:.3f} on serve --device cuda:0"


def test_lora_job_and_onnx_export_on_a_cuda_server(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    import jobs_demo
    from burn_remote.server.testing import start_server

    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    server = start_server(tmp_path / "server", device="cuda:0")
    try:
        report = jobs_demo.main(server.target, base_steps=10, lora_steps=12)
    finally:
        assert server.stop() == 0, server.output()
    assert report["onnx_max_abs_diff"] <= 1e-4
    assert report["loss"][1] < report["loss"][0] + 0.5
