"""Specs as users write them: every problem reported at once, the spellings other tools use
(`learning_rate`, `epochs`...), and the checks that need the model and the data (LoRA targets,
batch size) made at submit time against the real files on a real server, never narrowed."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote._jobs import Jobs
from burn_remote.server.jobs import SpecError, validate

from tests.jobs.models import lora_spec

REF = "sha256:" + "ab" * 32


def test_every_missing_key_is_reported_at_once():
    with pytest.raises(SpecError) as info:
        validate({"kind": "lora_finetune", "lora": {"rnk": 4}})
    lines = str(info.value).splitlines()
    assert lines == [
        "model: required key is missing",
        "data: required key is missing",
        "lora.rnk: unknown key; did you mean 'r'?",
        "steps: required key is missing (or give epochs)",
    ]


def test_the_spellings_users_bring_are_taken_as_the_keys_they_mean():
    spec = {
        "kind": "lora_finetune",
        "max_steps": 12,
        "learning_rate": 3e-4,
        "per_device_train_batch_size": 2,
        "warmup_steps": 3,
        "model": {"weights": REF},
        "data": {"path": REF},
        "lora": {"rank": 4, "lora_alpha": 32, "lora_dropout": 0.05},
    }
    out = validate(spec)
    assert (out["steps"], out["batch_size"]) == (12, 2)
    assert out["optimizer"]["lr"] == 3e-4
    assert out["schedule"]["warmup_steps"] == 3
    assert (out["lora"]["r"], out["lora"]["alpha"], out["lora"]["dropout"]) == (4, 32.0, 0.05)
    assert "learning_rate" not in out and "rank" not in out["lora"]  # stored as the keys
    nested = validate({**lora_spec(REF, REF), "optimizer": {"learning_rate": 0.5}})
    assert nested["optimizer"]["lr"] == 0.5


@pytest.mark.parametrize("spec", [["kind", "lora_finetune"], b"kind = 'lora_finetune'"])
def test_a_spec_that_is_no_table_is_refused_before_anything_is_sent(spec):
    """A list or bytes is no spec: named, where it failed on `.get` of a list or str."""
    jobs = Jobs(runtime=None)  # no runtime: the refusal must come before anything is sent
    with pytest.raises(JobError, match=f"spec: expected a dict.*got {type(spec).__name__}"):
        jobs.submit(spec)


def _refused(target: str, spec: dict) -> str:
    with pytest.raises(JobError) as info:
        RemoteDevice(target).jobs.submit(spec)
    return str(info.value)


def test_a_target_module_that_names_no_layer_is_refused_at_submit(spawn, base, client_home):
    weights, data = base
    srv = spawn()
    text = _refused(
        srv.target, lora_spec(weights, data, lora={"target_modules": ["c_atn", "c_proj"]})
    )
    assert "lora.target_modules: 'c_atn' names no layer of model.weights" in text
    assert "c_attn" in text  # the layers it has are listed
    alone = _refused(srv.target, lora_spec(weights, data, lora={"target_modules": ["c_atn"]}))
    assert "'c_atn' names no layer" in alone
    assert RemoteDevice(srv.target).jobs.list() == []  # nothing queued


def test_a_batch_larger_than_the_data_is_refused_at_submit(spawn, base, client_home, tmp_path):
    weights, _ = base
    short = tmp_path / "short.npz"
    np.savez(short, tokens=np.arange(60, dtype=np.int64) % 8)  # 60 tokens, context 16
    srv = spawn()
    text = _refused(srv.target, lora_spec(weights, short, batch_size=50))
    assert "batch_size: 50 samples a step, but data.path holds 43 windows of 17 tokens" in text
    ok = lora_spec(weights, short, batch_size=43, steps=2, schedule={"kind": "constant"})
    job = RemoteDevice(srv.target).jobs.submit(ok)
    assert job.wait()["state"] == "succeeded"


def test_epochs_become_steps_from_the_data_size(spawn, base, client_home):
    weights, data = base
    srv = spawn()
    tokens = int(np.load(data)["tokens"].size)
    spec = lora_spec(weights, data, batch_size=4)
    spec.pop("steps")
    spec["num_train_epochs"] = 1
    info = RemoteDevice(srv.target).jobs.submit(spec).info
    assert info["spec"]["steps"] == -(-(tokens // 16) // 4)  # one pass of 16-token windows
    assert info["total"] == info["spec"]["steps"]
