"""Extensions found through the `burn_remote.extensions` entry-point group, as a server does.

A throwaway dist-info in a temp directory announces `testext` (tests/support/extdemo_ops.py). A
separate Python process stands in for the server: it loads entry points, checks a graph the
client recorded against what it has, validates and runs it. Without the dist-info on its
path the same process refuses the graph, naming the extension.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from burn_remote import Device
from burn_remote.protocol import extensions as ext
from support.extdemo_ops import scale_shift

TESTS = pathlib.Path(__file__).resolve().parent

SERVER_SIDE = r"""
import json, sys
import numpy as np
from burn_remote.engine.backend import get_backend
from burn_remote.engine.executor import Executor
from burn_remote.protocol.extensions import (
    ExtensionMissing, check_graph_extensions, installed_extensions, load_entry_point_extensions)
from burn_remote.protocol.graph import decode, validate

loaded = load_entry_point_extensions()
graph_path, input_path, out_path = sys.argv[1:4]
graph = decode(open(graph_path, "rb").read())
report = {"loaded": loaded, "installed": installed_extensions()}
try:
    check_graph_extensions(graph, installed_extensions())
except ExtensionMissing as exc:
    report["refused"] = str(exc)
    report["extension"] = exc.extension
else:
    validate(graph)
    ex = Executor(get_backend("cpu"))
    plan = ex.register(graph.digest(), graph)
    (out,) = ex.run(plan, [np.load(input_path, allow_pickle=False)], [])
    np.save(out_path, out, allow_pickle=False)
print(json.dumps(report))
"""


def _write_dist_info(root: pathlib.Path) -> None:
    info = root / "burn_remote_testext-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: burn-remote-testext\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[burn_remote.extensions]\ntestext = support.extdemo_ops:testext\n"
    )


@pytest.fixture
def testext_dist(tmp_path, monkeypatch):
    """A directory holding an installed-looking distribution that announces `testext`."""
    site = tmp_path / "site"
    site.mkdir()
    _write_dist_info(site)
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_points_load_the_test_extension_and_the_shipped_ones(testext_dist):
    loaded = ext.load_entry_point_extensions()
    assert loaded["testext"] == "1"
    assert {"fused", "linalg", "signal"} <= set(loaded)
    assert ext.installed_extensions()["testext"] == "1"


def test_broken_entry_points_are_named(tmp_path, monkeypatch):
    site = tmp_path / "broken"
    info = site / "broken_ext-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[burn_remote_test.broken]\nnosuch = no_such_module_xyz:ext\nunregistered = json:dumps\n"
    )
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ext.ExtensionLoadError, match=r"'nosuch'.*broken-ext.*ModuleNotFound"):
        ext.load_entry_point_extensions("burn_remote_test.broken")
    errors: list[str] = []
    assert ext.load_entry_point_extensions("burn_remote_test.broken", errors=errors) == {}
    assert len(errors) == 2 and "registered no extension named 'unregistered'" in errors[1]


def _record_graph(tmp_path: pathlib.Path) -> tuple[np.ndarray, pathlib.Path, pathlib.Path]:
    dev = Device.cpu()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = dev.tensor(x)
    y = scale_shift(t, scale=4.0, shift=-1.0) * 2.0
    capture = dev._rec.capture()
    assert capture.output_ids == [y._id]
    graph_path, input_path = tmp_path / "graph.bin", tmp_path / "x.npy"
    graph_path.write_bytes(capture.graph.encode())
    np.save(input_path, x, allow_pickle=False)
    return (x * 4.0 - 1.0) * 2.0, graph_path, input_path


def _server(tmp_path, graph_path, input_path, extra_path: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVER_SIDE,
            str(graph_path),
            str(input_path),
            str(tmp_path / "y.npy"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_server_with_the_entry_point_runs_the_graph(tmp_path, testext_dist):
    expected, graph_path, input_path = _record_graph(tmp_path)
    report = _server(tmp_path, graph_path, input_path, [str(testext_dist), str(TESTS)])
    assert report["loaded"]["testext"] == "1"
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected)


def test_a_server_without_it_refuses_naming_the_extension(tmp_path):
    _, graph_path, input_path = _record_graph(tmp_path)
    report = _server(tmp_path, graph_path, input_path, [])
    assert "testext" not in report["installed"]
    assert report["extension"] == "testext"
    assert "extension 'testext' version 1" in report["refused"]
    assert not (tmp_path / "y.npy").exists()
