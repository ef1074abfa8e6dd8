"""GroupError: how a failed collective reaches the user, from a local replica or a server."""

from __future__ import annotations

from ._recorder import OpFailed


class GroupError(OpFailed):
    """A collective could not complete on this rank: ``rank``/``peer`` name the rank that
    died, was cut off, was late or disagreed (``-1``/``""`` when it is this device itself);
    ``group`` is the group's id. Raised at the next sync or read on every surviving rank;
    afterwards every collective on the group fails at once: close it and build a new
    ``Group`` from the survivors."""

    def __init__(self, message: str, group: int = 0, rank: int = -1, peer: str = "") -> None:
        super().__init__(message)
        self.group, self.rank, self.peer = group, rank, peer


def group_error(message: str, prefix: str = "") -> GroupError:
    """The GroupError of a server's ``Error(GROUP)`` (its message names group and culprit:
    ``protocol.messages.GROUP_MESSAGE``); ``prefix`` says where (the op and line)."""
    import re

    from burn_remote.protocol.messages import GROUP_MESSAGE

    found = re.search(GROUP_MESSAGE, message)
    text = f"{prefix}{message}"
    if found is None:
        return GroupError(text)
    return GroupError(text, int(found["group"], 16), int(found["rank"]), found["peer"])


def as_group_error(exc: OpFailed) -> OpFailed:
    """``exc`` as a GroupError when a collective's failure caused it (else ``exc``)."""
    from burn_remote.engine.collective import GroupFailure

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, GroupFailure):
        cause = cause.__cause__
    if cause is None or isinstance(exc, GroupError):
        return exc
    return GroupError(str(exc), cause.group, cause.rank, cause.peer)


__all__ = ["GroupError", "as_group_error", "group_error"]
