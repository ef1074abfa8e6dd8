"""Fault tests reuse the remote suite's server fixture (a real `burn-remote serve`)."""

from remote.conftest import client_home, server, spawn  # noqa: F401  (fixtures)
