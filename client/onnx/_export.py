"""`export`: trace a model's inference graph and write it as an ONNX model.

The model runs once (three times with a dynamic batch) on its device without executing:
the recorder holds the ops instead of flushing them, so export costs recording time only,
and the graph is exactly the primitives the engine would run. Weights become initializers,
named after their module parameters; LoRA adapters are merged first through a duck-typed
hook, so the exported model is a plain dense network.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .._device import Device
from .._tensor import Tensor
from ._emit import ONNX_DTYPES, Emitter, Op
from ._lowering import LOWERINGS, NOT_EXPORTABLE
from ._trace import Axes, Dyn, ExportError, Trace, parts, trace

MIN_OPSET = 18
MAX_INLINE_BYTES = 2**31
"""Protobuf cannot hold more than 2 GiB: above this, weights go to an external data file."""


def _examples(example: Any) -> list[Any]:
    items = list(example) if isinstance(example, list | tuple) else [example]
    if not items:
        raise ExportError("export needs at least one example input")
    return items


def _device_of(model: Any, examples: Sequence[Any]) -> Device:
    named = getattr(model, "named_tensors", None)
    if callable(named):
        for _, t in named():
            return t.device
    for x in examples:
        if isinstance(x, Tensor):
            return x.device
    return Device.cpu()


_LORA_HOOKS = (("merge_lora", "unmerge_lora"),)


def _lora_hook(obj: Any) -> tuple[str, Callable[[], Any], Any] | None:
    """(name, merge, unmerge or None) of the first merge hook `obj` has."""
    for merge_name, unmerge_name in _LORA_HOOKS:
        merge = getattr(obj, merge_name, None)
        if callable(merge):
            unmerge = getattr(obj, unmerge_name, None)
            return merge_name, merge, unmerge if callable(unmerge) else None
    return None


@contextlib.contextmanager
def _inference_form(model: Any) -> Iterator[Callable[..., Any]]:
    """Eval mode and LoRA merged for the trace; the model is given back as it was.

    The model's `merge_lora()` is used when it has one (every `nn.Module` does: it merges
    the adapters of `burn_remote.lora`), else that of each submodule that has one. A merge
    that returns a new module (a merged copy) has that copy traced; one that merges in place
    is undone with `unmerge_lora()` afterwards (lacking one, the model stays merged and a
    warning says so). Only these names count: a generic `merge()` may mean anything.
    """
    named = getattr(model, "named_modules", None)
    modules = [m for _, m in named()] if callable(named) else []
    modes = [(m, m.training) for m in modules]
    for m in modules:
        m.training = False
    undo: list[Callable[[], Any]] = []
    try:
        root = _lora_hook(model)
        targets = [model] if root is not None else modules[1:]
        for target in targets:
            hook = _lora_hook(target)
            if hook is None:
                continue
            name, merge, unmerge = hook
            merged = merge()
            if target is model and merged is not None and merged is not model:
                model = merged
                for _, m in getattr(model, "named_modules", lambda: ())():
                    m.training = False
            elif unmerge is not None:
                undo.append(unmerge)
            else:
                warnings.warn(
                    f"export: {name}() merged in place and has no un-merge; the model stays merged",
                    stacklevel=4,
                )
        yield model
    finally:
        for unmerge in reversed(undo):
            unmerge()
        for m, mode in modes:
            m.training = mode


def _weight_names(model: Any, tr: Trace) -> dict[int, str]:
    by_id: dict[int, str] = {}
    named = getattr(model, "named_tensors", None)
    if callable(named):
        for name, t in named():
            by_id.setdefault(t._id, name)
    return {rel: by_id.get(tid, f"weight_{rel}") for rel, tid in tr.weight_tensors.items()}


def _value_info(name: str, spec: tuple[tuple[Any, ...], str]) -> onnx.ValueInfoProto:
    """Dims that are exactly one dynamic axis, or a plain sum of them, carry its name
    (`Dyn.label`); other moving dims none."""
    shape = [d.label if isinstance(d, Dyn) else d for d in spec[0]]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[spec[1]], shape)


def _axes(
    dynamic_axes: Any, dynamic_batch: bool, names: Sequence[str], arrays: Sequence[np.ndarray]
) -> Axes | None:
    """Per input, axis -> name: from `dynamic_axes` (keyed by input name or position; a
    list of axes names them "<input>_dim<k>"), else axis 0 "batch" when `dynamic_batch`."""
    if dynamic_axes is None:
        return Axes(tuple({0: "batch"} for _ in arrays)) if dynamic_batch else None
    unknown = [k for k in dynamic_axes if k not in names and k not in range(len(names))]
    if unknown:
        raise ExportError(f"dynamic_axes: no model input {unknown[0]!r}; inputs are {list(names)}")
    per_input = []
    for i, (name, a) in enumerate(zip(names, arrays)):
        given = dynamic_axes.get(name, dynamic_axes.get(i, {}))
        if not isinstance(given, dict):
            given = {int(k): f"{name}_dim{int(k)}" for k in given}
        axes = {}
        for k, v in given.items():
            if not -a.ndim <= int(k) < a.ndim:
                raise ExportError(f"dynamic_axes: input {name!r} has no axis {k} (shape {a.shape})")
            axes[int(k) % a.ndim] = str(v)
        per_input.append(axes)
    return Axes(tuple(per_input)) if any(per_input) else None


def _lower(
    tr: Trace, input_names: Sequence[str], output_names: Sequence[str], weights: dict[int, str]
) -> onnx.GraphProto:
    sources: dict[str, tuple[str, int]] = {}
    if tr.axes is not None:
        for name, axes in zip(input_names, tr.axes.per_input):
            for axis, symbol in axes.items():
                if len(parts(symbol)) == 1:  # a sum's size is computed from its parts
                    sources.setdefault(symbol, (name, axis))
    e = Emitter(sources)
    names: dict[int, str] = {}
    for rel, name in zip(tr.model_inputs, input_names):
        e.reserve(name)
        names[rel] = name
    for name in output_names:
        e.reserve(name)
    for rel, arr in tr.weights.items():
        names[rel] = e.initializer(weights[rel], arr)
    for index, node in enumerate(tr.nodes):
        lower = LOWERINGS.get(node.op)
        if lower is None:
            reason = NOT_EXPORTABLE.get(node.op, "no ONNX lowering is registered")
            raise ExportError(f"node {index} ({node.op}) cannot be exported: {reason}")
        op = Op(
            node.op,
            [names[i] for i in node.inputs],
            [tr.specs[i] for i in node.inputs],
            list(node.specs),
            node.attrs,
            node.value,
        )
        try:
            outs = lower(e, op)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise ExportError(f"node {index} ({node.op}): {exc}") from None
        names.update(zip(node.outputs, outs))
    for rel, name in zip(tr.outputs, output_names):
        e.node("Identity", [names[rel]], out=name)
    return helper.make_graph(
        e.nodes,
        "burn_remote",
        [_value_info(n, tr.specs[r]) for r, n in zip(tr.model_inputs, input_names)],
        [_value_info(n, tr.specs[r]) for r, n in zip(tr.outputs, output_names)],
        initializer=e.initializers,
    )


def _default_names(given: Sequence[str] | None, n: int, stem: str, what: str) -> list[str]:
    if given is None:
        return [stem] if n == 1 else [f"{stem}_{i}" for i in range(n)]
    if len(given) != n or len(set(given)) != n:
        raise ExportError(f"{what}: expected {n} distinct names, got {list(given)}")
    return list(given)


def to_onnx(
    model_or_fn: Callable[..., Any],
    example: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool = True,
    dynamic_axes: dict[Any, Any] | None = None,
    opset: int = MIN_OPSET,
) -> onnx.ModelProto:
    """Trace `model_or_fn(*example)` and return the ONNX model (in memory, unchecked).

    Args:
        model_or_fn: an `nn.Module` or any function of tensors returning a tensor or a tuple.
        example: one input (Tensor or array-like) or a tuple of them.
        dynamic_batch: without `dynamic_axes`, give axis 0 of every input the size "batch".
        dynamic_axes: as torch.onnx.export's: input name (or position) -> {axis: name}, e.g.
            `{"ids": {0: "batch", 1: "sequence"}}`; axes of one name share one size. The
            outputs' dims that follow an axis carry its name.
        opset: the ONNX opset (18 or later: reductions take axes as inputs).

    Raises:
        ExportError: an op has no lowering, or the graph depends on a dynamic axis in a way
            ONNX shapes cannot express (then export with fewer dynamic axes).
    """
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: the lowering needs {MIN_OPSET} or later")
    examples = _examples(example)
    dev = _device_of(model_or_fn, examples)
    arrays = [np.asarray(x.numpy() if isinstance(x, Tensor) else x) for x in examples]
    arrays = [a.astype(np.float32) if a.dtype == np.float64 else a for a in arrays]
    ins = _default_names(input_names, len(arrays), "input", "input_names")
    axes = _axes(dynamic_axes, dynamic_batch, ins, arrays)
    with _inference_form(model_or_fn) as fn:
        tr = trace(fn, dev, arrays, axes)
        weights = _weight_names(fn, tr)
    outs = _default_names(output_names, len(tr.outputs), "output", "output_names")
    if set(ins) & set(outs) or set(ins + outs) & set(weights.values()):
        raise ExportError("input, output and weight names must all differ")
    graph = _lower(tr, ins, outs, weights)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="burn-remote")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def save(model: onnx.ModelProto, path: str | os.PathLike, max_inline_bytes: int) -> None:
    """Write `model`; past `max_inline_bytes` of weights, into `<path>.data` beside it."""
    path = Path(path)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if weight_bytes < max_inline_bytes:
        onnx.save_model(model, str(path))
        return
    location = path.name + ".data"
    (path.parent / location).unlink(missing_ok=True)  # the writer appends to an existing file
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
    )


def export(
    model_or_fn: Callable[..., Any],
    example: Any,
    path: str | os.PathLike,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool = True,
    dynamic_axes: dict[Any, Any] | None = None,
    opset: int = MIN_OPSET,
    max_inline_bytes: int = MAX_INLINE_BYTES,
) -> Path:
    """Export a model's inference graph to an ONNX file and check it; returns the path.

    Arguments as `to_onnx`; `max_inline_bytes` is where weights move to external data (the
    protobuf limit by default). The written file passes `onnx.checker.check_model(...,
    full_check=True)`, which also runs strict shape inference over the whole graph.
    """
    model = to_onnx(
        model_or_fn,
        example,
        input_names=input_names,
        output_names=output_names,
        dynamic_batch=dynamic_batch,
        dynamic_axes=dynamic_axes,
        opset=opset,
    )
    save(model, path, max_inline_bytes)
    onnx.checker.check_model(str(path), full_check=True)
    return Path(path)
