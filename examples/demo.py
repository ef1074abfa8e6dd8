"""`make demo`: the main job, end to end.

1. `burn-remote serve --device cpu` starts (the embedded NumPy engine, no GPU needed);
2. a client trains the digits MLP through `RemoteDevice`, with a progress bar: the step is
   compiled (`br.compile`), so after the first calls it is replayed without recording, as
   one small message per step (steps share packets), with the same accuracy as on
   `Device.cpu()`;
3. a LoRA fine-tune of a tiny GPT runs on the server as a job, watched with a progress bar;
   the adapter comes back in the PEFT layout with its checksum verified;
4. the tuned model is exported to ONNX by a second job and checked with onnxruntime.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import burn_remote as br  # noqa: E402
import digits  # noqa: E402
import jobs_demo  # noqa: E402
from burn_remote.server.testing import start_server  # noqa: E402


def stage_remote_training(dev: br.RemoteDevice) -> None:
    print(f"== 2. digits MLP trained through {dev} ==")
    _, losses, acc = digits.train(dev, progress=True)
    stats = dev.stats()
    steps = stats["replays"] + stats["graphs_registered"]
    per_step = stats["bytes_sent"] / max(steps, 1)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; test accuracy {acc:.1%}")
    captured = digits.train.last_step.stats()
    print(
        f"step compiled (br.compile): body ran {captured['recordings']} times, replayed "
        f"{captured['replays']} times without recording"
    )
    print(
        f"graphs registered {stats['graphs_registered']}, replayed {stats['replays']}; "
        f"{stats['messages_sent']} messages, {per_step:,.0f} bytes sent per step on average "
        f"({stats['data_bytes_sent'] / max(steps, 1):,.0f} of them batch data)"
    )


def main() -> None:
    home = tempfile.mkdtemp(prefix="burn-remote-demo-")
    os.chmod(home, 0o700)
    os.environ.setdefault("BURN_REMOTE_HOME", home)  # the client's key lives here
    print("== 1. burn-remote serve --device cpu ==")
    server = start_server(os.path.join(home, "server"))
    peer, addr = server.peer_id, server.address
    try:
        print(f"server peer id {peer}, listening on {addr}")
        dev = br.RemoteDevice(f"{peer}@{addr}")
        stage_remote_training(dev)
        print("== 3-4. LoRA job, then ONNX export job checked with onnxruntime ==")
        report = jobs_demo.main(f"{peer}@{addr}", base_steps=200, lora_steps=150)
        if report["onnx_max_abs_diff"] > 1e-4:
            raise SystemExit("ONNX check failed: onnxruntime disagrees with the engine")
        dev.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
