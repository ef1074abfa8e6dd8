"""Every public name of `burn_remote` has a docstring: what `help()` and an IDE show.

"Public" is what the package exports (`burn_remote.__all__`) and, for each exported class,
every method and property not starting with ``_``, inherited ones included (a Tensor's
math comes from `_math.TensorMath`; a RemoteDevice's constructors from `Device`). The same
holds in every public module of the client (a dotted path with no part starting with ``_``:
nn, nn.init, optim, optim.lr_scheduler, lora, functional, data, tokenizer, onnx ...): its
``__all__``, else the public names it defines itself. And every public class defined in
any module of the client, private ones included (a Runtime, a Recorder, `Compiled`, a
layer of a Llama model), with its public methods: a user meets them in tracebacks,
`help()` and return values, and the next engineer reads them first.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import burn_remote
import pytest


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


def public_modules() -> list[str]:
    """Dotted names of the client's public modules (no part starting with ``_``); the server,
    engine and protocol packages are internals that users reach only through the CLI."""
    internal = ("server", "engine", "protocol")
    names = []
    for info in pkgutil.walk_packages(burn_remote.__path__, "burn_remote."):
        parts = info.name.split(".")[1:]
        if parts[0] in internal or any(p.startswith("_") for p in parts):
            continue
        names.append(info.name)
    return names


def test_public_modules_are_found():
    """The walk sees the subpackages users import (a broken walk would pass vacuously)."""
    found = set(public_modules())
    for name in ("nn", "nn.init", "optim", "optim.lr_scheduler", "lora", "functional", "onnx"):
        assert f"burn_remote.{name}" in found


@pytest.mark.parametrize("name", public_modules())
def test_every_public_module_name_and_its_members_have_a_docstring(name):
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items() if not n.startswith("_") and _defined_in(v, name)
    ]
    names = [n for n in names if not inspect.ismodule(getattr(module, n))]
    missing = undocumented(module, names)
    assert not missing, f"no docstring in {name}:\n" + "\n".join(missing)


def _defined_in(value: Any, module: str) -> bool:
    return getattr(value, "__module__", None) == module


def client_modules() -> list[str]:
    """Every module of the client (burn_remote's own folder), private ones included."""
    return [info.name for info in pkgutil.walk_packages(burn_remote.__path__, "burn_remote.")
            if info.name.split(".")[1] not in ("server", "engine", "protocol")]  # fmt: skip


def test_every_public_class_of_the_client_and_its_members_have_a_docstring():
    missing: dict[str, None] = {}
    classes = 0
    for name in client_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("_") or not inspect.isclass(value) or not _defined_in(value, name):
                continue
            classes += 1
            missing.update(dict.fromkeys(undocumented(module, [attr])))
    assert classes > 100  # the walk found the client's classes (113 when this was written)
    assert not missing, "no docstring:\n" + "\n".join(missing)
