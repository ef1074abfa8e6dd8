"""A client process for the two-clients generation test: loads a GPT on the server, warms
its generation up, prints "ready", waits for "go" on stdin, then generates, writing one line
"NAME" per new token to the file descriptor OUT_FD as it arrives (lines under PIPE_BUF are
written whole, so the reader sees both clients' tokens in the order they arrived), and
prints the tokens as one JSON line at the end.

Run as ``python generate_client.py TARGET KEY MODEL_DIR NAME OUT_FD NEW PROMPT_SEED``."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from burn_remote import RemoteDevice, nn


class ArrivalWriter:
    """A streamer writing NAME to `fd` for each new token (the first put is the prompt)."""

    def __init__(self, name: str, fd: int) -> None:
        self.line, self.fd, self.prompt_seen = f"{name}\n".encode(), fd, False

    def put(self, ids: np.ndarray) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        os.write(self.fd, self.line)

    def end(self) -> None:
        pass


def main() -> None:
    target, key, model_dir, name, fd, new, seed = sys.argv[1:8]
    dev = RemoteDevice(target, key=key)
    model = nn.GPT.from_pretrained(model_dir, device=dev)
    prompt = np.random.default_rng(int(seed)).integers(1, model.config.vocab, (1, 16))
    model.generate(prompt, 8, eos_token_id=None)  # weights on the server, graphs registered
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go' on stdin")
    out = model.generate(prompt, int(new), eos_token_id=None, streamer=ArrivalWriter(name, int(fd)))
    print(json.dumps(out.tolist()), flush=True)
    dev.close()


if __name__ == "__main__":
    main()
