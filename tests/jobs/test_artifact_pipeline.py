"""Artifacts move pipelined: many chunks in flight, not one round trip per MiB."""

from __future__ import annotations

import hashlib
import os

from burn_remote import RemoteDevice
from burn_remote._jobs import ARTIFACT_WINDOW
from burn_remote.protocol import messages as m


def test_a_multi_chunk_artifact_goes_up_and_down_pipelined(spawn, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server = spawn()
    dev = RemoteDevice(server.target)
    path = tmp_path / "weights.bin"
    data = os.urandom(int(5.5 * m.ARTIFACT_CHUNK))
    path.write_bytes(data)
    rt = dev._rt
    in_flight, most = set(), [0]
    ask, wait = rt._ask, rt._wait

    def counting_ask(*call):  # type: ignore[no-untyped-def]
        rid = ask(*call)
        in_flight.add(rid)
        most[0] = max(most[0], len(in_flight))
        return rid

    def counting_wait(rid):  # type: ignore[no-untyped-def]
        result = wait(rid)
        in_flight.discard(rid)
        return result

    monkeypatch.setattr(rt, "_ask", counting_ask)
    monkeypatch.setattr(rt, "_wait", counting_wait)
    ref = dev.jobs.upload(path)
    assert ref == "sha256:" + hashlib.sha256(data).hexdigest()
    assert most[0] == 6  # all six chunks were sent before the first Ack was awaited
    most[0] = 0
    got = dev.jobs.download(ref, tmp_path / "back.bin").read_bytes()
    assert got == data
    assert most[0] == min(5, ARTIFACT_WINDOW)  # the first chunk tells the size, then 5 at once
    dev.close()
