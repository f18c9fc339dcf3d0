"""Clients the tests talk to real servers with, below the pool."""

from __future__ import annotations

from openenv_gym.client import FastConnection, open_transport
from openenv_gym.config import Limits, Timeouts

__all__ = ["fast_connection"]


async def fast_connection(url: str, step_timeout: float = 20.0) -> FastConnection:
    """A fast-path connection to the server at ``url`` (which must negotiate msgpack); replies awaited ``step_timeout`` s at most."""
    transport = await open_transport(url, timeouts=Timeouts(), limits=Limits())
    assert transport.codec == "msgpack"
    return FastConnection(transport, timeouts=Timeouts(step=step_timeout), limits=Limits())
