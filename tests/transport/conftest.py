"""Shared helpers: real-UDP endpoint pairs on loopback, run under trio."""

from __future__ import annotations

import dataclasses
import functools
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import trio
from burn_remote.protocol.transport import BlockingConnection, Endpoint, EndpointConfig, Identity


def trio_test(fn):
    """Run an ``async def`` test under ``trio.run`` (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


SERVER_ENGINES = ("aioquic", "qh3")
"""The QUIC engines a serving endpoint runs on (qh3 is the optional ``qh3`` extra)."""

SERVER_ENGINE: dict[str, str | None] = {"name": None}
"""The engine ``serving`` gives its server while the ``server_engine`` fixture runs (None:
the server config's own)."""


@pytest.fixture(params=SERVER_ENGINES)
def server_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test once per server engine: what every server-side guarantee is tested with."""
    if request.param == "qh3":
        pytest.importorskip("qh3")
    SERVER_ENGINE["name"] = request.param
    yield request.param
    SERVER_ENGINE["name"] = None


def with_server_engine(config: EndpointConfig | None = None) -> EndpointConfig:
    """``config`` (or the defaults) with the engine of the running ``server_engine``."""
    config = config or EndpointConfig()
    engine = SERVER_ENGINE["name"]
    return config if engine is None else dataclasses.replace(config, quic_engine=engine)


@asynccontextmanager
async def serving(
    handler, *, server_config=None, client_config=None, refuse_legacy=None, **server_kwargs
):
    """A serving endpoint (on ``SERVER_ENGINE``) and a client endpoint (authorised unless
    told otherwise)."""
    server_id, client_id = Identity.generate(), Identity.generate()
    server_kwargs.setdefault("authorized_peers", {client_id.peer_id})
    config = with_server_engine(server_config)
    async with (
        Endpoint.open(server_id, config=config, **server_kwargs) as srv,
        Endpoint.open(client_id, config=client_config or EndpointConfig()) as cli,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(functools.partial(srv.serve, handler, refuse_legacy=refuse_legacy))
        await trio.sleep(0)
        yield srv, cli
        nursery.cancel_scope.cancel()


@pytest.fixture
def identities():
    return Identity.generate(), Identity.generate()


def has_ipv6_loopback() -> bool:
    """Whether this host can bind ::1 (some containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


FREE_WAIT = 20.0
"""Seconds a test waits for finished streams to leave aioquic's table. They leave only once
the peer acknowledged our end of them and a later packet is built: on a loaded machine the
acknowledgement can take far longer than the peer's ACK delay (a fixed 0.1 s sleep
here failed under load). A stream never ended from our side never leaves: that fails."""


def streams_left(conn: BlockingConnection, keep: int, send: Callable[[], None]) -> list[int]:
    """The streams ``conn``'s QUIC still holds once only ``keep`` is left, or at FREE_WAIT.
    ``send`` makes a round trip on ``keep``: aioquic drops finished streams when it builds a
    packet, so each one is a chance for the acknowledged ones to go."""
    deadline = time.monotonic() + FREE_WAIT
    while True:
        send()
        with conn._lock:  # the reader thread changes the table
            left = sorted(conn._quic._streams)
        if left == [keep] or time.monotonic() > deadline:
            return left
        time.sleep(0.01)
