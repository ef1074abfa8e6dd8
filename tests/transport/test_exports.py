"""The public surface: every name in ``__all__`` exists, and nothing private leaks."""

from __future__ import annotations

import burn_remote.protocol.transport as transport


def test_all_names_exported_once_and_defined():
    assert len(set(transport.__all__)) == len(transport.__all__)
    for name in transport.__all__:
        assert hasattr(transport, name), name
        assert not name.startswith("_")


def test_public_classes_come_from_private_modules():
    for name in ["Endpoint", "Connection", "FrameStream", "Identity", "PeerId"]:
        module = getattr(transport, name).__module__
        assert module.startswith("burn_remote.protocol.transport._"), module
