"""Every public name of `burn_remote` has a docstring: what `help()` and an IDE show.

"Public" is what the package exports (`burn_remote.__all__`) and, for each exported class,
every method and property not starting with ``_``, inherited ones included (a Tensor's
math comes from `_math.TensorMath`; a RemoteDevice's constructors from `Device`). The
subpackages (nn, optim, lora, functional, data, collective, linalg, signal, onnx) are held
to a count of names still undocumented that may only go down (see UNDOCUMENTED).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import burn_remote
import pytest

UNDOCUMENTED = {
    "nn": 43,
    "optim": 0,
    "lora": 14,
    "functional": 0,
    "data": 0,
    "collective": 0,
    "linalg": 0,
    "signal": 0,
}
"""Public names of each subpackage without a docstring when this test was written: the test
fails when a subpackage has more (a new public name needs its docstring); lower the number
when you document some."""


def _doc(obj: Any) -> str:
    if isinstance(obj, property):
        obj = obj.fget
    return (getattr(obj, "__doc__", None) or "").strip()


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties of ``cls`` and its burn_remote bases."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("burn_remote"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                yield name, value


def undocumented(module: Any, names: list[str]) -> list[str]:
    """Names among ``names`` of ``module`` (and their classes' members) without a docstring,
    each definition once (a method inherited by forty layers is one name to document)."""
    missing: dict[str, None] = {}
    for name in names:
        obj = getattr(module, name)
        if isinstance(obj, str) or type(obj).__name__ == "_Feature":  # dtype names; __future__
            continue
        if not _doc(obj):
            missing[f"{module.__name__}.{name}"] = None
        if inspect.isclass(obj):
            for _member, value in _members(obj):
                if not _doc(value):
                    fn = value.fget if isinstance(value, property) else value
                    missing[f"{fn.__module__}.{fn.__qualname__}"] = None
    return list(missing)


def test_every_exported_name_and_its_members_have_a_docstring():
    missing = undocumented(burn_remote, list(burn_remote.__all__))
    assert not missing, "no docstring:\n" + "\n".join(missing)


@pytest.mark.parametrize("sub", sorted(UNDOCUMENTED))
def test_subpackages_undocumented_count_only_goes_down(sub):
    module = importlib.import_module(f"burn_remote.{sub}")
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    names = [n for n in names if not inspect.ismodule(getattr(module, n))]
    missing = undocumented(module, names)
    assert len(missing) <= UNDOCUMENTED[sub], (
        f"{len(missing)} undocumented public names in burn_remote.{sub} (listed: "
        f"{UNDOCUMENTED[sub]}); document them or update UNDOCUMENTED:\n" + "\n".join(missing)
    )
