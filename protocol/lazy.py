"""Public names of a package loaded on first use (PEP 562 module ``__getattr__``), so that
``import burn_remote`` and its subpackages stay light: each package lists where its names
live and gets its ``__getattr__`` and ``__dir__`` from here (one loader for all of them)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Where = str | tuple[str, str | None]
"""A name's home: a module (the attribute of the same name in it), or (module, attribute),
attribute None for the module itself; modules relative to the package."""


def lazy_names(
    package: str, namespace: dict[str, Any], table: Mapping[str, Where]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (whose globals are ``namespace``)
    for the names of ``table``; a loaded name is kept in ``namespace``, so it loads once."""

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attribute = (where, name) if isinstance(where, str) else where
        module = importlib.import_module(module_name, package)
        value = module if attribute is None else getattr(module, attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


__all__ = ["Where", "lazy_names"]
