"""The executor hook: a tiny plan run the way the executor runs one, checked for values,
ownership, arena use after the dry run, and no leaks."""

from dataclasses import dataclass

import numpy as np
from burn_remote.engine.memory import DeviceMemory, GraphMemory, HostPageAllocator


@dataclass
class FakePlan:
    """x -> a = x*2 -> b = a+1 -> c = b*b (output), plus a dead value d = a-1."""

    n_inputs: int = 1
    outputs: tuple = (3, 0)


def execute(gm, plan, x):
    run = gm.run(plan)
    slots = {0: x}
    slots[1] = run.place(1, slots[0] * 2)
    slots[4] = run.place(4, slots[1] - 1)  # dead: never read
    result = slots[1] + 1
    run.release(1)
    slots[2] = run.place(2, result)
    result = slots[2] * slots[2]
    run.release(2)
    slots[3] = run.place(3, result)
    return run.finish([slots[3], slots[0]])


def test_values_ownership_and_arena():
    mem = DeviceMemory("cpu", HostPageAllocator())
    gm = GraphMemory(mem, trace=True)
    plan = FakePlan()
    x = gm.adopt(np.arange(1000, dtype=np.float32))
    outs = []
    for _ in range(3):
        c, same = execute(gm, plan, x)
        assert same is x
        np.testing.assert_array_equal(c, (np.arange(1000, dtype=np.float32) * 2 + 1) ** 2)
        outs.append(c)
    arena = next(iter(mem.arenas.values()))
    assert arena.plan.size < 3 * 4096  # a, b and d planned, a and b may share
    arena.plan.verify()
    for c in outs:
        gm.forget(c)
    for _ in range(4):  # x was adopted once and returned three times
        gm.forget(x)
    stats = mem.memory_stats()
    assert stats.in_use == 0
    assert not gm._owned
    ids = {e.id for e in gm.trace if type(e).__name__ == "Alloc"}
    freed = {e.id for e in gm.trace if type(e).__name__ == "Free"}
    assert ids == freed
