"""The one failure of a collective, raised inside the kernel and carried to the user."""

from __future__ import annotations


class GroupFailure(RuntimeError):
    """A group cannot complete a collective: a rank died, was cut off, was late, or gave a
    tensor the others did not. ``rank``/``peer`` name the culprit (-1/"" when it is this
    device itself, e.g. not a member). Once a group failed, every later collective on it
    raises the same failure at once: nothing waits on a group that cannot complete."""

    def __init__(self, group: int, rank: int, peer: str, reason: str) -> None:
        self.group, self.rank, self.peer, self.reason = group, rank, peer, reason
        # the form of protocol/messages.py GROUP_MESSAGE (rank -1, no peer: this device)
        super().__init__(f"group {group:016x}: rank {rank} ({peer}): {reason}")
