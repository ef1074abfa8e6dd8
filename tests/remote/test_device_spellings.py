"""Every device spelling works in every constructor, in `.to()`, `Device.parse` and
`br.device`: one resolver (`Device.resolve`) reads one table of kinds.

Before it, `br.zeros((2,), device="PEER@HOST:PORT")` raised "unknown device" while
`t.to("PEER@HOST:PORT")` worked: four parsers disagreed. The oracle is NumPy (values) and
identity (the same device object for every spelling of one place).
"""

from __future__ import annotations

from pathlib import Path

import burn_remote as br
import numpy as np
import pytest
from burn_remote import Device, RemoteDevice
from burn_remote.engine.backend import BackendUnavailable

from .conftest import Server

DATA = np.arange(6, dtype=np.float32).reshape(2, 3)

CONSTRUCTORS = {
    "tensor": (lambda d: br.tensor(DATA, device=d), DATA),
    "as_tensor": (lambda d: br.as_tensor(DATA, device=d), DATA),
    "from_numpy": (lambda d: br.from_numpy(DATA, device=d), DATA),
    "from_dlpack": (lambda d: br.from_dlpack(DATA, device=d), DATA),
    "zeros": (lambda d: br.zeros(2, 3, device=d), np.zeros((2, 3), np.float32)),
    "ones": (lambda d: br.ones((2, 3), device=d), np.ones((2, 3), np.float32)),
    "arange": (lambda d: br.arange(0, 6, 2, device=d), np.arange(0, 6, 2)),
    "eye": (lambda d: br.eye(3, device=d), np.eye(3, dtype=np.float32)),
    "randn": (lambda d: br.randn(2, 3, device=d), None),
    "rand": (lambda d: br.rand(2, 3, device=d), None),
}


def _local_spellings() -> list[tuple[object, Device]]:
    cpu = Device.cpu()
    spellings: list[tuple[object, Device]] = [
        ("cpu", cpu),
        ("CPU", cpu),
        (" cpu ", cpu),
        ("cpu:0", cpu),
        (cpu, cpu),
    ]
    try:
        opencl = Device.opencl()
    except Exception:  # no PyOpenCL platform here: its spellings are not this machine's
        return spellings
    return spellings + [("opencl", opencl), ("OpenCL:0", opencl), (opencl, opencl)]


def _check(spelling: object, expected: Device) -> None:
    assert Device.resolve(spelling) is expected  # type: ignore[arg-type]
    assert Device.parse(spelling) is expected  # type: ignore[arg-type]
    assert br.device(spelling) is expected
    for name, (make, want) in CONSTRUCTORS.items():
        t = make(spelling)
        assert t.device is expected, (name, spelling)
        if want is None:
            assert t.shape == (2, 3), name
        else:
            np.testing.assert_array_equal(t.numpy(), want, err_msg=f"{name} on {spelling!r}")
    moved = Device.cpu().tensor(DATA).to(spelling)
    assert moved.device is expected
    np.testing.assert_array_equal(moved.numpy(), DATA)
    back = moved.to("cpu", "float64")
    assert back.device is Device.cpu() and back.dtype == "float64"


def test_every_local_spelling_in_every_constructor_and_to():
    for spelling, expected in _local_spellings():
        _check(spelling, expected)


def test_every_peer_spelling_in_every_constructor_and_to(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = tmp_path / "addresses.toml"
    book.write_text(f'[[peer]]\nid = "{server.peer_id}"\naddresses = ["{server.address}"]\n')
    monkeypatch.setenv("BURN_REMOTE_ADDRESS_BOOK", str(book))
    by_address = RemoteDevice(server.target)
    for spelling in (server.target, f"  {server.target} ", by_address):
        _check(spelling, by_address)
    by_id = RemoteDevice(str(server.peer_id))  # the address book's entry
    _check(str(server.peer_id), by_id)


def test_a_kind_this_machine_cannot_run_says_so_and_a_typo_lists_every_spelling():
    try:
        Device.cuda(0)
    except BackendUnavailable:
        with pytest.raises(BackendUnavailable, match="cuda:0"):
            br.zeros(2, device="cuda:0")
    for typo in ("cdua", "gpu", "tpu:0"):
        with pytest.raises(ValueError, match=f"unknown device '{typo}'") as info:
            br.zeros(2, device=typo)
        for spelling in ("cpu", "cuda[:N]", "opencl[:N]", "PEER@HOST:PORT"):
            assert spelling in str(info.value)
        with pytest.raises(ValueError, match="unknown device"):
            Device.cpu().tensor([1.0]).to(typo)
    with pytest.raises(TypeError, match="expected a Device or a string"):
        br.zeros(2, device=3)


def test_serve_checks_its_device_with_the_same_parser():
    """`burn-remote serve --device` reads the local kinds of the same table: a typo is an
    argument error naming the spellings, before a key, a socket or an engine is touched."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "burn_remote.server.cli", "serve", "--device", "cdua:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "argument --device: unknown device 'cdua:0'" in out.stderr
    assert "cuda[:N]" in out.stderr
