"""The ``signal`` extension's ops: real FFTs and framing, with NumPy kernels and gradients.

Complex numbers are not a registry dtype, so a spectrum is a real tensor whose trailing axis
has size 2: ``[..., k, 0]`` is the real part of bin k and ``[..., k, 1]`` its imaginary
part (the layout of ``np.stack([z.real, z.imag], -1)``). The transforms act on the last
axis of a real signal. Each op's gradient is a backward op of this extension, so the whole
thing goes through ``Extension`` exactly as a user's op would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from burn_remote.protocol.registry import NOT_DIFFERENTIABLE, REQUIRED, ShapeError
from burn_remote.protocol.shapes import fmt

from .._extension import Extension

signal = Extension("signal", version="1", doc="Real FFTs, STFT framing, FFT convolution.")

Spec = tuple[tuple[int, ...], str]


def _float(op: str, x: Any) -> str:
    if x.dtype not in ("float32", "float64"):
        raise ShapeError(f"signal.{op}: expected a float32 or float64 tensor, got {x.dtype}")
    return x.dtype


def _complex(z: np.ndarray) -> np.ndarray:
    return z[..., 0] + 1j * z[..., 1]


def _real_pair(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1)


def _fit(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Truncate or zero-pad `x` along `axis` to `size`."""
    have = x.shape[axis]
    if have >= size:
        return np.take(x, np.arange(size), axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - have)
    return np.pad(x, pad)


# --- rfft ---------------------------------------------------------------------------------


def _rfft_infer(xs: Any, attrs: Any) -> list[Spec]:
    (x,) = xs
    if len(x.shape) < 1:
        raise ShapeError("signal.rfft: expected at least a 1-d signal")
    n = attrs["n"] if attrs["n"] is not None else x.shape[-1]
    if n < 1:
        raise ShapeError(f"signal.rfft: transform length {n} must be positive")
    return [((*x.shape[:-1], n // 2 + 1, 2), _float("rfft", x))]


def _rfft_backward_kernel(g: np.ndarray, length: int, n: int) -> np.ndarray:
    # y_k = sum_t x_t e^{-2 pi i k t / n}  =>  dx_t = Re(sum_k G_k e^{+2 pi i k t / n})
    full = np.zeros((*g.shape[:-2], n), dtype=np.complex128)
    full[..., : g.shape[-2]] = _complex(g)
    return _fit(np.real(np.fft.ifft(full, axis=-1)) * n, length, -1)


_rfft_backward = signal.op(
    "rfft_backward",
    arity=1,
    attrs={"length": REQUIRED, "n": REQUIRED},
    infer=lambda xs, a: [((*xs[0].shape[:-2], a["length"]), xs[0].dtype)],
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _rfft_backward_kernel},
    doc="Gradient of rfft for a signal of `length` samples transformed at length n.",
)


def _rfft_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    (x,) = xs
    n = attrs["n"] if attrs["n"] is not None else x.shape[-1]
    return (_rfft_backward(g, length=x.shape[-1], n=n),)


rfft = signal.op(
    "rfft",
    arity=1,
    attrs={"n": None},
    infer=_rfft_infer,
    grad=_rfft_grad,
    kernels={"cpu": lambda x, n: _real_pair(np.fft.rfft(x, n=n, axis=-1))},
    doc="Real FFT of the last axis (zero-padded or cut to n): (..., n // 2 + 1, 2) re/im.",
)

# --- irfft --------------------------------------------------------------------------------


def _irfft_infer(xs: Any, attrs: Any) -> list[Spec]:
    (z,) = xs
    if len(z.shape) < 2 or z.shape[-1] != 2:
        raise ShapeError(f"signal.irfft: expected a (..., k, 2) spectrum, got {fmt(z.shape)}")
    n = attrs["n"] if attrs["n"] is not None else 2 * (z.shape[-2] - 1)
    if n < 1:
        raise ShapeError(f"signal.irfft: output length {n} must be positive")
    return [((*z.shape[:-2], n), _float("irfft", z))]


def _irfft_backward_kernel(g: np.ndarray, bins: int, n: int) -> np.ndarray:
    # x_t = (1/n) sum_k c_k Re(Z_k e^{2 pi i k t / n}), c_k = 1 at DC and Nyquist, else 2;
    # the imaginary parts of DC (and Nyquist for even n) are ignored, so get no gradient.
    spec = np.fft.rfft(g, n=n, axis=-1)
    c = np.full(spec.shape[-1], 2.0 / n)
    c[0] = 1.0 / n
    if n % 2 == 0:
        c[-1] = 1.0 / n
    spec = spec * c
    spec.imag[..., 0] = 0.0
    if n % 2 == 0:
        spec.imag[..., -1] = 0.0
    return _fit(_real_pair(spec), bins, -2)


_irfft_backward = signal.op(
    "irfft_backward",
    arity=1,
    attrs={"bins": REQUIRED, "n": REQUIRED},
    infer=lambda xs, a: [((*xs[0].shape[:-1], a["bins"], 2), xs[0].dtype)],
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _irfft_backward_kernel},
    doc="Gradient of irfft for a spectrum of `bins` bins inverted at length n.",
)


def _irfft_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    (z,) = xs
    return (_irfft_backward(g, bins=z.shape[-2], n=out.shape[-1]),)


irfft = signal.op(
    "irfft",
    arity=1,
    attrs={"n": None},
    infer=_irfft_infer,
    grad=_irfft_grad,
    kernels={"cpu": lambda z, n: np.fft.irfft(_complex(z), n=n, axis=-1)},
    doc="Inverse of rfft: (..., k, 2) re/im -> (..., n), n = 2 (k - 1) unless given.",
)

# --- frame (the STFT's windowed frames) ---------------------------------------------------

WINDOWS = ("hann", "boxcar")


def window(name: str, size: int) -> np.ndarray:
    """Periodic windows, as ``scipy.signal.get_window`` gives them (float64)."""
    if name == "hann":
        return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(size) / size)
    if name == "boxcar":
        return np.ones(size)
    raise ValueError(f"signal: unknown window {name!r}; expected one of {WINDOWS}")


def _frame_infer(xs: Any, attrs: Any) -> list[Spec]:
    (x,) = xs
    size, hop = attrs["size"], attrs["hop"]
    if attrs["window"] not in WINDOWS:
        raise ShapeError(f"signal.frame: unknown window {attrs['window']!r}")
    if len(x.shape) < 1 or size < 1 or hop < 1 or x.shape[-1] < size:
        raise ShapeError(
            f"signal.frame: cannot cut frames of {size} every {hop} from {fmt(x.shape)}"
        )
    frames = 1 + (x.shape[-1] - size) // hop
    return [((*x.shape[:-1], frames, size), _float("frame", x))]


def _frame_kernel(x: np.ndarray, size: int, hop: int, window: str) -> np.ndarray:
    frames = 1 + (x.shape[-1] - size) // hop
    view = np.lib.stride_tricks.sliding_window_view(x, size, axis=-1)[..., ::hop, :]
    return view[..., :frames, :] * _window_like(window, size, x.dtype)


def _window_like(name: str, size: int, dtype: Any) -> np.ndarray:
    return window(name, size).astype(dtype)


def _frame_backward_kernel(
    g: np.ndarray, length: int, size: int, hop: int, window: str
) -> np.ndarray:
    weighted = g * _window_like(window, size, g.dtype)
    out = np.zeros((*g.shape[:-2], length), dtype=g.dtype)
    for f in range(g.shape[-2]):  # overlap-add; frames are few
        out[..., f * hop : f * hop + size] += weighted[..., f, :]
    return out


_frame_backward = signal.op(
    "frame_backward",
    arity=1,
    attrs={"length": REQUIRED, "size": REQUIRED, "hop": REQUIRED, "window": REQUIRED},
    infer=lambda xs, a: [((*xs[0].shape[:-2], a["length"]), xs[0].dtype)],
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _frame_backward_kernel},
    doc="Gradient of frame: overlap-add of windowed frame gradients.",
)

frame = signal.op(
    "frame",
    arity=1,
    attrs={"size": REQUIRED, "hop": REQUIRED, "window": "hann"},
    infer=_frame_infer,
    grad=lambda bld, g, xs, out, a: (_frame_backward(g, length=xs[0].shape[-1], **a),),
    kernels={"cpu": _frame_kernel},
    doc="Windowed frames of the last axis: (..., T) -> (..., 1 + (T - size) // hop, size).",
)
