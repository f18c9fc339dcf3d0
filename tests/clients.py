"""Clients the tests talk to real servers with, below the pool."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable

from openenv_gym.client import FastConnection, open_socket
from openenv_gym.config import Limits, Timeouts

__all__ = ["fast_connection", "run"]


async def fast_connection(url: str, step_timeout: float = 20.0) -> FastConnection:
    """A fast-path connection to the server at ``url`` (which must negotiate msgpack); replies awaited ``step_timeout`` s at most."""
    transport = await open_socket(url, timeouts=Timeouts(), limits=Limits())
    assert transport.codec == "msgpack"
    return FastConnection(transport, timeouts=Timeouts(step=step_timeout), limits=Limits())


def run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    """Run ``coro`` in a fresh event loop; :class:`TimeoutError` after ``timeout`` seconds, so that a bug fails instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
