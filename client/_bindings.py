"""Scalars whose value follows Python state on every replay of a compiled step.

Optimizers (learning rate, step counter), dropout (its key) and the default random
generator record their per-step numbers through `binding`; `br.compile` (`_compile`) calls
each source again on every replay instead of re-recording. Kept at the bottom of the client,
beside the recorder it writes to, so the layers that bind values need not import `compile`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._recorder import capture_here


def binding(dev: Any, source: Callable[[], Any], dtype: str) -> Any:
    """`dev.scalar(source(), dtype)`, and on every replay of a compiled function `source()`
    again, so the value follows Python state (a schedule, a counter) without re-recording."""
    t = dev.scalar(source(), dtype)
    log_ = dev._rec.log
    if log_ is not None:
        log_.actions.append((t._id, source))
    return t


def on_replay(effect: Callable[[], Any]) -> None:
    """Run `effect()` on every replay of the step being captured now (no-op otherwise), in
    recording order with the binding sources: how an optimizer advances its step counter."""
    rec = capture_here()
    if rec is not None:
        rec.log.actions.append((-1, effect))


def capturing() -> bool:
    """Whether a compiled function is recording its step right now, in this thread."""
    return capture_here() is not None


__all__ = ["binding", "capturing", "on_replay"]
