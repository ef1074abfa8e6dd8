"""protocol/OPS.md is the op registry, written out: regenerate it when an op changes."""

from __future__ import annotations

from pathlib import Path

from burn_remote.protocol import opref
from burn_remote.protocol.extensions import parse_wire_name
from burn_remote.protocol.registry import OPS

PAGE = Path(__file__).resolve().parents[2] / "protocol" / "OPS.md"


def test_the_op_reference_matches_the_registry() -> None:
    assert PAGE.read_text() == opref.render(), (
        "protocol/OPS.md is stale: run `python -m burn_remote.protocol.opref > protocol/OPS.md`"
    )


def test_the_reference_is_the_core_registry_whatever_extensions_are_loaded() -> None:
    import burn_remote.fused  # noqa: F401  (extensions add ops to the same registry)
    import burn_remote.linalg  # noqa: F401
    import burn_remote.signal  # noqa: F401

    assert PAGE.read_text() == opref.render()


def test_every_primitive_op_and_attribute_is_in_the_reference() -> None:
    text = PAGE.read_text()
    for op in OPS.values():
        if op.primitive and parse_wire_name(op.name) is None:
            assert f"### `{op.name}`" in text
            for attr in op.attrs:
                assert f"| `{attr}` |" in text
