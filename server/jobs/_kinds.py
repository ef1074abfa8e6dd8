"""What each job kind does, given a :class:`JobContext` (see ``_service``).

Training kinds (``lora_finetune``, ``train``) are reproducible from the spec's seed: the model
is initialised under ``nn.seed(seed)``, batches come from a generator seeded with it, and each
step's dropout keys derive from (seed, step). A checkpoint saves the trainable parameters, the
optimizer state, the step and the generator state, so a job resumed after a crash computes the
same steps on the same numbers as an uninterrupted run and ends with the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import burn_remote as br
import numpy as np
from burn_remote import nn, optim

from ._checkpoint import load_checkpoint, save_checkpoint
from ._models import Dataset, attach_adapter, build_model, lora_config, loss_on, make_optimizer


def _seed_step(seed: int, step: int) -> None:
    """Dropout keys of step ``step`` depend only on (seed, step), not on what ran before."""
    nn.seed((seed * 1_000_003 + step + 1) & 0xFFFF_FFFF)


def run_training(ctx: Any) -> dict[str, Path]:
    """lora_finetune and train: returns the files to store as the job's outputs."""
    spec, dev = ctx.spec, ctx.device
    nn.seed(spec["seed"])
    model = build_model(spec, dev, ctx.resolve)
    if spec["kind"] == "lora_finetune":
        model.apply_lora(lora_config(spec))
    model.train()
    opt = make_optimizer(model, spec)
    data = Dataset(spec, ctx.resolve(spec["data"]["path"], "data.path"), model)
    rng = np.random.default_rng(spec["seed"])
    start = 0
    if ctx.checkpoint is not None:
        start = load_checkpoint(ctx.checkpoint, opt, rng)
        ctx.log(f"resumed from the checkpoint at step {start}")
    steps = spec["steps"]
    if spec.get("devices"):
        _train_data_parallel(ctx, model, opt, data, rng, start)
    else:
        step_body = _step_body(spec["clip"])

        @br.compile  # recorded once, then replayed: no per-step op recording on the server
        def train_step(x: Any, y: Any) -> Any:
            return step_body(model, opt, x, y)

        ctx.started(start)
        for step in range(start, steps):
            ctx.check()
            _seed_step(spec["seed"], step)  # dropout keys: the compiled step draws from here
            x, y = data.sample(rng, spec["batch_size"])
            loss = train_step(dev.tensor(x), dev.tensor(y))
            _report(ctx, step, loss, lambda path, n=step + 1: save_checkpoint(path, opt, n, rng))
    out = ctx.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    if spec["kind"] == "lora_finetune":
        # the base's name as the client knows it (a directory AutoPeftModel can load); an
        # artifact digest would mean nothing outside this server
        model.save_adapter(out)
        return {p.name: p for p in sorted(out.iterdir())}
    model.eval()
    path = out / "model.safetensors"
    if isinstance(model, nn.GPT):
        model.save_gpt2(path)
    else:
        model.save(path)
    return {path.name: path}


def _step_body(clip: float | None) -> Any:
    """One training step, the same on one device and on every data-parallel replica."""

    def step(model: Any, opt: Any, x: Any, y: Any) -> Any:
        loss = loss_on(model, x, y)
        loss.backward()  # data-parallel: the gradients come back averaged over the replicas
        if clip is not None:
            optim.clip_grad_norm(model, clip)
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _report(ctx: Any, step: int, loss: Any, write: Any) -> None:
    """Progress after `step`, and a checkpoint every `checkpoint_every` steps."""
    spec = ctx.spec
    value = float(loss.item())
    if not np.isfinite(value):
        raise FloatingPointError(f"loss became {value} at step {step + 1}")
    ctx.progress(step + 1, value)
    done = step + 1
    if done % spec["checkpoint_every"] == 0 and done < spec["steps"]:
        ctx.save_checkpoint(done, write)


def _train_data_parallel(
    ctx: Any, model: Any, opt: Any, data: Any, rng: np.random.Generator, start: int
) -> None:
    """The same steps on the servers of `devices`, each on its share of every batch; the
    model ends on this server's device again (for the outputs), the checkpoint is one copy."""
    from .._peers import dial_targets
    from ._parallel import close_devices, connect_devices

    spec = ctx.spec
    owner = ctx.job.get("owner") or ""

    def candidates(peer: str) -> Iterator[str]:
        return dial_targets(ctx.service.state, peer, requester=owner, key_path=ctx.key_path)

    devices = connect_devices(spec["devices"], ctx.key_path, candidates)
    ctx.log(f"data-parallel on {len(devices)} servers")
    try:
        dp = br.DataParallel(model, opt, devices=devices)

        train_step = dp.compile(_step_body(spec["clip"]))
        ctx.started(start)
        for step in range(start, spec["steps"]):
            ctx.check()
            _seed_step(spec["seed"], step)
            x, y = data.sample(rng, spec["batch_size"])
            loss = train_step(x, y)
            _report(ctx, step, loss, lambda path, n=step + 1: save_checkpoint(path, opt, n, rng))
        dp.close()
        model.to(ctx.device)  # rank 0's copy: the outputs are written from here
    finally:
        close_devices(devices)


def run_export(ctx: Any) -> dict[str, Path]:
    """onnx_export: the model (with its adapter merged) traced on an example of the given
    shape; the spec's `dynamic_axes` (default: axis 0, "batch") may follow at run time."""
    from burn_remote.onnx import export

    spec, dev = ctx.spec, ctx.device
    nn.seed(spec["seed"])
    model = build_model(spec, dev, ctx.resolve)
    attach_adapter(model, spec, ctx.resolve, ctx.work)
    model.eval()
    ctx.started(0)
    dtype = spec["example_dtype"] or ("int64" if isinstance(model, nn.GPT) else "float32")
    example = np.zeros(spec["example_shape"], dtype=dtype)
    if dtype == "float32":
        example = np.random.default_rng(spec["seed"]).standard_normal(example.shape)
        example = example.astype(np.float32)
    out = ctx.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    kwargs: dict = {"opset": spec["opset"]} if spec["opset"] else {}
    if spec["dynamic_axes"]:
        kwargs["dynamic_axes"] = {0: {int(k): v for k, v in spec["dynamic_axes"].items()}}
    export(model, example, out / "model.onnx", **kwargs)
    ctx.progress(1, None)
    return {p.name: p for p in sorted(out.iterdir())}


KINDS = {"lora_finetune": run_training, "train": run_training, "onnx_export": run_export}

__all__ = ["KINDS", "run_export", "run_training"]
