"""The GPU deployment: deploy/Dockerfile.cuda, the compose `gpu` profile, nvidia.com/gpu in
Kubernetes, and the pinned CUDA extra they install. No Docker engine or GPU on CI: these
parse the files and check them against the CLI and pyproject.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.deploy.test_manifests import _commands, _listen_port, _parse

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _pins(reqs: list[str]) -> dict[str, str]:
    out = {}
    for req in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([0-9.]+)", req)
        assert m, f"not pinned exactly: {req}"
        out[m.group(1)] = m.group(3)
    return out


def test_cuda_extras_pin_cupy_nvrtc_and_headers_consistently() -> None:
    extras = _extras()
    gpu, check = _pins(extras["cuda"]), _pins(extras["cuda-check"])
    assert gpu["cupy-cuda12x"] == check["cupy-cuda12x"]
    assert gpu["cupy-cuda12x"].startswith("14.")
    assert any(r.startswith("cupy-cuda12x[ctk]") for r in extras["cuda"]), "CUDA libs as wheels"
    toolkit = next(r for r in extras["cuda"] if r.startswith("cuda-toolkit["))
    assert {"nvrtc", "cudart", "cublas"} <= set(toolkit.split("[")[1].split("]")[0].split(","))
    assert {"nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"} <= set(check)
    makefile = (ROOT / "Makefile").read_text()
    assert "cuda-check]" in makefile, "make test installs the offline CUDA checks' wheels"


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "deploy" / "Dockerfile.cuda").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_cuda_image_has_nvrtc_headers_and_onnx() -> None:
    steps = _dockerfile()
    (base,) = [arg for op, arg in steps if op == "FROM"]
    image, tag = base.split(":")
    assert image == "nvidia/cuda" and tag.startswith("12.")
    installs = " ".join(arg for op, arg in steps if op == "RUN" and "pip install" in arg)
    match = re.search(r"pip install '\.\[([a-z,-]+)\]'", installs)
    assert match, installs
    extras = set(match.group(1).split(","))
    assert {"cuda", "onnx"} <= extras
    if "-runtime" in tag or "-base" in tag:  # no toolkit in the image: the wheels bring it
        assert any(r.startswith("cupy-cuda12x[ctk]") for r in _extras()["cuda"])
    assert "import cupy, onnx" in installs, "the build fails early if CuPy or ONNX is missing"
    (cmd,) = [arg for op, arg in steps if op == "CMD"]
    ns = _parse(json.loads(cmd))
    assert ns.command == "serve" and ns.device == "cuda:0"


def test_compose_gpu_profile_reserves_a_gpu_and_runs_the_cuda_image() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    gpu = services["gpu"]
    assert gpu["profiles"] == ["gpu"], "the GPU server starts only when asked for"
    assert gpu["build"]["dockerfile"] == "deploy/Dockerfile.cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    (argv,) = _commands(gpu["command"])
    ns = _parse(argv)
    assert ns.command == "serve" and ns.device.startswith("cuda")
    assert {int(p.split(":")[-1].split("/")[0]) for p in gpu["ports"]} == {_listen_port(ns)}
    host = ns.relay.split(":")[0]
    assert host in services and "profiles" not in services[host]


def test_k8s_servers_request_gpus_and_tolerate_gpu_nodes() -> None:
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "servers.yaml").read_text())
    (sts,) = [d for d in docs if d and d["kind"] == "StatefulSet"]
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"].endswith(":cuda")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (argv,) = _commands(container["command"])
    assert shlex.join(argv).count("--device cuda:0") == 1
