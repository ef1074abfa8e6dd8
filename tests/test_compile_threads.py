"""br.compile beside other threads and mode switches: threads capture at once on devices of
their own, another thread's work on a capturing device is refused, and a step stays compiled
through eval()/train() between epochs."""

from __future__ import annotations

import re

import burn_remote as br
import numpy as np
from support.capture_models import MODELS, mlp, same_state, train

DEV = br.Device.cpu()


def test_evaluating_between_epochs_keeps_the_step_compiled():
    """A training loop that switches to eval() and back after every epoch: each switch drops
    the capture (the mode shapes the graph), and the step captures again. That used to count
    as the step being unstable, and the fifth epoch raised CaptureError."""
    model, step, batch = mlp(DEV)
    run = br.compile(step)
    for epoch in range(8):
        for i in range(4):
            run(*batch(4 * epoch + i))
        model.eval()
        model(batch(0)[0]).numpy()
        model.train()
    # each epoch records twice (the second recording confirms the first) and replays the
    # rest; the very first step records once more (it creates the gradients it then reuses)
    assert run.stats()["replays"] >= 8 * 2 - 1, run.stats()


def _while_capturing(work) -> None:
    """Run ``work()`` on another thread while this one records a compiled step on DEV (the
    step's body waits until ``work`` returns); the step must still give its result."""
    import threading

    started, release = threading.Event(), threading.Event()

    def worker():
        started.wait(10)
        try:
            work()
        finally:
            release.set()

    th = threading.Thread(target=worker)
    th.start()

    @br.compile
    def f(a):
        started.set()
        release.wait(10)  # the worker runs meanwhile
        return a + 1

    x = DEV.tensor(np.ones(3, np.float32))
    assert f(x).numpy().tolist() == [2, 2, 2]
    th.join(10)


def test_other_threads_record_on_other_devices_while_a_step_is_captured():
    from burn_remote._device import LocalRuntime

    other = br.Device("cpu-worker", LocalRuntime("cpu"))
    seen = []
    _while_capturing(lambda: seen.append((other.ones((3,)) * 2).numpy().tolist()))
    assert seen == [[2.0, 2.0, 2.0]]


def test_threads_capture_at_once_on_devices_of_their_own():
    """Two threads, each with its own device, capture and replay compiled training steps at
    the same time (their first recordings overlap, held open until both are inside): each
    ends bitwise where the same training ends alone. (Only the GPT draws dropout keys from
    the process-wide counter, so the interleaving of steps does not change its keys.)"""
    import threading

    from burn_remote._device import LocalRuntime

    kinds = sorted(MODELS)[:2]
    alone = [
        train(br.Device(f"cpu-alone-{k}", LocalRuntime("cpu")), MODELS[k], 6, True) for k in kinds
    ]
    inside = threading.Barrier(2, timeout=20)
    results: dict = {}

    # built here, one after the other: nn.seed and the weight generator are process-wide, so
    # two threads building at once would interleave their draws
    built = {k: MODELS[k](br.Device(f"cpu-thread-{k}", LocalRuntime("cpu"))) for k in kinds}

    def run(k: str) -> None:
        model, step, batch = built[k]

        def body(*args):
            if not results.get(("met", k)):
                results[("met", k)] = True
                inside.wait()  # both threads are recording now
            return step(*args)

        run = br.compile(body)
        for i in range(6):
            run(*batch(i))
        results[k] = {name: t.numpy() for name, t in model.named_tensors()}
        results[k]["__stats__"] = run.stats()

    threads = [threading.Thread(target=run, args=(k,)) for k in kinds]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for k, want in zip(kinds, alone):
        assert results[k]["__stats__"]["replays"] >= 3, results[k]["__stats__"]
        same_state(want, results[k])


def test_another_threads_work_on_a_capturing_device_is_refused():
    """While a thread records a step on a device, an op another thread puts on that device
    would silently join the step (and run on every replay): it is refused by name, and so is
    a second capture on the same device; the capture itself completes."""
    errors: list = []
    y = DEV.ones((3,))

    def work():
        for attempt in (lambda: y * 2, lambda: br.compile(lambda a: a * 3)(y)):
            try:
                attempt()
            except br.CaptureError as e:
                errors.append(str(e))

    _while_capturing(work)
    assert len(errors) == 2, errors
    assert re.search(r"another thread is capturing a step on \(compiled function \S*f ", errors[0])
    assert re.search(r"another thread is capturing a step on \(compiled function \S*f ", errors[1])
    assert (DEV.ones((3,)) * 2).numpy().tolist() == [2, 2, 2]  # the device is free again
