"""Remote jobs: LoRA fine-tuning and ONNX export run by a `burn-remote serve` peer.

A tiny character-level GPT is trained briefly here (standing in for a pretrained model) and
saved in the GPT-2 layout. The server then fine-tunes a LoRA adapter on the second half of
the text as a job (the client only watches its progress bar), the adapter is fetched with
its checksum verified, the tuned model is exported to ONNX by a second job, and the `.onnx`
file is checked with onnxruntime against the engine. The server needs `--data-dir`.

    burn-remote serve --allow-any --data-dir /tmp/br &
    python examples/jobs_demo.py PEER@127.0.0.1:PORT
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from burn_remote import Device, RemoteDevice, nn, optim

sys.path.insert(0, str(Path(__file__).parent))
from lora_demo import load_corpus, train  # noqa: E402


def main(target: str, base_steps: int = 60, lora_steps: int = 40) -> dict:
    """Run the demo against the server at ``target`` ("peer@host:port"); returns figures."""
    t0 = time.perf_counter()
    local = Device.cpu()
    data, chars = load_corpus()
    nn.seed(0)
    config = nn.GPTConfig(n_layer=2, n_head=4, d_model=32, vocab=len(chars), context=16)
    base = nn.GPT(config, device=local)
    train(base, optim.AdamW(base, lr=3e-3), data[: len(data) // 2], base_steps, local)
    jobs = RemoteDevice(target).jobs
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        base.save_gpt2(tmp_path / "base.safetensors")
        np.savez(tmp_path / "tail.npz", tokens=data[len(data) // 2 :])
        spec = {
            "kind": "lora_finetune",
            "name": "jobs-demo",
            "seed": 0,
            "steps": lora_steps,
            "batch_size": 8,
            "checkpoint_every": 10,
            "model": {"weights": str(tmp_path / "base.safetensors"), "n_head": 4},
            "data": {"path": str(tmp_path / "tail.npz")},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.05},
            "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
            "schedule": {"kind": "cosine", "warmup_steps": lora_steps // 10},
        }
        job = jobs.submit(spec)  # the local files are uploaded as artifacts first
        print(f"submitted {job}")
        info = job.watch()
        if info["state"] != "succeeded":
            raise RuntimeError(f"LoRA job {job.id} ended {info['state']}: {info['error']}")
        losses = [e["loss"] for e in job.events(0) if e.get("loss") is not None]
        adapter = job.fetch(tmp_path / "adapter")
        print(
            f"LoRA job {job.id}: loss {losses[0]:.3f} -> {losses[-1]:.3f}; fetched "
            f"{', '.join(sorted(adapter))}"
        )
        export = jobs.submit(
            {
                "kind": "onnx_export",
                "model": {
                    "weights": info["spec"]["model"]["weights"],
                    "n_head": 4,
                    "adapter": f"job:{job.id}",
                },
                "example_shape": [2, config.context],
            }
        )
        onnx_path = export.fetch(tmp_path) if export.wait()["state"] == "succeeded" else {}
        onnx_path = onnx_path["model.onnx"]
        tuned = nn.GPT.from_gpt2(tmp_path / "base.safetensors", n_head=4, device=local)
        tuned.load_adapter(tmp_path / "adapter")
        tuned.eval()
        ids = np.stack([data[i : i + config.context] for i in (0, 500, 1000)]).astype(np.int64)
        ref = tuned(local.tensor(ids)).numpy()
        import onnxruntime as ort

        sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {sess.get_inputs()[0].name: ids})[0]
        diff = float(np.abs(got - ref).max())
        print(
            f"ONNX export job {export.id}: {onnx_path.stat().st_size:,} bytes; onnxruntime vs "
            f"engine max abs diff {diff:.2e}"
        )
        report = {"loss": (losses[0], losses[-1]), "onnx_max_abs_diff": diff}
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return report


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: jobs_demo.py PEER@HOST:PORT  (a server started with --data-dir)")
    main(sys.argv[1])
