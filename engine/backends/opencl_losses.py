"""Loss kernels for OpenCL, composed from the backend's own device kernels.

No host round trip: every step is one of the generated kernels, so this is as fast as the
graph the loss used to be decomposed into, while the CPU gets a single fused NumPy kernel.
"""

from __future__ import annotations

from typing import Any


def loss_kernels(k: dict[str, Any]) -> dict[str, Any]:
    """`cross_entropy` and its backward over the kernel table `k` of one OpenCL backend."""

    def const(value: float | int, dtype: str) -> Any:
        return k["full"](shape=(), value=value, dtype=dtype)

    def parts(logits: Any, target: Any, ignore_index: int) -> tuple[Any, Any, Any, Any]:
        logp = k["log_softmax"](logits, axis=-1)
        if target.name != "int64":
            target = k["cast"](target, dtype="int64")
        valid = k["ne"](target, const(ignore_index, "int64"))
        safe = k["where"](valid, target, const(0, "int64"))
        validf = k["cast"](valid, dtype=logits.name)
        count = k["maximum"](k["sum"](validf, axes=None, keepdims=False), const(1, logits.name))
        return logp, safe, validf, count

    def cross_entropy(logits: Any, target: Any, ignore_index: int, label_smoothing: float) -> Any:
        logp, safe, validf, count = parts(logits, target, ignore_index)
        index = k["reshape"](safe, shape=(*safe.shape, 1))
        nll = k["neg"](k["reshape"](k["gather"](logp, index, axis=-1), shape=safe.shape))
        if label_smoothing:
            width = logits.shape[-1]
            mean = k["mul"](
                k["sum"](logp, axes=(-1,), keepdims=False), const(1.0 / width, logits.name)
            )
            nll = k["sub"](
                k["mul"](nll, const(1 - label_smoothing, logits.name)),
                k["mul"](mean, const(label_smoothing, logits.name)),
            )
        total = k["sum"](k["mul"](nll, validf), axes=None, keepdims=False)
        return k["div"](total, count)

    def cross_entropy_backward(
        g: Any, logits: Any, target: Any, ignore_index: int, label_smoothing: float
    ) -> Any:
        logp, safe, validf, count = parts(logits, target, ignore_index)
        width = logits.shape[-1]
        hot = k["one_hot"](safe, num_classes=width, dtype=logits.name)
        grad = k["sub"](k["exp"](logp), k["mul"](hot, const(1 - label_smoothing, logits.name)))
        if label_smoothing:
            grad = k["sub"](grad, const(label_smoothing / width, logits.name))
        scale = k["mul"](validf, k["div"](g, count))
        return k["mul"](grad, k["reshape"](scale, shape=(*safe.shape, 1)))

    return {"cross_entropy": cross_entropy, "cross_entropy_backward": cross_entropy_backward}
