"""Extensions: named, versioned groups of ops that join the one registry, and finding them.

An extension op is an ordinary registry op whose *wire name* carries its extension and
version: ``"<extension>.<op>@<version>"`` (``"fused.linear_bias_relu@1"``). Because the wire
name is what graphs record, the version is inside every graph hash with no change to the
graph form: a changed extension never replays a plan compiled for the old one, and a server
can tell from a graph alone which extensions (and versions) it needs. Built-in op names
never contain ``@``.

Servers never receive code. They run what is installed on them, found through the Python
entry-point group :data:`ENTRY_POINT_GROUP`; each entry point is named after its extension
and points at the object (or module) whose import registers it::

    [project.entry-points."burn_remote.extensions"]
    myext = "mypkg.ops:myext"

The client-side declaration API (kernels, the callable op) is ``burn_remote.Extension``;
this module is what both ends must agree on, so it imports nothing of the client or engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .graph import Graph, GraphError
from .registry import OpDef, declare

ENTRY_POINT_GROUP = "burn_remote.extensions"
"""Entry-point group under which installed distributions announce extensions."""

_EXT_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")
_OP_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]*$")


class ExtensionError(ValueError):
    """An extension declaration or entry point is malformed, or a name is taken."""


class ExtensionMissing(GraphError):
    """A graph needs an extension (or version of one) that this end does not have."""

    def __init__(self, message: str, extension: str, version: str, node: int | None) -> None:
        super().__init__(message, node)
        self.extension = extension
        """Name of the first missing extension."""
        self.version = version
        """The version the graph asked for."""


@dataclass(eq=False)
class ExtensionInfo:
    """One registered extension: its name, version and the wire names of its ops."""

    name: str
    version: str
    doc: str = ""
    ops: dict[str, OpDef] = field(default_factory=dict)
    """Short op name -> registry declaration (whose name is the wire name)."""


EXTENSIONS: dict[str, ExtensionInfo] = {}
"""Every extension registered in this process, by name."""


def wire_name(extension: str, op: str, version: str) -> str:
    """The registry/graph name of an extension op: ``ext.op@version``."""
    return f"{extension}.{op}@{version}"


def parse_wire_name(name: str) -> tuple[str, str, str] | None:
    """``(extension, op, version)`` of an extension op's wire name; None for a built-in."""
    left, at, version = name.rpartition("@")
    if not at:
        return None
    extension, dot, op = left.rpartition(".")
    if not dot or not extension:
        return None
    return extension, op, version


def register_extension(name: str, version: str, doc: str = "") -> ExtensionInfo:
    """Create the registry entry of an extension; each name can be registered once.

    A second registration of the same name (another version, or a module imported twice
    under two names) is refused rather than silently replacing ops that graphs may use.
    """
    if not isinstance(name, str) or not _EXT_NAME.match(name):
        raise ExtensionError(
            f"extension name {name!r} must be lower-case identifiers joined by dots"
        )
    version = str(version)
    if not _VERSION.match(version):
        raise ExtensionError(f"extension {name}: version {version!r} is not a plain version")
    if name in EXTENSIONS:
        have = EXTENSIONS[name].version
        raise ExtensionError(f"extension {name!r} is already registered (version {have})")
    info = EXTENSIONS[name] = ExtensionInfo(name, version, doc)
    return info


def declare_op(info: ExtensionInfo, op: str, **declaration: Any) -> OpDef:
    """Declare one op of an extension in the registry under its wire name.

    Takes the keywords of ``registry.declare`` (arity, attrs, infer, grad, n_outputs, doc).
    """
    if not _OP_NAME.match(op):
        raise ExtensionError(f"extension {info.name}: op name {op!r} must be an identifier")
    if op in info.ops:
        raise ExtensionError(f"extension {info.name}: op {op!r} is declared twice")
    arity = declaration.pop("arity")
    opdef = declare(
        wire_name(info.name, op, info.version),
        f"ext:{info.name}",
        arity,
        version=info.version,
        **declaration,
    )
    info.ops[op] = opdef
    return opdef


def installed_extensions() -> dict[str, str]:
    """Name -> version of every extension registered in this process (sorted by name).

    A server sends this in its Welcome; a client sends its own in Hello.
    """
    return {name: EXTENSIONS[name].version for name in sorted(EXTENSIONS)}


def format_extensions(extensions: Mapping[str, str]) -> str:
    """One line for logs and ``burn-remote serve``: ``fused 1, linalg 1`` or ``none``."""
    return ", ".join(f"{n} {v}" for n, v in sorted(extensions.items())) or "none"


def required_extensions(graph: Graph) -> dict[str, str]:
    """Name -> version of every extension a graph's nodes use."""
    out: dict[str, str] = {}
    for node in graph.nodes:
        parsed = parse_wire_name(node.op)
        if parsed is not None:
            out.setdefault(parsed[0], parsed[2])
    return out


def check_graph_extensions(graph: Graph, available: Mapping[str, str]) -> None:
    """Refuse a graph that uses an extension (or version) missing from `available`.

    Run before ``graph.validate`` on the server (whose `available` is
    ``installed_extensions()``), so the refusal names the extension rather than reporting an
    unknown op; a client may run it against the server's Welcome list to fail before sending.

    Raises:
        ExtensionMissing: naming the extension, the version the graph wants, what is
            available instead, and the first node that needs it.
    """
    for index, node in enumerate(graph.nodes):
        parsed = parse_wire_name(node.op)
        if parsed is None:
            continue
        name, op, version = parsed
        have = available.get(name)
        if have == version:
            continue
        if have is None:
            detail = f"which is not installed here (installed: {format_extensions(available)})"
        else:
            detail = f"but version {have} is installed here"
        raise ExtensionMissing(
            f"graph node {index} uses op {op!r} of extension {name!r} version {version}, "
            f"{detail}; install it on the server (entry-point group {ENTRY_POINT_GROUP!r})",
            name,
            version,
            index,
        )


class ExtensionLoadError(ExtensionError):
    """An entry point of the extensions group failed to import or registered nothing."""


def load_entry_point_extensions(
    group: str = ENTRY_POINT_GROUP, errors: list[str] | None = None
) -> dict[str, str]:
    """Import every extension announced under `group`; return name -> version of those loaded.

    Entry points are named after the extension their import registers; an extension already
    registered in this process (imported directly, or a second call) counts as loaded.

    Args:
        group: the entry-point group (tests use their own).
        errors: when given, a failing entry point is described here and skipped; when None,
            the first failure raises, so a server does not start with half its extensions.

    Raises:
        ExtensionLoadError: naming the entry point, its distribution and the cause.
    """
    loaded: dict[str, str] = {}
    for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
        dist = getattr(ep.dist, "name", None) or "?"
        try:
            obj = ep.load()
            info = EXTENSIONS.get(ep.name)
            if info is None:
                raise ExtensionLoadError(f"its import registered no extension named {ep.name!r}")
            obj_name = getattr(obj, "name", ep.name)
            if isinstance(obj_name, str) and obj_name != ep.name and hasattr(obj, "version"):
                raise ExtensionLoadError(f"it points at extension {obj_name!r}, not {ep.name!r}")
        except Exception as exc:  # an extension's import may fail in any way
            message = (
                f"extension entry point {ep.name!r} = {ep.value!r} (distribution {dist}) "
                f"failed: {type(exc).__name__}: {exc}"
            )
            if errors is None:
                raise ExtensionLoadError(message) from exc
            errors.append(message)
            continue
        loaded[ep.name] = info.version
    return loaded
