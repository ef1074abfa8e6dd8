"""burn_remote.signal: real FFTs, STFT and FFT convolution, built as an extension.

The ops belong to the ``signal`` extension (wire names ``signal.<op>@1``), announced in the
``burn_remote.extensions`` entry-point group, so servers with burn-remote installed run them.

**Complex layout.** There is no complex dtype: a spectrum is a real tensor with a trailing
axis of size 2 holding (real, imaginary). ``rfft(x)`` of shape (..., n) is (..., n // 2 + 1,
2); ``irfft`` takes that layout back. ``complex_mul`` multiplies two such tensors.

Gradients: rfft, irfft, frame (so stft), and conv1d through them.
"""

from __future__ import annotations

from .._ops import call as _call
from .._tensor import Tensor
from ._ops import WINDOWS, frame, irfft, rfft, signal, window

CONV_MODES = ("full", "same", "valid")


def complex_mul(a: Tensor, b: Tensor) -> Tensor:
    """(re, im) * (re, im) elementwise, with broadcasting over the leading axes."""
    ar, ai = a[..., 0], a[..., 1]
    br, bi = b[..., 0], b[..., 1]
    return _call("stack", ar * br - ai * bi, ar * bi + ai * br, axis=-1)


def stft(x: Tensor, n_fft: int, hop: int | None = None, window: str = "hann") -> Tensor:
    """Short-time Fourier transform of the last axis, without padding or scaling.

    Frames of `n_fft` samples every `hop` (default n_fft // 4), multiplied by a periodic
    window, then ``rfft``: the result is (..., frames, n_fft // 2 + 1, 2), frames =
    1 + (T - n_fft) // hop. (``scipy.signal.stft`` also pads the ends and scales by the
    window sum; divide by ``window(...).sum()`` to compare.)
    """
    hop = hop or max(n_fft // 4, 1)
    return rfft(frame(x, size=n_fft, hop=hop, window=window))


def conv1d(x: Tensor, w: Tensor, mode: str = "full") -> Tensor:
    """Linear convolution of the last axes by FFT, as ``scipy.signal.fftconvolve``.

    `x` is (..., N) and `w` (..., K), broadcasting over the leading axes. `mode` 'full'
    gives N + K - 1 samples, 'same' the centred N, 'valid' the N - K + 1 where the kernel
    fits entirely. This is a true convolution (the kernel is flipped), unlike the
    cross-correlation of ``functional.conv1d``.
    """
    if mode not in CONV_MODES:
        raise ValueError(f"signal.conv1d: mode {mode!r} is not one of {CONV_MODES}")
    n, k = x.shape[-1], w.shape[-1]
    length = n + k - 1
    y = irfft(complex_mul(rfft(x, n=length), rfft(w, n=length)), n=length)
    if mode == "full":
        return y
    if mode == "same":
        start = (k - 1) // 2
        return y[..., start : start + n]
    if n < k:
        raise ValueError(f"signal.conv1d: 'valid' needs N >= K, got N={n}, K={k}")
    return y[..., k - 1 : n]


__all__ = [
    "WINDOWS",
    "complex_mul",
    "conv1d",
    "frame",
    "irfft",
    "rfft",
    "signal",
    "stft",
    "window",
]
