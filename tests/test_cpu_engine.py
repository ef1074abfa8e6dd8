"""The CPU engine at real size: chunked multi-threaded Adam, in-place optimizer updates of
donated inputs, weight gradients as one GEMM, one thread setting.

Oracles: the update as the engine computed it before (restated here in NumPy), and the same
graph run by the plain executor (no plan rewrite, no in-place writes). Where the order of
operations is unchanged the bits must be equal; where a rewrite changes the order of a sum
(weight gradients as one GEMM) the difference is bounded by 1e-6 of the result's norm.
"""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import Device, nn, optim
from burn_remote import functional as F
from burn_remote.engine.backends import cpu_threads
from burn_remote.engine.backends import numpy_optim_kernels as optim_kernels
from burn_remote.engine.backends.numpy_backend import NumpyBackend
from burn_remote.engine.backends.numpy_kernels import WRITES_INTO
from burn_remote.engine.executor import Executor, compile_graph
from burn_remote.protocol.graph import Graph, GraphNode

HYPER = dict(beta1=0.9, beta2=0.999, eps=1e-8)


def _adam_before(p, g, m, v, lr, bc1, bc2, weight_decay, decoupled):
    """The NumPy update as the engine wrote it before this work (new arrays, whole arrays)."""
    lr, bc1, bc2 = float(lr), float(bc1), float(bc2)
    b1, b2, eps = HYPER["beta1"], HYPER["beta2"], HYPER["eps"]
    g = np.ascontiguousarray(g)
    if weight_decay and not decoupled:
        g = g + weight_decay * p
    m2 = m * b1
    tmp = g * (1 - b1)
    m2 += tmp
    v2 = v * b2
    np.multiply(g, g, out=tmp)
    tmp *= 1 - b2
    v2 += tmp
    np.divide(v2, bc2, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m2, tmp, out=tmp)
    tmp *= lr / bc1
    p2 = p * (1 - lr * weight_decay) if weight_decay and decoupled else p.copy()
    p2 -= tmp
    return p2, m2, v2


@pytest.mark.parametrize("size", [5, optim_kernels.ADAM_CHUNK * 3 + 17, (700, 301)])
@pytest.mark.parametrize("weight_decay,decoupled", [(0.0, True), (0.01, True), (0.01, False)])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_update_is_bit_equal_to_the_unchunked_update(
    size, weight_decay, decoupled, in_place, dtype, monkeypatch
) -> None:
    monkeypatch.setattr(cpu_threads, "PARALLEL_MIN_WORK", 0)  # chunks on the pool too
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(size).astype(dtype) for _ in range(3))
    v = np.abs(rng.standard_normal(size)).astype(dtype)
    if isinstance(size, tuple):
        g = np.asfortranarray(g)  # a transposed weight gradient
    scalars = [np.asarray(x, dtype) for x in (1e-3, 0.1, 0.002)]
    want = _adam_before(p, g, m, v, *scalars, weight_decay, decoupled)
    args = (*scalars, *HYPER.values(), weight_decay, decoupled)
    if in_place:
        p, m, v = p.copy(), m.copy(), v.copy()
        got = optim_kernels._adam_update(p, g, m, v, *args, out=(p, m, v))
        assert got[0] is p and got[1] is m and got[2] is v
    else:
        got = optim_kernels._adam_update(p, g, m, v, *args)
    for name, a, b in zip(("p", "m", "v"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b), name


def _mlp_run(writes_in_place: bool, steps: int = 4, hold: int | None = None):  # noqa: C901
    """Train the digits-sized MLP a few steps; returns (weights, losses, the first weight's
    array ids per step, the held array and its copy)."""
    dev = Device.cpu()
    backend = dev._rec.runtime.backend
    nn.seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    rng = np.random.default_rng(1)
    x = dev.tensor(rng.random((6, 8), dtype=np.float32))
    y = dev.tensor(rng.integers(0, 3, 6))
    store = dev._rec.runtime.store
    ids, losses, held = [], [], None
    if not writes_in_place:
        backend.writes_into = {}  # this instance only: kernels make new arrays
    try:
        dev._rec.runtime.executor._plans.clear()  # compiled again under this setting
        for i in range(steps):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
            w = model[0].weight
            ids.append(id(store[w._id]))
            if i == hold:
                held = (w.numpy(), w.numpy().copy())
        return [p.numpy().copy() for p in model.parameters()], losses, ids, held
    finally:
        backend.__dict__.pop("writes_into", None)
        dev._rec.runtime.executor._plans.clear()


def test_the_optimizer_updates_donated_parameters_in_place_with_the_same_bits() -> None:
    base_w, base_loss, base_ids, _ = _mlp_run(writes_in_place=False)
    w, losses, ids, _ = _mlp_run(writes_in_place=True)
    assert losses == base_loss
    for a, b in zip(w, base_w):
        assert np.array_equal(a, b)
    assert len(set(ids[1:])) == 1  # the same array, written step after step
    assert len(set(base_ids)) > 1  # without in-place writes: a new array every step


def test_an_array_a_caller_still_holds_is_never_written_in_place() -> None:
    _, _, _, (held, copy) = _mlp_run(writes_in_place=True, steps=4, hold=1)
    assert np.array_equal(held, copy)  # the step after reading it made a new array instead


def _gpt_step_graph(batch: int):
    """A tiny GPT's whole training step (forward, backward, AdamW) as one captured graph, and
    the inputs it ran on."""
    dev = Device.cpu()
    nn.seed(3)
    cfg = nn.GPTConfig(n_layer=2, n_head=2, d_model=32, vocab=50, context=16, dropout=0.0)
    model = nn.GPT(cfg, device=dev)
    opt = optim.AdamW(model, lr=1e-3)
    seq = np.random.default_rng(4).integers(0, cfg.vocab, (batch, cfg.context + 1))
    x, y = dev.tensor(seq[:, :-1]), dev.tensor(seq[:, 1:])
    runtime = dev._rec.runtime
    seen = {}
    real = runtime.execute

    def spy(capture) -> None:
        seen["capture"] = capture
        seen["inputs"] = [np.array(runtime.store[i], copy=True) for i in capture.input_ids]
        real(capture)

    runtime.execute = spy
    try:
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
    finally:
        runtime.execute = real
    return seen["capture"], seen["inputs"]


class _PlainCpu(NumpyBackend):
    """The CPU backend as it ran before: no plan rewrite, no in-place writes."""

    writes_into = {}

    def optimize_plan(self, plan):
        return plan


def test_weight_gradients_as_one_gemm_agree_with_the_unrewritten_plan() -> None:
    capture, inputs = _gpt_step_graph(batch=3)
    plain = compile_graph(capture.graph, _PlainCpu())
    fast = compile_graph(capture.graph, NumpyBackend())
    ops = [s.op for s in fast.steps]
    assert len(ops) < len(plain.steps)  # the chains were merged
    assert ops.count("sum") < [s.op for s in plain.steps].count("sum")
    want = Executor(_PlainCpu()).run(plain, [a.copy() for a in inputs], capture.values)
    got = Executor(NumpyBackend()).run(fast, [a.copy() for a in inputs], capture.values)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind == "f":
            # The merged GEMM sums in another order (float32 rounding, ~1e-7 relative per
            # gradient), and Adam's first step divides each gradient by its own size, so a
            # bias whose gradient is near Adam's eps carries that rounding into its update:
            # 4e-6 relative measured (NumPy 2.x's OpenBLAS); a wrong merge is off by O(1).
            scale = max(float(np.linalg.norm(b.astype(np.float64))), 1e-30)
            assert float(np.linalg.norm((a - b).astype(np.float64))) <= 2e-5 * scale
        else:
            assert np.array_equal(a, b)


class _InPlaceCpu(_PlainCpu):
    """No plan rewrite, but in-place writes: the same operations in the same order."""

    writes_into = WRITES_INTO


def test_in_place_writes_keep_every_bit_of_a_gpt_training_step() -> None:
    capture, inputs = _gpt_step_graph(batch=2)
    plain = compile_graph(capture.graph, _PlainCpu())
    in_place = compile_graph(capture.graph, _InPlaceCpu())
    assert sum(bool(s.write_into) for s in in_place.steps) > 50
    want = Executor(_PlainCpu()).run(plain, [a.copy() for a in inputs], capture.values)
    donated = list(range(len(inputs)))  # every input given up: parameters and moments too
    got = Executor(_InPlaceCpu()).run(in_place, [a.copy() for a in inputs], capture.values, donated)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_an_intermediate_a_live_view_still_reads_is_not_overwritten() -> None:
    # y = x * x; z = reshape(y) is a graph output (a view of y); w = y + x, y's last use:
    # writing w into y would change z
    f32 = "float32"
    graph = Graph(
        inputs=(((2, 3), f32),),
        nodes=(
            GraphNode("mul", (0, 0), (), (((2, 3), f32),)),
            GraphNode("reshape", (1,), (("shape", (3, 2)),), (((3, 2), f32),)),
            GraphNode("add", (1, 0), (), (((2, 3), f32),)),
        ),
        outputs=(2, 3),
    )
    plan = compile_graph(graph, NumpyBackend())
    assert [s.write_into for s in plan.steps if s.op == "add"] == [(1, 0)]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    z, w = Executor(NumpyBackend()).run(plan, [x.copy()], [])
    np.testing.assert_array_equal(z, (x * x).reshape(3, 2))
    np.testing.assert_array_equal(w, x * x + x)


@pytest.mark.parametrize("n", [16, 1 << 19])  # kept with the plan / made by each run
def test_constants_are_never_overwritten_across_runs(n) -> None:
    from burn_remote.engine.executor import CONSTANT_CACHE_BYTES, FreshConstant

    f32 = "float32"
    graph = Graph(
        inputs=(((n,), f32),),
        nodes=(
            GraphNode("full", (), (("shape", (n,)), ("value", 1.5), ("dtype", f32)), (((n,), f32),)),
            GraphNode("add", (1, 0), (), (((n,), f32),)),
        ),
        outputs=(2,),
    )  # fmt: skip
    plan = compile_graph(graph, NumpyBackend())
    fresh = n * 4 > CONSTANT_CACHE_BYTES
    assert (type(plan.constants[0][1]) is FreshConstant) == fresh
    x = np.arange(n, dtype=np.float32)
    ex = Executor(NumpyBackend())
    first = ex.run(plan, [x.copy()], [])[0]
    second = ex.run(plan, [x.copy()], [])[0]
    np.testing.assert_array_equal(first, x + 1.5)
    np.testing.assert_array_equal(second, x + 1.5)
    assert first is not second


def test_zeros_of_full_keep_the_sign_of_negative_zero() -> None:
    from burn_remote.engine.backends.numpy_kernels import KERNELS

    assert np.signbit(KERNELS["full"]((3,), -0.0, "float32")).all()
    assert not np.signbit(KERNELS["full"]((3,), 0.0, "float32")).any()


def test_a_batch_of_rows_times_a_matrix_is_one_gemm_with_numpys_result() -> None:
    from burn_remote.engine.backends.numpy_kernels import KERNELS

    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 7, 11)).astype(np.float32)
    b = rng.standard_normal((11, 5)).astype(np.float32)
    got = KERNELS["matmul"](a, b)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == (3, 7, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    strided = a[:, ::2]  # not C-contiguous: NumPy's own batched path
    np.testing.assert_allclose(KERNELS["matmul"](strided, b), np.matmul(strided, b), rtol=1e-6)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((600, 1000), (1000,)), ((1, 1000), (600, 1000)), ((600, 1), (600, 1000)),
     ((3, 200, 500), (200, 500)), ((), (600, 1000)), ((600, 1000), (600, 1000))],
)  # fmt: skip
def test_large_elementwise_ops_split_over_threads_give_numpys_bits(a_shape, b_shape) -> None:
    from burn_remote.engine.backends.numpy_kernels import KERNELS

    before = cpu_threads.threads()
    cpu_threads.set_threads(2)
    try:
        rng = np.random.default_rng(6)
        a = rng.random(a_shape).astype(np.float32)
        b = rng.random(b_shape).astype(np.float32)
        for op, ufunc in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply)):
            got, want = KERNELS[op](a, b), ufunc(a, b)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert np.array_equal(got, want), op
        if a.shape == np.broadcast_shapes(a_shape, b_shape):
            into = a.copy()
            assert KERNELS["mul"](into, b, out=(into,)) is into
            assert np.array_equal(into, a * b)
    finally:
        cpu_threads.set_threads(before)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # log(0), sin(inf): in pool threads too
@pytest.mark.parametrize("shape", [(600, 1000), (3, 300, 400), (1, 600, 1000)])
def test_transcendental_ops_split_by_rows_keep_the_bits_of_one_call(shape) -> None:
    from burn_remote.engine.backends.numpy_kernels import KERNELS, THREADED_ROWS

    x = (np.random.default_rng(7).standard_normal(shape) * 5).astype(np.float32)
    x.reshape(-1)[:4] = (np.inf, -np.inf, np.nan, -0.0)
    positive = np.abs(x)
    before = cpu_threads.threads()
    try:
        got = {}
        for n in (1, 2):  # one thread: every kernel runs whole, as one call
            cpu_threads.set_threads(n)
            for op in THREADED_ROWS:
                args = positive if op == "log" else x
                attrs = {"axis": -1} if "softmax" in op else {}
                with np.errstate(all="ignore"):
                    got[op, n] = KERNELS[op](args, **attrs)
                    if "softmax" in op:
                        got[op + "@0", n] = KERNELS[op](args, axis=0)  # across rows: whole
        for key in {k for k, _ in got}:
            a, b = got[key, 2], got[key, 1]
            assert a.shape == b.shape == shape and a.dtype == b.dtype == np.float32, key
            assert np.array_equal(a, b, equal_nan=True), key
        with np.errstate(all="ignore"):
            assert np.array_equal(got["exp", 2], np.exp(x), equal_nan=True)
            assert np.array_equal(got["tanh", 2], np.tanh(x), equal_nan=True)
    finally:
        cpu_threads.set_threads(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6,), (600, 1000), (2, 3, 7)])
def test_sigmoid_keeps_the_bits_of_its_two_branch_formula(dtype, shape) -> None:
    """The in-place sigmoid (numerator max(e, x >= 0), no np.where) against the formula it
    replaced, 1 / (1 + e) where x >= 0 else e / (1 + e) with e = exp(-|x|), bit for bit;
    a 0-d input takes the formula itself."""
    from burn_remote.engine.backends.numpy_kernels import KERNELS

    x = (np.random.default_rng(3).standard_normal(shape) * 40).astype(dtype)
    x.reshape(-1)[:5] = (np.inf, -np.inf, np.nan, -0.0, 0.0)
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        want = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(dtype)
        for got, expected in ((KERNELS["sigmoid"](x), want),
                              (KERNELS["sigmoid"](np.asarray(x.flat[-1])), want.flat[-1])):  # fmt: skip
            assert got.dtype == dtype
            assert np.array_equal(got, expected, equal_nan=True)


def test_run_parallel_runs_the_first_part_on_the_caller_and_waits_for_every_part() -> None:
    """The caller computes a share itself (one hand-off fewer); a part that fails still lets
    every other part finish before the error reaches the caller (their arrays are then
    freed); work under PARALLEL_MIN_WORK never leaves the calling thread."""
    import threading
    import time

    before = cpu_threads.threads()
    try:
        cpu_threads.set_threads(2)
        ran: dict[int, str] = {}

        def part(k: int) -> None:
            if k == 1:
                time.sleep(0.05)
            ran[k] = threading.current_thread().name
            if k == 0:
                raise ValueError("part 0 failed")

        with pytest.raises(ValueError, match="part 0 failed"):
            cpu_threads.run_parallel(part, [0, 1], work=cpu_threads.PARALLEL_MIN_WORK)
        assert ran[0] == threading.current_thread().name
        assert ran[1] != ran[0] and 1 in ran  # the pool's part finished before the raise
        names: list[str] = []
        cpu_threads.run_parallel(
            lambda k: names.append(threading.current_thread().name),
            [0, 1],
            work=cpu_threads.PARALLEL_MIN_WORK - 1,
        )
        assert names == [threading.current_thread().name] * 2
    finally:
        cpu_threads.set_threads(before)


def test_the_thread_setting_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(cpu_threads.THREADS_ENV, "3")
    assert cpu_threads.default_threads() == 3
    for bad in ("zero", "0", "-2"):
        monkeypatch.setenv(cpu_threads.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=cpu_threads.THREADS_ENV):
            cpu_threads.default_threads()


def test_set_threads_limits_blas_and_the_pool() -> None:
    from threadpoolctl import threadpool_info

    before = cpu_threads.threads()
    try:
        cpu_threads.set_threads(1)
        blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
        assert blas and all(i["num_threads"] == 1 for i in blas)
        seen = []
        cpu_threads.run_parallel(seen.append, [1, 2, 3], work=1 << 30)
        assert sorted(seen) == [1, 2, 3]
        with pytest.raises(ValueError, match="at least 1"):
            cpu_threads.set_threads(0)
    finally:
        cpu_threads.set_threads(before)


def _mlp_logits_minus_numpy(out: list) -> None:
    """One forward and backward of a 1024-32-10 MLP on Device.cpu(); appends how far its
    logits are from NumPy's product run on the same thread (0.0: the same bits)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2048, 1024), np.float32)
    y = rng.integers(0, 10, 2048)
    dev = Device.cpu()
    nn.seed(0)
    model = nn.Sequential(nn.Linear(1024, 32), nn.ReLU(), nn.Linear(32, 10)).to(dev)
    logits = model(dev.tensor(x))
    F.cross_entropy(logits, dev.tensor(y)).backward()
    w1, b1, w2, b2 = (p.numpy() for p in model.parameters())
    want = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    out.append(float(np.abs(logits.numpy() - want).max()))


def test_a_step_gives_the_same_bits_on_any_thread() -> None:
    """A server runs steps on worker threads, a user's script on its main thread: the same
    graph must give the same bits on both. It did not while small products switched BLAS to
    one thread around the call (threadpoolctl honours that only from the first thread that
    set BLAS's count), and 32 x 10 products differ in their last bit between 1 and 2 threads
    on OpenBLAS."""
    import threading

    before = cpu_threads.threads()
    cpu_threads.set_threads(2)
    try:
        gaps: list = []
        _mlp_logits_minus_numpy(gaps)
        worker = threading.Thread(target=_mlp_logits_minus_numpy, args=(gaps,))
        worker.start()
        worker.join()
        assert gaps == [0.0, 0.0]
    finally:
        cpu_threads.set_threads(before)


def test_set_threads_takes_effect_from_any_thread() -> None:
    """threadpoolctl ignores a BLAS limit set from a thread other than the first one that set
    it, silently; the engine's setting is the process's and must hold from any thread."""
    import threading

    from threadpoolctl import threadpool_info

    before = cpu_threads.threads()
    other = 1 if before > 1 else 2
    seen: list = []

    def set_and_read() -> None:
        cpu_threads.set_threads(other)
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    try:
        cpu_threads.set_threads(before + 1)  # this thread sets BLAS's count first
        worker = threading.Thread(target=set_and_read)
        worker.start()
        worker.join()
        assert seen and all(n == other for n in seen)
    finally:
        cpu_threads.set_threads(before)


def _loss_graph(rows: int, classes: int, *, ndim: int = 2, **attrs):
    """loss = cross_entropy(logits, target); its backward seeded by an input gradient, both
    results graph outputs: the plan's two steps over the same logits."""
    f32, i64 = "float32", "int64"
    lead = (rows,) if ndim == 2 else (2, rows // 2)
    attrs = tuple(sorted({"ignore_index": -100, "label_smoothing": 0.0, **attrs}.items()))
    return Graph(
        inputs=(((*lead, classes), f32), (lead, i64), ((), f32)),
        nodes=(
            GraphNode("cross_entropy", (0, 1), attrs, (((), f32),)),
            GraphNode("cross_entropy_backward", (2, 0, 1), attrs, (((*lead, classes), f32),)),
        ),
        outputs=(3, 4),
    )


@pytest.mark.parametrize("rows,block_rows", [(1, 1), (37, 4), (64, 64), (256, 5)])
@pytest.mark.parametrize("g", [1.0, 0.37])
def test_the_fused_cross_entropy_keeps_the_bits_of_its_two_kernels(
    rows, block_rows, g, monkeypatch
) -> None:
    from burn_remote.engine.backends import numpy_plan

    classes = 1000
    monkeypatch.setattr(cpu_threads, "PARALLEL_MIN_WORK", 0)  # blocks on the pool too
    monkeypatch.setattr(numpy_plan, "CE_BLOCK_BYTES", block_rows * classes * 4)
    graph = _loss_graph(rows, classes)
    fused = compile_graph(graph, NumpyBackend())
    plain = compile_graph(graph, _PlainCpu())
    assert [s.op for s in fused.steps] == ["cross_entropy"]  # one step, both results
    assert [s.op for s in plain.steps] == ["cross_entropy", "cross_entropy_backward"]
    rng = np.random.default_rng(rows)
    logits = (rng.standard_normal((rows, classes)) * 4).astype(np.float32)
    inputs = [logits, rng.integers(0, classes, rows), np.asarray(g, np.float32)]
    loss, grad = Executor(NumpyBackend()).run(fused, inputs, [])
    want_loss, want_grad = Executor(_PlainCpu()).run(plain, inputs, [])
    assert loss.dtype == want_loss.dtype and loss.shape == ()
    assert np.array_equal(loss, want_loss) and np.array_equal(grad, want_grad)
    # and the oracle: the mean negative log-likelihood, and g (softmax - onehot) / rows
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    nll = -np.log(p[np.arange(rows), inputs[1]])
    np.testing.assert_allclose(loss, nll.mean(), rtol=1e-5)
    p[np.arange(rows), inputs[1]] -= 1
    np.testing.assert_allclose(grad, g * p / rows, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("case", ["an ignored row", "label smoothing", "a batch axis"])
def test_cross_entropy_outside_the_common_case_runs_both_kernels_as_written(case) -> None:
    rows, classes = 12, 7
    attrs = {"label_smoothing": 0.1} if case == "label smoothing" else {}
    graph = _loss_graph(rows, classes, ndim=3 if case == "a batch axis" else 2, **attrs)
    fused = compile_graph(graph, NumpyBackend())
    assert [s.op for s in fused.steps] == ["cross_entropy"]
    rng = np.random.default_rng(5)
    shape = graph.inputs[0][0]
    target = rng.integers(0, classes, shape[:-1])
    if case == "an ignored row":
        target.reshape(-1)[3] = -100
    inputs = [rng.standard_normal(shape).astype(np.float32), target, np.asarray(1, np.float32)]
    got = Executor(NumpyBackend()).run(fused, inputs, [])
    want = Executor(_PlainCpu()).run(compile_graph(graph, _PlainCpu()), inputs, [])
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_backward_whose_gradient_comes_after_the_forward_is_not_fused() -> None:
    # the incoming gradient is made by a step after the forward: the fused step could not
    # run at the forward's place, so the two kernels stay apart
    f32, i64 = "float32", "int64"
    attrs = (("ignore_index", -100), ("label_smoothing", 0.0))
    graph = Graph(
        inputs=(((4, 5), f32), ((4,), i64)),
        nodes=(
            GraphNode("cross_entropy", (0, 1), attrs, (((), f32),)),
            GraphNode("mul", (2, 2), (), (((), f32),)),
            GraphNode("cross_entropy_backward", (3, 0, 1), attrs, (((4, 5), f32),)),
        ),
        outputs=(4,),
    )
    ops = [s.op for s in compile_graph(graph, NumpyBackend()).steps]
    assert ops == ["cross_entropy", "mul", "cross_entropy_backward"]


def test_a_loss_computed_twice_fuses_its_backward_once() -> None:
    # two forwards over the same logits (a loss printed and also backpropagated) and one
    # backward: the backward's result must be made by one step only
    f32, i64 = "float32", "int64"
    attrs = (("ignore_index", -100), ("label_smoothing", 0.0))
    graph = Graph(
        inputs=(((6, 5), f32), ((6,), i64), ((), f32)),
        nodes=(
            GraphNode("cross_entropy", (0, 1), attrs, (((), f32),)),
            GraphNode("cross_entropy", (0, 1), attrs, (((), f32),)),
            GraphNode("cross_entropy_backward", (2, 0, 1), attrs, (((6, 5), f32),)),
        ),
        outputs=(3, 4, 5),
    )
    fused = compile_graph(graph, NumpyBackend())
    assert [len(s.outputs) for s in fused.steps] == [2, 1]  # the first forward took it
    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 5, 6)]
    inputs.append(np.asarray(1, np.float32))
    got = Executor(NumpyBackend()).run(fused, inputs, [])
    want = Executor(_PlainCpu()).run(compile_graph(graph, _PlainCpu()), inputs, [])
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_gpt_step_runs_its_loss_as_one_fused_step() -> None:
    capture, _ = _gpt_step_graph(batch=2)
    ops = [s.op for s in compile_graph(capture.graph, NumpyBackend()).steps]
    assert ops.count("cross_entropy") == 1 and "cross_entropy_backward" not in ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.bool_])
@pytest.mark.parametrize("shape", [(7,), (64, 10), (3, 5, 7), (2, 128, 576)])
def test_the_sum_kernel_gives_numpys_sum_in_the_input_dtype(dtype, shape) -> None:
    """float32/64 take ``ndarray.sum`` (no np.sum wrapper); every dtype keeps np.sum's bits
    with the accumulator the op declares (the input's float, int64 for ints and bools)."""
    import itertools

    from burn_remote.engine.backends.numpy_kernels import KERNELS

    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    acc = np.int64 if np.dtype(dtype).kind in "biu" else dtype
    axes = [None, *((a,) for a in range(len(shape))), *itertools.combinations(range(len(shape)), 2)]
    for ax in axes:
        for keepdims in (False, True):
            got = KERNELS["sum"](x, ax, keepdims)
            want = np.asarray(np.sum(x, axis=ax, keepdims=keepdims, dtype=acc))
            assert type(got) is np.ndarray and got.dtype == want.dtype, (ax, keepdims)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (ax, keepdims)
