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
    model = build_model(spec, dev, ctx.resolve, ctx.work)
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
        step_body = _step_body(spec["clip"], spec.get("grad_accum", 1))

        @br.compile  # recorded once, then replayed: no per-step op recording on the server
        def train_step(x: Any, y: Any) -> Any:
            return step_body(model, opt, x, y)

        ctx.started(start)
        for step in range(start, steps):
            ctx.check()
            _seed_step(spec["seed"], step)  # dropout keys: the compiled step draws from here
            x, y = data.sample(rng, spec["batch_size"] * spec.get("grad_accum", 1))
            loss = train_step(dev.tensor(x), dev.tensor(y))
            _report(ctx, step, loss, _writer(opt, step + 1, rng))
    out = ctx.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    if spec["kind"] == "lora_finetune":
        # the base's name as the client knows it (a directory AutoPeftModel can load); an
        # artifact digest would mean nothing outside this server
        model.save_adapter(out)
        if spec.get("merge"):
            _save_merged(model, out)
        return {p.name: p for p in sorted(out.iterdir())}
    model.eval()
    path = out / "model.safetensors"
    if isinstance(model, nn.GPT):
        model.save_gpt2(path)
    else:
        model.save(path)
    return {path.name: path}


MERGED_PREFIX = "merged-"
"""Outputs of the merged model (`merge = true`) are named merged-<file>, beside the adapter's
own files: strip the prefix to get a directory transformers loads."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _save_merged(model: Any, out: Path) -> None:
    """The adapter folded into the base (merge_and_unload), saved as transformers loads it,
    with the base's tokenizer files."""
    import shutil
    import tempfile

    model.merge_and_unload()
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        model.save_pretrained(tmp)
        for name in _TOKENIZER_FILES:
            if (model.base_dir / name).is_file():
                shutil.copyfile(model.base_dir / name, Path(tmp) / name)
        for path in sorted(Path(tmp).iterdir()):
            shutil.move(str(path), out / f"{MERGED_PREFIX}{path.name}")


def _step_body(clip: float | None, accum: int = 1) -> Any:
    """One training step, the same on one device and on every data-parallel replica. With
    `accum` > 1 the batch is `accum` micro-batches, each's loss / accum backpropagated in turn
    (one graph: a micro-batch's activations are dead once its backward is recorded)."""

    def step(model: Any, opt: Any, x: Any, y: Any) -> Any:
        if accum > 1:
            micro = x.shape[0] // accum

            def micro_loss(k: int) -> Any:  # backpropagated here; its value, detached
                part = loss_on(
                    model, x[k * micro : (k + 1) * micro], y[k * micro : (k + 1) * micro]
                )
                (part * (1.0 / accum)).backward()
                return part.detach()

            total = micro_loss(0)
            for k in range(1, accum):
                total = total + micro_loss(k)
            loss = total * (1.0 / accum)
        else:
            loss = loss_on(model, x, y)
            loss.backward()  # data-parallel: the gradients come back averaged over replicas
        if clip is not None:
            optim.clip_grad_norm(model, clip)
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _report(ctx: Any, step: int, loss: Any, write: Any) -> None:
    """Progress after `step`, and a checkpoint every `checkpoint_every` steps (`loss`: a
    tensor, or None for a step whose loss was lost with a server)."""
    spec = ctx.spec
    value = None if loss is None else float(loss.item())
    if value is not None and not np.isfinite(value):
        raise FloatingPointError(f"loss became {value} at step {step + 1}")
    ctx.progress(step + 1, value)
    done = step + 1
    if done % spec["checkpoint_every"] == 0 and done < spec["steps"]:
        ctx.save_checkpoint(done, write)


def _train_data_parallel(
    ctx: Any, model: Any, opt: Any, data: Any, rng: np.random.Generator, start: int
) -> None:
    """The same steps on the servers of `devices`, each on its share of every batch; the
    model ends on this server's device again (for the outputs), the checkpoint is one copy.
    A server lost mid-way is dropped and the survivors redo the failed step (``_parallel``),
    unless the spec says ``require_all_devices``."""
    from .._peers import dial_targets
    from ._parallel import Replicas, close_devices, connect_devices

    spec = ctx.spec
    owner = ctx.job.get("owner") or ""
    require_all = bool(spec.get("require_all_devices", False))

    def candidates(peer: str) -> Iterator[str]:
        return dial_targets(ctx.service.state, peer, requester=owner, key_path=ctx.key_path)

    targets = spec["devices"]
    # a fresh job needs every server (a typo'd or stopped one shows at once); a resumed one
    # goes on with those it can still reach, as it would after losing them mid-way
    unreachable: list[tuple[int, str]] | None = (
        None if require_all or ctx.checkpoint is None else []
    )
    devices = connect_devices(targets, ctx.key_path, candidates, unreachable)
    gone = {k for k, _ in unreachable or ()}
    replicas = Replicas(targets, devices, [k for k in range(len(targets)) if k not in gone])
    for k, why in unreachable or ():
        ctx.log(f"devices[{k}] ({targets[k][:16]}...) dropped: cannot reach it: {why}")
    ctx.log(f"data-parallel on {len(devices)} servers")
    try:
        dp = br.DataParallel(model, opt, devices=devices)
        train_step = dp.compile(_step_body(spec["clip"]))
        ctx.started(start)
        # job step -> the batch generator's state before that step's batch was drawn
        rng_before = {start: rng.bit_generator.state}
        step = start
        while step < spec["steps"]:
            ctx.check()
            rng.bit_generator.state = rng_before[step]
            _seed_step(spec["seed"], step)
            x, y = data.sample(rng, spec["batch_size"] * spec.get("grad_accum", 1))
            rng_before = {step: rng_before[step], step + 1: rng.bit_generator.state}
            try:
                loss = train_step(x, y)
                dp.sync()  # every replica ran it (a lost server shows here, named)
                _report(ctx, step, loss, _writer(opt, step + 1, rng))  # reads rank 0
            except Exception as exc:
                if require_all:
                    replicas.refuse_loss(dp, exc)
                resume, lines = replicas.survive(dp, exc)
                resume += start
                for line in lines:
                    ctx.log(line)
                ctx.log(
                    f"continuing on {len(replicas.devices)} server(s) from step {resume} "
                    "(the last state every survivor holds)"
                )
                if resume not in rng_before:
                    raise RuntimeError(
                        f"the survivors hold the state of step {resume}, not one of "
                        f"{sorted(rng_before)}"
                    ) from exc
                if resume == step + 1:  # they had finished this step: only its loss is lost
                    _report(ctx, step, None, _writer(opt, resume, rng))
                step = resume
                continue
            step += 1
        dp.close()
        model.to(ctx.device)  # rank 0's copy: the outputs are written from here
    finally:
        close_devices(replicas.devices)


def _writer(opt: Any, step: int, rng: np.random.Generator) -> Any:
    """Writes the checkpoint of the state after ``step`` steps (``rng``: as it is then)."""
    return lambda path: save_checkpoint(path, opt, step, rng)


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
        noise = np.random.default_rng(spec["seed"]).standard_normal(example.shape)
        example = np.asarray(noise, np.float32)
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
