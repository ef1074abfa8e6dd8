"""`make demo`: the main job, end to end, on the embedded CPU default.

1. the digits MLP trained on Device.cpu() (progress bar, test accuracy);
2. a LoRA and a QLoRA fine-tune of a tiny GPT, adapters saved in the PEFT layout;
3. the trained MLP exported to ONNX and checked against the engine with onnxruntime.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import burn_remote as br  # noqa: E402
import digits  # noqa: E402
import lora_demo  # noqa: E402


def stage_digits(dev: br.Device) -> br.nn.Module:
    print("== 1. digits MLP on", dev, "==")
    net, losses, acc = digits.train(dev, progress=True)
    stats = dev.stats()
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; test accuracy {acc:.1%}")
    print(f"graphs registered {stats['graphs_registered']}, graph runs {stats['replays']}")
    return net


def stage_onnx(dev: br.Device, net: br.nn.Module) -> None:
    import onnxruntime as ort

    from burn_remote.onnx import export

    print("== 3. ONNX export, checked with onnxruntime ==")
    _, _, xte, _ = digits.load()
    with tempfile.TemporaryDirectory() as tmp:
        path = export(net, xte[:8], os.path.join(tmp, "digits.onnx"))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {sess.get_inputs()[0].name: xte})  # another batch size
        with br.no_grad():
            ref = net(dev.tensor(xte)).numpy()
        diff = float(np.abs(got - ref).max())
        print(
            f"exported {os.path.getsize(path):,} bytes; onnxruntime vs engine on {len(xte)} rows: max |diff| {diff:.2e}"
        )
        if diff > 1e-4:
            raise SystemExit("ONNX check failed: onnxruntime disagrees with the engine")


def main() -> None:
    dev = br.Device.cpu()
    net = stage_digits(dev)
    print("== 2. LoRA / QLoRA fine-tune of a tiny GPT ==")
    lora_demo.main(dev)
    stage_onnx(dev, net)


if __name__ == "__main__":
    main()
