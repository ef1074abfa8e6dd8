"""`burn-remote jobs watch` rides through a server restart: the server stops mid-job and
comes back on the same address within the resume window; the watcher says it lost the
server and connected again, shows that the job resumed from its checkpoint, and exits 0 when
the job succeeds."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

from burn_remote import RemoteDevice

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec
from tests.jobs.test_cli import EXE
from tests.remote.conftest import env_with_home, start_server


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_watch_rides_through_a_server_restart(base, client_home, tmp_path: Path) -> None:
    listen = f"127.0.0.1:{_free_udp_port()}"
    data = tmp_path / "srv"
    server = start_server(data, "--listen", listen)
    spec = lora_spec(*base, steps=400, checkpoint_every=20)
    job = RemoteDevice(server.target).jobs.submit(spec)
    watcher = subprocess.Popen(
        [EXE, "jobs", "watch", str(job.id), "--peer", server.target],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env_with_home(client_home),
    )  # fmt: skip
    err_text: list[str] = []
    drain = threading.Thread(
        target=lambda: err_text.extend(iter(lambda: watcher.stderr.read(1), ""))
    )
    drain.start()
    try:
        wait_for(lambda: "step" in "".join(err_text), timeout=120)  # its bar: it is watching
        wait_for(lambda: job.status()["checkpoint_step"] >= 20, timeout=120)
        assert server.stop() == 0, server.output()
        time.sleep(1.0)  # the watcher finds nothing listening, and keeps trying
        server = start_server(data, "--listen", listen)
        watcher.wait(timeout=300)
        out = watcher.stdout.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
        server.stop()
        drain.join(10)
    err = "".join(err_text)
    assert watcher.returncode == 0, err
    assert "lost the server" in err and "connected again" in err, err
    assert "resumed from the checkpoint at step" in err, err
    assert "state: succeeded" in out, out
