"""Resume is bound to the peer id and a 128-bit random token: guessing, or even knowing,
another peer's token resumes nothing and never disturbs the victim's connection."""

from __future__ import annotations

import numpy as np
from burn_remote import RemoteDevice
from burn_remote.protocol import messages as m
from burn_remote.protocol.sequencing import SESSION_EXPIRED


def test_tokens_are_random_and_a_wrong_token_changes_nothing(
    server_engine, secure, peers, raw, guard_of
):
    server = secure()
    guard = guard_of(server, peers.victim)
    victim = RemoteDevice(server.target, key=peers.victim.key)
    x = victim.tensor(np.arange(8, dtype=np.float32))
    assert x.sum().item() == 28.0
    token = victim._rt.proto.welcome.resume_token
    assert len(token) >= 16

    first = raw(server, peers.attacker, sequenced=True).hello()
    again = raw(server, peers.attacker, sequenced=True).hello()
    tokens = {w.resume_token for w in (*first, *again) if isinstance(w, m.Welcome)}
    assert len(tokens) == 2 and all(len(t) >= 16 for t in tokens)
    assert token not in tokens

    # the attack (token 1 as the old 8-byte session id), the victim's real token
    # from another peer, and random bytes: each gets SESSION_EXPIRED and nothing else
    for guess in (
        (1).to_bytes(8, "big"),
        token,
        bytes(16),
        (guard.dev._rt.proto.welcome.session_id).to_bytes(8, "big"),
    ):
        thief = raw(server, peers.attacker, sequenced=True)
        (reply,) = thief.hello(token=guess)
        assert isinstance(reply, m.Error) and reply.code == SESSION_EXPIRED

    # the victim's session and connection are untouched: same tensor, same session
    assert (x * 2).sum().item() == 56.0
    assert victim._rt.proto.welcome.resume_token == token
    assert victim._rt.link._conn is not None and not victim._rt.link._conn.is_closed
    guard.check()
    victim.close()
