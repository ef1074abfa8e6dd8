"""Functional forms of the registry's ops (what `nn` modules are built from).

Every op in the registry is reachable as `functional.<name>(*tensors, **attrs)`; the functions
written out here only add conveniences (optional bias, keys from ints, axis spelling).
"""

from __future__ import annotations

from typing import Any

from burn_remote.protocol.registry import OPS

from ._ops import call
from ._tensor import Tensor, matmul


def relu(x: Tensor) -> Tensor:
    """Elementwise max(x, 0)."""
    return call("relu", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit: exact (erf) by default, ``approximate="tanh"`` for GPT-2's form."""
    return call("gelu", x, approximate=approximate)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, with weight stored (out, in) as PyTorch and PEFT expect."""
    y = matmul(x, weight.transpose(-1, -2))
    return y + bias if bias is not None else y


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-d convolution of (N, C, H, W) by (out, C / groups, kh, kw), torch's arguments and layout."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    y = call(
        "conv2d",
        x,
        weight,
        stride=pair(stride),
        padding=pair(padding),
        dilation=pair(dilation),
        groups=groups,
    )
    return y + bias.reshape(1, -1, 1, 1) if bias is not None else y


def conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> Tensor:
    """1-d convolution of (N, C, L) by (out, C / groups, k), torch's arguments and layout."""
    y = call("conv1d", x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return y + bias.reshape(1, -1, 1) if bias is not None else y


def max_pool2d(x: Tensor, kernel: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """Maximum over ``kernel`` windows of (N, C, H, W) (stride defaults to the kernel)."""
    return call("max_pool2d", x, kernel=kernel, stride=stride, padding=padding)


def avg_pool2d(x: Tensor, kernel: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """Mean over ``kernel`` windows of (N, C, H, W) (stride defaults to the kernel)."""
    return call("avg_pool2d", x, kernel=kernel, stride=stride, padding=padding)


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Normalise over the trailing dimensions of ``weight`` (the last one without it), then scale
    and shift."""
    n_axes = weight.ndim if weight is not None else 1
    args = [x] + [t for t in (weight, bias) if t is not None]
    if weight is None and bias is not None:
        raise ValueError("layer_norm: a bias needs a weight")
    return call("layer_norm", *args, n_axes=n_axes, eps=eps)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Divide by the root mean square over the trailing dimensions (Llama's norm), then scale by
    ``weight``."""
    n_axes = weight.ndim if weight is not None else 1
    return call("rms_norm", *([x] if weight is None else [x, weight]), n_axes=n_axes, eps=eps)


def dropout(x: Tensor, p: float, key: int | Tensor, training: bool = True) -> Tensor:
    """Inverted dropout with an explicit key: the same key drops the same elements."""
    if not training or p == 0:
        return x
    return call("dropout", x, x._dev._key(key), p=p)


REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str, count: Any = None) -> Tensor:
    """`count`: the divisor of "mean" (the elements not ignored; never 0, so all-ignored
    gives 0 rather than NaN)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / (int(loss.size) if count is None else count.clamp(min=1))


def nll_loss(
    log_probs: Tensor, target: Tensor, reduction: str = "mean", ignore_index: int = -100
) -> Tensor:
    """-log_probs[..., target] reduced by `reduction`; targets equal to `ignore_index` count
    for nothing. The class axis is the last (as `cross_entropy` here); for (N, C) input that
    is torch's layout, and a torch-style (N, C, d...) input is refused, not misread."""
    if tuple(target.shape) != tuple(log_probs.shape[:-1]):
        raise ValueError(
            f"nll_loss: target shape {target.shape} must be the scores' shape without the "
            f"class axis, which is the last here: {log_probs.shape[:-1]}"
        )
    flat, tflat = log_probs.reshape(-1, log_probs.shape[-1]), target.reshape(-1)
    keep = tflat != ignore_index
    safe = where(keep, tflat, 0)
    picked = gather(flat, safe.unsqueeze(1), 1).squeeze(1)
    loss = where(keep, -picked, 0.0)
    count = keep.cast(loss.dtype).sum()
    return _reduce(loss.reshape(target.shape), reduction, count)


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """Mean negative log-likelihood over the targets that are not ignore_index, class axis
    last; `reduction` "sum" or "none" as torch's."""
    if reduction == "mean":
        return call(
            "cross_entropy",
            logits,
            target,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        )
    logp = log_softmax(logits, -1)
    loss = nll_loss(logp, target, "none", ignore_index)
    if label_smoothing:
        smooth = where(target != ignore_index, -logp.mean(axis=-1), 0.0)
        loss = loss * (1 - label_smoothing) + smooth * label_smoothing
    return _reduce(loss, reduction)


def mse_loss(x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error (``reduction`` ``mean``, ``sum`` or ``none``)."""
    if reduction == "mean":
        return call("mse_loss", x, y)
    return _reduce((x - y) * (x - y), reduction)


def l1_loss(x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error (``reduction`` ``mean``, ``sum`` or ``none``)."""
    return _reduce((x - y).abs(), reduction)


def where(cond: Tensor, x: Any, y: Any) -> Tensor:
    """``x`` where ``cond`` is true, else ``y`` (scalars are promoted as NumPy does)."""
    from ._ops import operand

    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else cond
    return call("where", cond, operand(x, like), operand(y, like))


def cat(tensors: list[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Tensors joined along an existing ``axis`` (torch's ``dim``)."""
    return call("cat", *tensors, axis=axis if dim is None else dim)


def stack(tensors: list[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Tensors joined along a new ``axis`` (torch's ``dim``)."""
    return call("stack", *tensors, axis=axis if dim is None else dim)


def split(x: Tensor, sizes: int | list[int], axis: int = 0) -> tuple[Tensor, ...]:
    """Pieces of ``x`` along ``axis``: of ``sizes`` each, or of the listed sizes."""
    return call("split", x, sizes=sizes if isinstance(sizes, int) else tuple(sizes), axis=axis)


def pad(x: Tensor, pads: Any, value: float = 0.0) -> Tensor:
    """``x`` padded with ``value``: ``pads`` holds (before, after) per dimension."""
    return call("pad", x, pads=tuple(tuple(p) for p in pads), value=value)


def gather(x: Tensor, index: Tensor, axis: int) -> Tensor:
    """Values of ``x`` picked along ``axis`` at ``index`` (torch.gather)."""
    return call("gather", x, index, axis=axis)


def index_select(x: Tensor, index: Tensor, axis: int = 0) -> Tensor:
    """Slices of ``x`` along ``axis`` at the positions in ``index``."""
    return call("index_select", x, index, axis=axis)


def scatter_add(x: Tensor, index: Tensor, src: Tensor, axis: int) -> Tensor:
    """``x`` with ``src`` added at ``index`` along ``axis``; repeated indices accumulate."""
    return call("scatter_add", x, index, src, axis=axis)


def one_hot(index: Tensor, num_classes: int, dtype: str = "float32") -> Tensor:
    """Index tensor to a one-hot tensor of ``num_classes`` in its last dimension."""
    return call("one_hot", index, num_classes=num_classes, dtype=dtype)


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` at ``ids`` (a lookup table; the gradient accumulates per row)."""
    return call("embedding", weight, ids)


def softmax(x: Tensor, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """Softmax along ``axis`` (or torch's ``dim``)."""
    return call("softmax", x, axis=axis if dim is None else dim)


def log_softmax(x: Tensor, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """log(softmax(x)) along ``axis``, computed without underflow."""
    return call("log_softmax", x, axis=axis if dim is None else dim)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``x.flatten(start_dim, end_dim)`` as a function."""
    return x.flatten(start_dim, end_dim)


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch's batch_norm over (N, C, ...): batch statistics while training (the running
    ones are updated in place, with the unbiased variance), running statistics otherwise."""
    from ._autograd import no_grad

    if (running_mean is None) != (running_var is None):
        given, missing = ("running_mean", "running_var")[:: 1 if running_var is None else -1]
        raise ValueError(f"batch_norm: {given} given without {missing}: pass both or neither")
    axes = (0, *range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if training or running_mean is None or running_var is None:
        mean = x.mean(axes, keepdims=True)
        var = x.var(axes, keepdims=True, correction=0)
        if training and running_mean is not None and running_var is not None:
            n = x.size // x.shape[1]
            with no_grad():
                m = mean.detach().reshape(x.shape[1])
                v = var.detach().reshape(x.shape[1]) * (n / max(n - 1, 1))
                running_mean._assign(running_mean * (1 - momentum) + m * momentum)
                running_var._assign(running_var * (1 - momentum) + v * momentum)
    else:
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
    y = (x - mean) * (var + eps).rsqrt()
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def __getattr__(name: str) -> Any:
    """Any other registry op, called as functional.<name>(*tensors, **attrs)."""
    if name in OPS:
        return lambda *xs, **attrs: call(name, *xs, **attrs)
    raise AttributeError(f"module 'burn_remote.functional' has no attribute {name!r}")
