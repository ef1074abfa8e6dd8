"""The base of every wire message, a leaf below the modules that declare messages by concern.

A message is a frozen dataclass with a ``TAG``; its fields, in declaration order, are its
wire fields. `messages.MESSAGES` is the one table of them (protocol/messages.py).
"""

from __future__ import annotations

from typing import Any, ClassVar


class WireMessage:
    """A message of this protocol (subclasses are frozen, slotted dataclasses)."""

    __slots__ = ()
    TAG: ClassVar[int]
    """The message's tag: the first element of its msgpack array."""
    __dataclass_fields__: ClassVar[dict[str, Any]]
    """(Every subclass is a dataclass: what type checkers look for.)"""


__all__ = ["WireMessage"]
