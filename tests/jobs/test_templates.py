"""Every job kind has an annotated template (`burn-remote jobs template KIND`), docs/jobs.md
shows the same text, and each one submits and runs to the end exactly as printed, next to
small files with the names it uses, from another working directory (its local paths are
relative to the spec file)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, nn
from burn_remote.server.jobs import KINDS
from burn_remote.server.jobs._templates import TEMPLATES

from tests.jobs.test_cli import EXE, _jobs
from tests.remote.conftest import env_with_home

DOCS = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def _documented(kind: str) -> str:
    text = DOCS.read_text()
    m = re.search(rf"^## `{kind}`\n.*?^```toml\n(.*?)^```$", text, re.S | re.M)
    assert m, f"docs/jobs.md has no template for {kind}"
    return m.group(1)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_template_printed_and_documented(kind: str, tmp_path: Path) -> None:
    import subprocess

    out = subprocess.run(
        [EXE, "jobs", "template", kind], capture_output=True, text=True, timeout=60,
        env=env_with_home(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == TEMPLATES[kind] == _documented(kind)


def _inputs(folder: Path) -> None:
    """The files the templates name, small: a GPT-2 save_pretrained directory, token ids,
    and an x/y table."""
    nn.seed(0)
    config = nn.GPTConfig(n_layer=1, n_head=2, d_model=32, vocab=64, context=32)
    nn.GPT(config, device=Device.cpu()).save_pretrained(folder / "gpt2")
    rng = np.random.default_rng(0)
    np.savez(folder / "tokens.npz", tokens=rng.integers(0, 64, 2000).astype(np.int64))
    x = rng.standard_normal((256, 64)).astype(np.float32)
    np.savez(folder / "data.npz", x=x, y=(x[:, :10].argmax(1)).astype(np.int64))


def test_every_template_submits_and_runs_as_printed(spawn, client_home, tmp_path) -> None:
    srv = spawn()
    specs = tmp_path / "specs"
    specs.mkdir()
    _inputs(specs)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    for kind in KINDS:
        path = specs / f"{kind}.toml"
        path.write_text(TEMPLATES[kind])
        done = _jobs(client_home, "submit", str(path), "--peer", srv.target, "--watch",
                     timeout=600, cwd=elsewhere)  # fmt: skip
        assert done.returncode == 0, f"{kind}:\n{done.stdout}\n{done.stderr}"
