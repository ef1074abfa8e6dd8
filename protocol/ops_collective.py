"""Collective ops: a tensor combined across the ranks of a device group.

``all_reduce`` is an op like any other, so a step that averages gradients across replicas is
one graph: hashed, cached and replayed (``br.compile``) on every rank. The group is an
attribute (its id, fixed for the group's life), so every step of a group hashes the same;
which rank a device is, and how the bytes move (a ring over the servers' QUIC links, NCCL
between GPUs, a rendezvous in memory for local replicas), is the executing side's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import dtypes
from .registry import REQUIRED, Builder, Handle, Shaped, ShapeError, Spec, declare

REDUCE_OPS = ("sum", "mean")
"""What ``all_reduce`` may combine with."""

SUM_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int32", "int64"})
"""Dtypes ``all_reduce`` sums; ``mean`` takes the floating ones only (an integer mean would
round, and torch refuses it too)."""


def _all_reduce_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    refused: `op not in ("sum", "mean") or type(group) is not int or not 0 < group < 2**64 or
    x.dtype not in ("float16", "bfloat16", "float32", "float64", "int32", "int64") or op ==
    "mean" and not is_float(x.dtype)`
    outputs: `x.shape, x.dtype`"""
    (x,) = xs
    op, group = attrs["op"], attrs["group"]
    if op not in REDUCE_OPS:
        raise ShapeError(f"all_reduce: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    if not isinstance(group, int) or isinstance(group, bool) or not 0 < group < 2**64:
        raise ShapeError(f"all_reduce: group must be a group id (a u64 > 0), got {group!r}")
    if x.dtype not in SUM_DTYPES:
        raise ShapeError(f"all_reduce: cannot reduce {x.dtype} tensors")
    if op == "mean" and not dtypes.is_float(x.dtype):
        raise ShapeError(f"all_reduce: op='mean' needs a floating-point tensor, got {x.dtype}")
    return [(x.shape, x.dtype)]


def _all_reduce_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> tuple[Handle]:
    # out_r = reduce_k x_k on every rank r, so d loss / d x_k = reduce_r g_r: the same
    # collective over the incoming gradients (every rank differentiates the same graph).
    return (b.op("all_reduce", g, group=attrs["group"], op=attrs["op"]),)


declare(
    "all_reduce",
    "collective",
    1,
    attrs={"group": REQUIRED, "op": "sum"},
    infer=_all_reduce_infer,
    grad=_all_reduce_grad,
    doc=(
        "Every rank of device group `group` (an id set up with GroupSetup) contributes its "
        "tensor; each gets the elementwise sum (op='sum') or sum / ranks (op='mean'), "
        "bit-identical on every rank. Ranks must issue the same all_reduce calls (shape, "
        "dtype, op) in the same order; a mismatch, a dead or a late rank fails the graph on "
        "every rank with error GROUP. Not exportable to ONNX."
    ),
)
