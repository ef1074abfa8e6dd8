"""`make demo`, remote part: start `burn-remote serve --device cpu`, train the digits MLP
through RemoteDevice, print the server's peer id, the accuracy and the bytes per step."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from burn_remote import RemoteDevice, nn, optim
from burn_remote import functional as F
from burn_remote.server.testing import start_server


def main() -> None:
    from sklearn.datasets import load_digits

    home = tempfile.mkdtemp(prefix="burn-remote-demo-")
    os.chmod(home, 0o700)
    os.environ.setdefault("BURN_REMOTE_HOME", home)  # the client's key lives here
    server = start_server(os.path.join(home, "server"))
    peer, addr = server.peer_id, server.address
    try:
        print(f"server peer id: {peer} at {addr}")
        dev = RemoteDevice(f"{peer}@{addr}")
        d = load_digits()
        x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
        n_train = 1500
        nn.seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        batch, steps = 64, 300
        per_step = []
        for step in range(steps):
            i = (step * batch) % (n_train - batch)
            before = dev.stats()["bytes_sent"]
            loss = F.cross_entropy(
                model(dev.tensor(x[i : i + batch])), dev.tensor(y[i : i + batch])
            )
            loss.backward()
            opt.step()
            opt.zero_grad()
            value = loss.item()
            per_step.append(dev.stats()["bytes_sent"] - before)
            if step % 100 == 0:
                print(f"step {step:4d}  loss {value:.4f}")
        pred = model(dev.tensor(x[n_train:])).numpy().argmax(-1)
        acc = float((pred == y[n_train:]).mean())
        st = dev.stats()
        print(f"held-out accuracy: {acc:.3f}")
        print(
            f"bytes sent per step (from step 2): {np.mean(per_step[1:]):.0f} "
            f"(batch data {batch * 64 * 4 + batch * 8}); graphs registered "
            f"{st['graphs_registered']}, replays {st['replays']}"
        )
        dev.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
