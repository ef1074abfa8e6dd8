"""NumPy kernels of 2-D convolution and pooling (forward and backward), as strided window
views (im2col without copying) contracted with einsum; ``numpy_kernels`` registers them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...protocol.ops_nn import pool_params
from .array_module import Array
from .array_module import array_module as _mod
from .numpy_helpers import add_at, contig, open_grid

CONV_KERNELS: dict[str, Callable[..., Any]] = {}
"""Op name -> kernel, for ``numpy_kernels.KERNELS``."""
Pair = int | Sequence[int]
"""A convolution or pooling attribute given for both spatial axes at once, or per axis."""


def kernel(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Put the decorated function in ``CONV_KERNELS`` as op ``name``'s kernel."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        CONV_KERNELS[name] = fn
        return fn

    return register


def _pair(v: Pair) -> tuple[int, ...]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _windows(
    x: Array, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, oh: int, ow: int
) -> Array:
    """A strided view (N, C, OH, OW, KH, KW) over a padded input: im2col without copying."""
    n, c = x.shape[:2]
    s = x.strides
    m = _mod(x)
    writeable = {"writeable": False} if m is np else {}
    return m.lib.stride_tricks.as_strided(
        x,
        shape=(n, c, oh, ow, kh, kw),
        strides=(s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw),
        **writeable,
    )


def conv_geometry(
    x_shape: Sequence[int], w_shape: Sequence[int], stride: Pair, padding: Pair, dilation: Pair
) -> tuple[int, ...]:
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    kh, kw = w_shape[2:]
    oh = (x_shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (x_shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return sh, sw, ph, pw, dh, dw, kh, kw, oh, ow


@kernel("conv2d")
def _conv2d(x: Array, w: Array, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> Array:
    sh, sw, ph, pw, dh, dw, kh, kw, oh, ow = conv_geometry(
        x.shape, w.shape, stride, padding, dilation
    )
    dt = np.result_type(x, w)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    cols = _windows(contig(xp), kh, kw, sh, sw, dh, dw, oh, ow)
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // groups, o // groups
    cols = cols.reshape(n, groups, cg, oh, ow, kh, kw)
    wg = w.reshape(groups, og, cg, kh, kw)
    out = np.einsum("ngchwij,gocij->ngohw", cols, wg, optimize=True)
    return contig(out.reshape(n, o, oh, ow), dtype=dt)


@kernel("conv2d_grad_input")
def _conv2d_grad_input(
    g: Array,
    w: Array,
    input_shape: Sequence[int],
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> Array:
    sh, sw, ph, pw, dh, dw, kh, kw, oh, ow = conv_geometry(
        input_shape, w.shape, stride, padding, dilation
    )
    n, c, h, wd = input_shape
    o = w.shape[0]
    cg, og = c // groups, o // groups
    gg = g.reshape(n, groups, og, oh, ow)
    wg = w.reshape(groups, og, cg, kh, kw)
    # contribution of every (output position, kernel tap) to the padded input
    contrib = np.einsum("ngohw,gocij->ngchwij", gg, wg, optimize=True)
    dxp = _mod(g).zeros((n, groups, cg, h + 2 * ph, wd + 2 * pw), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            dxp[
                ...,
                i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                j * dw : j * dw + sw * (ow - 1) + 1 : sw,
            ] += contrib[..., i, j]
    dx = dxp[..., ph : ph + h, pw : pw + wd]
    return contig(dx.reshape(n, c, h, wd))


@kernel("conv2d_grad_weight")
def _conv2d_grad_weight(
    x: Array,
    g: Array,
    weight_shape: Sequence[int],
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> Array:
    sh, sw, ph, pw, dh, dw, kh, kw, oh, ow = conv_geometry(
        x.shape, weight_shape, stride, padding, dilation
    )
    n, c = x.shape[:2]
    o = weight_shape[0]
    cg, og = c // groups, o // groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    cols = _windows(contig(xp), kh, kw, sh, sw, dh, dw, oh, ow).reshape(
        n, groups, cg, oh, ow, kh, kw
    )
    gg = g.reshape(n, groups, og, oh, ow)
    dw_ = np.einsum("ngchwij,ngohw->gocij", cols, gg, optimize=True)
    return contig(dw_.reshape(weight_shape), dtype=g.dtype)


def _lowest(dtype: np.dtype[Any]) -> float:
    """The max-pool padding value: -inf, or the smallest value an integer dtype holds."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return False if dtype.kind == "b" else -np.inf


def _pool_setup(
    x: Array, attrs: Mapping[str, Any], fill: float
) -> tuple[Array, int, int, int, int, int, int, int, int]:
    (kh, kw), (sh, sw), (ph, pw) = pool_params(attrs)
    oh = (x.shape[2] + 2 * ph - kh) // sh + 1
    ow = (x.shape[3] + 2 * pw - kw) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill) if ph or pw else x
    return contig(xp), kh, kw, sh, sw, ph, pw, oh, ow


@kernel("max_pool2d")
def _max_pool2d(x: Array, **attrs: Pair | None) -> Array:
    xp, kh, kw, sh, sw, ph, pw, oh, ow = _pool_setup(x, attrs, _lowest(x.dtype))
    win = _windows(xp, kh, kw, sh, sw, 1, 1, oh, ow)
    return contig(win.max(axis=(4, 5)), dtype=x.dtype)


@kernel("max_pool2d_backward")
def _max_pool2d_backward(x: Array, g: Array, **attrs: Pair | None) -> Array:
    xp, kh, kw, sh, sw, ph, pw, oh, ow = _pool_setup(x, attrs, _lowest(x.dtype))
    win = _windows(xp, kh, kw, sh, sw, 1, 1, oh, ow)
    n, c = x.shape[:2]
    arg = win.reshape(n, c, oh, ow, kh * kw).argmax(axis=-1)
    ii, jj = np.divmod(arg, kw)
    rows = _mod(g).arange(oh)[:, None] * sh + ii
    cols = _mod(g).arange(ow)[None, :] * sw + jj
    dxp = _mod(g).zeros(xp.shape, dtype=g.dtype)
    nn_, cc = open_grid(_mod(g), (n, c))
    add_at(dxp, (nn_[..., None, None], cc[..., None, None], rows, cols), g)
    return contig(dxp[:, :, ph : ph + x.shape[2], pw : pw + x.shape[3]])


@kernel("avg_pool2d")
def _avg_pool2d(x: Array, **attrs: Pair | None) -> Array:
    xp, kh, kw, sh, sw, ph, pw, oh, ow = _pool_setup(x, attrs, 0)
    win = _windows(xp, kh, kw, sh, sw, 1, 1, oh, ow)
    return contig(win.mean(axis=(4, 5)), dtype=x.dtype)


@kernel("avg_pool2d_backward")
def _avg_pool2d_backward(g: Array, input_shape: Sequence[int], **attrs: Pair | None) -> Array:
    (kh, kw), (sh, sw), (ph, pw) = pool_params(attrs)
    n, c, h, w = input_shape
    oh, ow = g.shape[2:]
    dxp = _mod(g).zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=g.dtype)
    share = g / (kh * kw)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw] += share
    return contig(dxp[:, :, ph : ph + h, pw : pw + w])
