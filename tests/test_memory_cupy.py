"""CuPy device pages and the pool installed as CuPy's allocator (needs a CUDA GPU)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed (no CUDA stack here)")
pytestmark = pytest.mark.gpu

from burn_remote.engine.memory import (  # noqa: E402
    ALIGNMENT,
    CupyPageAllocator,
    DeviceMemory,
    install_cupy_allocator,
    uninstall_cupy_allocator,
)


@pytest.fixture
def memory():
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError as exc:
        pytest.skip(f"no usable CUDA device: {exc}")
    return DeviceMemory("cuda:0", CupyPageAllocator(0))


def test_views_and_alignment(memory):
    block = memory.alloc(4096)
    assert block.address % ALIGNMENT == 0
    view = block.view((1024,), np.float32)
    view[...] = 3.0
    assert float(view.sum()) == 3072.0
    memory.free(block)


def test_cupy_kernels_allocate_from_the_pool(memory):
    install_cupy_allocator(memory)
    try:
        a = cp.ones((1 << 20,), dtype=cp.float32)
        b = a * 2  # CuPy's own kernel output comes from our pool
        assert memory.memory_stats().in_use >= 2 * a.nbytes
        assert float(b.sum()) == 2.0 * (1 << 20)
        del a, b
        assert memory.memory_stats().in_use == 0
    finally:
        uninstall_cupy_allocator(memory)  # a CUDA backend's own pool stays installed
