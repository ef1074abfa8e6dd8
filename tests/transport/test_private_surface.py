"""The private names of aioquic and qh3 that protocol/transport/ still uses, and where.

Authentication uses none: its modules import neither engine, and the drivers' steps that
run it touch nothing private and swap no class (``AUTH_PATH``). What the rest uses is listed
here (``INVENTORY``), so a new use of a library's private name fails this test until it is
added to the list on purpose. The scan is mechanical: every ``x._name`` attribute, ``_name``
import and ``__class__`` assignment in the package whose name one of the two libraries
defines and the file itself does not."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "protocol" / "transport"

AUTH_MODULES = ("_auth.py", "_identity.py", "_authorized.py")
"""Modules that authenticate peers: they import neither QUIC engine."""
AUTH_PATH = {
    "_connection.py": ("_authenticate", "_feed_auth", "_refuse", "_run_legacy"),
    "_blocking.py": ("_feed_auth",),
}
"""The drivers' functions that run authentication (``_auth.PeerAuth``)."""

INVENTORY: dict[str, set[str]] = {
    "_blocking.py": set(),
    "_connection.py": set(),
    "_endpoint.py": set(),
    "_qh3.py": {
        "__class__",  # _SizedQuic: qh3's TLS bridge, to advertise the datagram size
        "_core",
        "_create_tls",
        "_handshake_confirmed",
        "_hazmat",
        "_open_stream",
    },
    "_qh3_server.py": {
        "_close_event",
        "_core",
        "_create_core",  # _ValidatedQuic: the anti-amplification budget (its doc)
        "_handshake_complete",
        "_handshake_confirmed",
        "_open_stream",
        "_retry_source_connection_id",
    },
    "_quic.py": {  # the adapter's needs, speed aside: windows, back-pressure, what is due
        "_buffer_fin",
        "_buffer_start",
        "_buffer_stop",
        "_close_pending",
        "_get_or_create_stream_for_send",
        "_handshake_confirmed",
        "_handshake_done_pending",
        "_is_client",
        "_local_max_data",
        "_local_max_streams_bidi",
        "_local_max_streams_uni",
        "_on_connection_limit_delivery",
        "_on_max_stream_data_delivery",
        "_reset_error_code",
        "_spaces",
        "_streams",
        "_write_connection_limits",
        "_write_stream_limits",
    },
    "_quic_fast.py": set(),  # every name its import-time conformance check covers (below)
}
"""File -> the library private names it uses (``__class__`` marks a class swap)."""


def _library_names(package: str) -> set[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return set()
    names: set[str] = set()
    for path in Path(spec.origin).parent.rglob("*.py*"):
        names.update(re.findall(r"\b(_[a-z][a-z0-9_]*)\b", path.read_text(errors="replace")))
    return names


LIBRARY = _library_names("aioquic") | _library_names("qh3")
LIBRARY_CLASSES = {
    "QuicConnection",
    "QuicPacketPacer",
    "QuicPacketBuilder",
    "CryptoContext",
    "QuicTlsBridge",
}
"""The library classes the adapters subclass."""
OVERRIDE_MIXINS = {"FastPaths"}
"""Mixins put in front of a library class (``_quic_fast``): their methods override its."""


def _driver_names() -> set[str]:
    own: set[str] = set()
    for path in ROOT.glob("*.py"):
        if path.name not in ADAPTERS:
            own |= _own_names(ast.parse(path.read_text()))
    return own


ADAPTERS = ("_quic.py", "_qh3.py", "_qh3_server.py")
"""The engine adapters: what they define may stand in for a library's private name (qh3's
``_close_pending`` property mirrors aioquic's), so only the drivers' names count as ours
across files."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name in LIBRARY


class _Definitions(ast.NodeVisitor):
    """Private names a file defines itself: functions, classes, attributes it assigns. In a
    subclass of a library class, a method or ``self`` attribute with a library's private
    name is the library's (an override, or its state set), not the file's own."""

    def __init__(self) -> None:
        self.own: set[str] = set()
        self.in_library_class = False

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.own.add(node.name)
        outer = self.in_library_class
        self.in_library_class = node.name in OVERRIDE_MIXINS or any(
            isinstance(b, ast.Name) and b.id in LIBRARY_CLASSES for b in node.bases
        )
        self.generic_visit(node)
        self.in_library_class = outer

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if not (self.in_library_class and _is_private(node.name)):
            self.own.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Attribute(self, node: ast.Attribute) -> None:
        mine = isinstance(node.value, ast.Name) and node.value.id == "self"
        library = self.in_library_class and _is_private(node.attr)
        if mine and isinstance(node.ctx, ast.Store) and not library:
            self.own.add(node.attr)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.own.add(node.id)


def _own_names(tree: ast.AST) -> set[str]:
    defs = _Definitions()
    defs.visit(tree)
    return defs.own


def private_uses(tree: ast.AST, drivers: set[str] = frozenset()) -> set[str]:
    """Library private names used in ``tree`` (``__class__``: a class swap), overrides of
    library private methods included; ``drivers``: names the drivers define (ours)."""
    own = _own_names(tree) | drivers
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = node.name
        elif isinstance(node, ast.Attribute):
            if node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                used.add("__class__")
            name = node.attr
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "aioquic",
            "qh3",
        ):
            parts = [*(node.module or "").split("."), *(a.name for a in node.names)]
            used.update(p for p in parts if p.startswith("_") and not p.startswith("__"))
            continue
        else:
            continue
        if _is_private(name) and name not in own:
            used.add(name)
    return used


def _tree(name: str) -> ast.Module:
    return ast.parse((ROOT / name).read_text(), filename=name)


def test_authentication_uses_no_private_name_and_no_class_swap() -> None:
    for name in AUTH_MODULES:
        tree = _tree(name)
        imports = {
            (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
        } | {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        assert not imports & {"aioquic", "qh3"}, f"{name} imports a QUIC engine"
        assert private_uses(tree) == set(), name
    for name, functions in AUTH_PATH.items():
        tree = _tree(name)
        found = {
            node.name: node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in functions
        }
        assert set(found) == set(functions), f"{name}: {set(functions) - set(found)} moved"
        for fn, node in found.items():
            assert private_uses(node) - _own_names(tree) == set(), f"{name}:{fn}"


def test_the_private_names_still_used_are_the_listed_ones() -> None:
    """Prints the inventory (``pytest -s``); fails on a use the list does not have."""
    unlisted = {}
    for path in sorted(ROOT.glob("*.py")):
        tree = _tree(path.name)
        used = private_uses(tree, set() if path.name in ADAPTERS else _driver_names())
        print(f"{path.name}: {', '.join(sorted(used)) or '-'}")
        if path.name == "_quic_fast.py":
            continue  # test_the_conformance_check_covers_every_private_name_of_the_overrides
        extra = used - INVENTORY.get(path.name, set())
        if extra:
            unlisted[path.name] = sorted(extra)
    assert unlisted == {}, f"new private names of aioquic/qh3: {unlisted}"


@pytest.mark.parametrize("name", AUTH_MODULES)
def test_the_scan_sees_a_private_name(name: str) -> None:
    """The scan itself: a private aioquic name and a class swap are found."""
    tree = ast.parse("def f(quic):\n    quic._loss._pacer.__class__ = object\n")
    assert private_uses(tree) == {"_loss", "_pacer", "__class__"}


def test_the_conformance_check_covers_every_private_name_of_the_overrides() -> None:
    """``_quic_fast`` checks at import every private name its overrides use (methods with
    their signatures, attributes on fresh objects), so a changed aioquic falls back to stock
    mode instead of failing inside a build."""
    from burn_remote.protocol.transport import _quic_fast

    checked = {name for _, name in _quic_fast.OVERRIDDEN}
    checked |= {name for names in _quic_fast.ATTRIBUTES.values() for name in names}
    checked |= {"__class__", "_mask"}
    used = private_uses(_tree("_quic_fast.py"))
    assert used - checked == set()
    assert _quic_fast.surface_problems() == []  # this aioquic fits them
