"""The CUDA backend's own code on a simulated GPU (tests/support/cuda_sim.py): CuPy signatures,
allocations through the adaptive pool, streams and syncs, checked without a device.

Each defect this guards against has a twin in test_cuda_gpu.py that runs on a real GPU.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

if os.environ.get("CI") != "true":  # in CI (`make test` installs CuPy) these must run
    pytest.importorskip("cupy", reason="CuPy is not installed (make test installs it)")

from burn_remote import Device, nn, optim  # noqa: E402
from burn_remote import functional as F  # noqa: E402
from support.cuda_sim import NotOnCupy, SimCupyBackend, sim_device, simulated_cuda  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import digits  # noqa: E402


@pytest.fixture
def sim(monkeypatch):
    monkeypatch.delenv("BURN_REMOTE_POOL", raising=False)
    monkeypatch.delenv("BURN_REMOTE_FUSION", raising=False)
    with simulated_cuda() as state:
        yield state


def sim_base(dev: Device):
    """The backend a sim device's session view was made from."""
    return dev._base_backend


@pytest.fixture
def gpu(sim):
    """A client device on the real CupyBackend over the simulator."""
    return sim_device(SimCupyBackend(0, cupy=sys.modules["cupy"]))


def _train(dev: Device, steps: int, on_step=None) -> list[float]:
    xtr, ytr, _, _ = digits.load(0)
    net = digits.model(dev, seed=0)
    opt = optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    batches = digits.batches(xtr, ytr, 64, 0)
    for step in range(steps):
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = digits.batches(xtr, ytr, 64, step)
            xb, yb = next(batches)
        loss = F.cross_entropy(net(dev.tensor(xb)), dev.tensor(yb))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dev.flush()
        if on_step is not None:
            on_step(step)
        if step % 25 == 0 or step == steps - 1:
            losses.append(loss.item())
    return losses


def test_digits_steps_after_the_first_reserve_no_device_memory(sim, gpu):
    """The adaptive pool sizes itself in the first step's dry run: 100 more steps of the
    digits MLP make no cudaMalloc and no cudaFree (each is a device-wide sync)."""
    seen = {}

    def on_step(step: int) -> None:
        if step == 0:
            seen["after_first"] = (sim.mallocs, sim.frees)

    losses = _train(gpu, 101, on_step)
    assert sim.pool_allocs > 0 and sim.default_pool_allocs == 0, "CuPy allocates from the pool"
    assert seen["after_first"][0] > 0
    assert (sim.mallocs, sim.frees) == seen["after_first"], (
        f"steps 2..101 reserved {sim.mallocs - seen['after_first'][0]} pages and released "
        f"{sim.frees - seen['after_first'][1]}"
    )
    # the same training on the CPU engine gives the same losses
    want = _train(Device.cpu(), 101)
    np.testing.assert_allclose(losses, want, rtol=2e-4, atol=2e-5)


def test_a_training_step_never_waits_for_the_device(sim, gpu):
    """Cross-entropy, its gradient, AdamW and uniform draws stay on the device: no int(),
    float() or bool() of a device array inside a step (the loss read is the one wait)."""
    _train(gpu, 3)
    before = sim.syncs
    x = gpu.uniform((32, 5), key=7)
    target = gpu.tensor(np.array([0, 1, -100, 3] * 8))
    logits = nn.Linear(5, 4).to(gpu)(x)
    F.cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.1).backward()
    _train(gpu, 3)
    gpu.sync()
    assert sim.syncs == before, f"{sim.syncs - before} device-to-host syncs in the steps"


def test_every_constant_upload_and_read_is_on_the_plans_stream(sim, gpu):
    """Graph constants are made on the session's stream and waited for before the plan is
    shared; uploads, reads and extension host fallbacks use the stream the plan runs on."""
    from burn_remote.engine import extensions

    backend = gpu._rec.runtime.backend
    base = sim_base(gpu)
    stream = backend.stream.ptr
    assert stream not in (0, 1, 2) and base.stream.ptr != stream
    # the fallback an extension op with only a NumPy kernel gets on the base backend
    fallback = extensions._host_fallback(base, lambda x: np.asarray(x) * 2)
    assert getattr(fallback, "host_fallback", False)
    sim.log.clear()
    t = gpu.tensor(np.arange(6, dtype=np.float32))
    out = (t + gpu.full((6,), 3.0)) * 2.0
    np.testing.assert_array_equal(out.numpy(), (np.arange(6) + 3.0) * 2)
    events = [(e, s) for e, s, _ in sim.log if e in ("alloc", "upload", "read", "sync")]
    wrong = [(e, s) for e, s in events if s != stream]
    assert not wrong, f"on another stream than the plan's ({stream}): {wrong}"
    assert ("sync", stream) in events, "the plan's constants were not waited for"
    with backend.activate():  # a host fallback copies on the active stream
        sim.log.clear()
        fallback(backend.from_numpy(np.ones(3, np.float32)))
    assert {s for _, s, _ in sim.log} == {stream}
    # end to end: an extension op with only a NumPy kernel inside a plan
    from support.extdemo_ops import scale_shift

    extensions.install(base)
    assert getattr(base.kernels[scale_shift.wire], "host_fallback", False)
    sim.log.clear()
    y = scale_shift(t * 2.0, scale=3.0, shift=1.0) + 1.0
    np.testing.assert_array_equal(y.numpy(), np.arange(6) * 6.0 + 2.0)
    assert {s for e, s, _ in sim.log if e != "record"} == {stream}


def test_other_streams_reuse_freed_blocks_only_after_their_work(sim, gpu):
    """A block freed on stream A returns to the pool for stream B only once an event on A
    has completed; under pressure the pool waits for A instead of handing it out early."""
    backend = gpu._rec.runtime.backend
    cp = sys.modules["cupy"]
    alloc = backend.allocator
    sim.lag = True
    a_stream, b_stream = backend.stream, backend.session().stream
    with a_stream:
        x = cp.zeros((1 << 16,), dtype=np.float32)
    with b_stream:
        del x  # freed while B is current: kernels on A may still read it
        assert alloc.pending() == 1
        cp.zeros((16,), dtype=np.float32)  # B allocates: records an event on A, keeps the block
        assert alloc.pending() == 1
    a_stream.synchronize()  # A has finished: the event is done
    with b_stream:
        cp.zeros((16,), dtype=np.float32)
    assert alloc.pending() == 0


def test_a_full_device_gets_the_retained_pages_back(sim, gpu):
    """Pages kept for replays are released when cudaMalloc runs out, and the request retried."""
    cp = sys.modules["cupy"]
    backend = gpu._rec.runtime.backend
    (gpu.tensor(np.ones((1 << 20,), np.float32)) * 2.0).numpy()  # a dry run: pages retained
    reserved = backend.memory.memory_stats().reserved
    assert reserved >= 4 << 20 and backend.memory.memory_stats().in_use < reserved
    sim.capacity = sim.device_bytes + (5 << 20)
    with backend.activate():
        big = cp.zeros((9 << 20) // 4, dtype=np.float32)  # needs the retained pages' room
    assert big.nbytes == 9 << 20 and backend.memory.memory_stats().reserved >= 9 << 20


def test_a_pool_installed_for_a_while_gives_the_device_back(sim, gpu):
    from burn_remote.engine.memory import (
        CupyPageAllocator,
        DeviceMemory,
        install_cupy_allocator,
        installed_allocator,
        uninstall_cupy_allocator,
    )

    backend = gpu._rec.runtime.backend
    other = DeviceMemory("cuda:0", CupyPageAllocator(0))
    install_cupy_allocator(other)
    assert installed_allocator().memories[0] is other
    uninstall_cupy_allocator(other)
    assert installed_allocator().memories[0] is backend.memory


def test_two_devices_keep_their_pools_and_streams_apart(sim, monkeypatch):
    sim.devices = 2
    cp = sys.modules["cupy"]
    zero, one = SimCupyBackend(0, cupy=cp), SimCupyBackend(1, cupy=cp)
    assert zero.stream.device == 0 and one.stream.device == 1
    assert one.session().stream.device == 1
    with one.activate():
        a = one.from_numpy(np.ones((4096,), np.float32))
    assert one.memory.memory_stats().in_use >= a.nbytes
    assert zero.memory.memory_stats().in_use == 0
    plan_dev = []
    dev1 = sim_device(one)
    sim.log.clear()
    (dev1.full((3,), 2.0) + 1.0).numpy()
    plan_dev = {d for e, _, d in sim.log if e == "alloc"}
    assert plan_dev == {1}, "a plan on cuda:1 made arrays on another device"


def test_bfloat16_runs_on_cuda(sim, gpu):
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    got = {}
    for dev in (gpu, Device.cpu()):
        t = dev.tensor(x, dtype="bfloat16")
        y = F.softmax(t * 2.0 + 1.0, axis=-1) @ dev.tensor(np.ones((6, 2)), dtype="bfloat16")
        u = dev.uniform((5,), key=3, dtype="bfloat16")
        got[dev.spec] = (y.numpy().astype(np.float32), u.numpy().astype(np.float32))
    np.testing.assert_allclose(got["cuda:0"][0], got["cpu"][0], rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(got["cuda:0"][1], got["cpu"][1])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool", "int32", "float16", "float32"])
def test_scatter_add_and_gather_gradient_on_cuda(sim, gpu, dtype):
    rng = np.random.default_rng(0)
    base = (rng.integers(0, 2, (3, 5)) if dtype == "bool" else rng.integers(0, 7, (3, 5))).astype(
        dtype
    )
    idx = np.array([[0, 1, 1, 4], [2, 2, 2, 0], [3, 0, 4, 4]])
    src = base[:, :4].copy()
    cpu = Device.cpu()
    got = F.scatter_add(gpu.tensor(base), gpu.tensor(idx), gpu.tensor(src), 1).numpy()
    cpu = Device.cpu()
    want = F.scatter_add(cpu.tensor(base), cpu.tensor(idx), cpu.tensor(src), 1).numpy()
    np.testing.assert_array_equal(got, want)


def test_gradients_of_indexing_and_pooling_on_cuda(sim, gpu, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    idx = rng.integers(0, 6, (2, 3, 6, 2))
    grads = {}
    for dev in (gpu, Device.cpu()):
        t = dev.tensor(x, requires_grad=True)
        pooled = F.max_pool2d(t, 2)
        picked = F.gather(t, dev.tensor(idx), -1)
        emb = F.embedding(dev.tensor(np.array([[1, 2], [2, 0]])), t.reshape(108, 2)[:4])
        (pooled.sum() + (picked * picked).sum() + emb.sum()).backward()
        grads[dev.spec] = t.grad.numpy()
    np.testing.assert_allclose(grads["cuda:0"], grads["cpu"], rtol=1e-5, atol=1e-5)


def test_kernels_that_cupy_would_refuse_are_caught(sim):
    """The simulator is strict where CuPy is: the defects it exists to catch fail here."""
    cp = sys.modules["cupy"]
    a = cp.zeros((2, 3), dtype=np.int8)
    with pytest.raises(NotOnCupy, match="sparse"):
        cp.indices((2, 3), sparse=True)
    with pytest.raises(NotOnCupy, match="int8"):
        sys.modules["cupyx"].scatter_add(a, (cp.arange(2),), cp.ones((2, 3), dtype=np.int8))
    with pytest.raises(NotOnCupy, match="initial"):
        a.max(axis=0, initial=0)  # NumPy's max has `initial`, CuPy's has not
    assert a.astype(np.float32, copy=False).dtype == np.float32
    with pytest.raises(TypeError, match="writeable"):
        cp.lib.stride_tricks.as_strided(a, shape=(2,), strides=(1,), writeable=False)
