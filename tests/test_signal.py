"""burn_remote.signal against NumPy/SciPy, and its gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal
from burn_remote import Device, RecordError
from burn_remote import signal as sg
from support.gradcheck import check_grad

RNG = np.random.default_rng(11)


@pytest.fixture
def cpu():
    return Device.cpu()


def _pair(z):
    return np.stack([z.real, z.imag], axis=-1)


def test_rfft_layout_and_round_trip(cpu):
    x = RNG.standard_normal((2, 10)).astype(np.float32)
    spec = sg.rfft(cpu.tensor(x))
    assert spec.shape == (2, 6, 2) and spec.dtype == "float32"
    np.testing.assert_allclose(spec.numpy(), _pair(np.fft.rfft(x)), rtol=1e-5, atol=1e-5)
    for n in (7, 16):
        np.testing.assert_allclose(
            sg.rfft(cpu.tensor(x), n=n).numpy(), _pair(np.fft.rfft(x, n=n)), rtol=1e-5, atol=1e-5
        )
    back = sg.irfft(spec, n=10)
    np.testing.assert_allclose(back.numpy(), x, rtol=1e-5, atol=1e-5)
    z = RNG.standard_normal((3, 5, 2))
    np.testing.assert_allclose(
        sg.irfft(cpu.tensor(z)).numpy(), np.fft.irfft(z[..., 0] + 1j * z[..., 1])
    )


def test_stft_matches_scipy_frames(cpu):
    x = RNG.standard_normal(64)
    n_fft, hop = 16, 4
    ours = sg.stft(cpu.tensor(x), n_fft, hop).numpy()
    win = scipy.signal.get_window("hann", n_fft)
    np.testing.assert_allclose(sg.window("hann", n_fft), win)
    _, _, ref = scipy.signal.stft(
        x, window=win, nperseg=n_fft, noverlap=n_fft - hop, boundary=None, padded=False
    )
    ref = ref.T * win.sum()  # scipy scales by the window sum and puts frames last
    assert ours.shape == (1 + (64 - n_fft) // hop, n_fft // 2 + 1, 2)
    np.testing.assert_allclose(ours, _pair(ref), atol=1e-10)


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
def test_fft_conv1d_matches_fftconvolve(cpu, mode):
    x, w = RNG.standard_normal((3, 20)), RNG.standard_normal(5)
    ours = sg.conv1d(cpu.tensor(x), cpu.tensor(w), mode=mode).numpy()
    np.testing.assert_allclose(ours, scipy.signal.fftconvolve(x, w[None], mode=mode), atol=1e-12)


def test_errors(cpu):
    with pytest.raises(RecordError, match=r"signal\.irfft: expected a \(\.\.\., k, 2\)"):
        sg.irfft(cpu.tensor(np.ones((4, 3))))
    with pytest.raises(RecordError, match=r"signal\.rfft: expected a float32 or float64"):
        sg.rfft(cpu.tensor(np.ones(4, dtype=np.int64)))
    with pytest.raises(ValueError, match="mode"):
        sg.conv1d(cpu.tensor(np.ones(4)), cpu.tensor(np.ones(2)), mode="circular")


@pytest.mark.parametrize("n", [None, 5, 13])
def test_rfft_gradient(n):
    check_grad(lambda t: sg.rfft(t, n=n), RNG.standard_normal((2, 8)))


@pytest.mark.parametrize("n", [None, 7, 9, 4])
def test_irfft_gradient(n):
    check_grad(lambda t: sg.irfft(t, n=n), RNG.standard_normal((2, 5, 2)))


def test_stft_and_conv1d_gradients():
    check_grad(lambda t: sg.stft(t, 8, 3), RNG.standard_normal(20))
    check_grad(
        lambda a, b: sg.conv1d(a, b, mode="same"),
        RNG.standard_normal((2, 9)),
        RNG.standard_normal(4),
    )
