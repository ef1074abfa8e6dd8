"""ParamGroup: a named selection of parameters with its own optimizer settings.

A group selects by dotted name: a glob (`"h.*.attn.*"`), a regex, or a predicate over
(name, tensor). The same object freezes and unfreezes its parameters on a model, and an
optimizer built with groups applies each group's settings (lr, weight decay, betas...).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._tensor import Tensor

Named = list[tuple[str, Tensor]]


def named_params(source: Any) -> Named:
    """(name, tensor) pairs from a Module (frozen included), pairs, or bare tensors."""
    if hasattr(source, "named_parameters"):
        return list(source.named_parameters(include_frozen=True))
    items = list(source)
    if all(isinstance(t, Tensor) for t in items):
        return [(f"param.{i}", t) for i, t in enumerate(items)]
    return [(str(n), t) for n, t in items]


class ParamGroup:
    """Parameters whose name matches `pattern` (glob, or a list of globs), `regex`
    (searched) or `predicate(name, tensor)`; `settings` override the optimizer's defaults."""

    def __init__(
        self,
        pattern: str | Sequence[str] | None = None,
        *,
        regex: str | re.Pattern[str] | None = None,
        predicate: Callable[[str, Tensor], bool] | None = None,
        name: str | None = None,
        **settings: Any,
    ) -> None:
        if sum(x is not None for x in (pattern, regex, predicate)) != 1:
            raise ValueError("ParamGroup: give exactly one of pattern, regex or predicate")
        self.patterns = [pattern] if isinstance(pattern, str) else list(pattern or [])
        if pattern is not None and not self.patterns:
            raise ValueError("ParamGroup: an empty list of patterns selects nothing")
        self.regex = re.compile(regex) if isinstance(regex, str) else regex
        self.predicate = predicate
        self.name = name or (pattern if isinstance(pattern, str) else None) or repr(self)
        self.settings = settings

    def __repr__(self) -> str:
        what = self.patterns or (self.regex.pattern if self.regex else self.predicate)
        return f"ParamGroup({what!r})"

    def matches(self, name: str, tensor: Tensor | None = None) -> bool:
        """Whether the parameter ``name`` (and tensor) belongs to this group: its patterns, regex or
        predicate (which reads the tensor, so a predicate group needs it)."""
        if self.patterns:
            return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
        if self.regex is not None:
            return self.regex.search(name) is not None
        if self.predicate is None:  # (`patterns` emptied after construction)
            raise ValueError(f"{self!r}: has no pattern, regex or predicate to match with")
        if tensor is None:
            raise TypeError(f"{self!r}.matches({name!r}): a predicate group needs the tensor")
        return bool(self.predicate(name, tensor))

    def select(self, source: Any) -> Named:
        """The (name, tensor) pairs of ``source``'s parameters in this group."""
        return [(n, t) for n, t in named_params(source) if self.matches(n, t)]

    def freeze(self, source: Any) -> int:
        """Stop training the selected parameters; returns how many tensors changed."""
        return _set_trainable(self.select(source), False)

    def unfreeze(self, source: Any) -> int:
        """Train the selected parameters again; returns how many tensors changed."""
        return _set_trainable(self.select(source), True)


def _set_trainable(named: Iterable[tuple[str, Tensor]], flag: bool) -> int:
    n = 0
    for _, t in named:
        if t.requires_grad != flag:
            t.requires_grad_(flag)
            n += 1
        if not flag:
            t.grad = None
    return n
