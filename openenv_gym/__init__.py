"""openenv_gym: remote OpenEnv environments as Gymnasium environments.

Public API:

- :class:`OpenEnvEnv`: a ``gymnasium.Env`` driving one remote OpenEnv session.
- :class:`OpenEnvVectorEnv`: a ``gymnasium.vector.VectorEnv`` over many sessions
  on many servers, with EnvPool-style ``send``/``recv``.
- :func:`register_remote`: give a remote environment a ``gymnasium.make`` id;
  ``openenv_gym/Remote-v0`` is registered on import.
- :func:`launch_local`: local server processes for a block of code (the
  embedded default of the quickstart, tests and benchmarks).
- :class:`Session`: the asyncio client of one session.
- :func:`list_tools`: the tools of an MCP environment (:class:`Tool`).
- :class:`Timeouts`, :class:`Limits`: options shared by client and server.
- The exceptions, all subclasses of :class:`OpenEnvGymError`.

Optional: :mod:`openenv_gym.sb3` (``SB3VecEnv``, a pool as a Stable-Baselines3
``VecEnv``; needs the ``sb3`` extra), imported by name, not from here.
"""

from typing import TYPE_CHECKING, Any

from .bench_envs import register_bench_envs
from .config import Limits, Timeouts
from .errors import (
    CapacityError,
    ConnectError,
    ConnectionLost,
    LimitExceeded,
    OpenEnvGymError,
    PoolUnavailable,
    ProtocolError,
    ServerError,
    SessionTimeout,
)
from .registration import REMOTE_ID, _register_builtin, register_remote
from .spaces import BoundedSequence, JsonText, SpaceMappingError, UnboundedInteger, UnicodeText, UnsizedSequence

if TYPE_CHECKING:
    from .client import Session
    from .env import OpenEnvEnv
    from .launch import LaunchError, launch_local
    from .remote import Tool, list_tools
    from .vector import OpenEnvVectorEnv

# The client side (httpx, the WebSocket client, the envs) loads on first use, so that a
# server process, which never uses it, starts without it.
_LAZY = {
    "OpenEnvEnv": ".env",
    "OpenEnvVectorEnv": ".vector",
    "Session": ".client",
    "launch_local": ".launch",
    "LaunchError": ".launch",
    "Tool": ".remote",
    "list_tools": ".remote",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "OpenEnvEnv",
    "OpenEnvVectorEnv",
    "register_remote",
    "REMOTE_ID",
    "launch_local",
    "LaunchError",
    "Session",
    "Timeouts",
    "Limits",
    "OpenEnvGymError",
    "ProtocolError",
    "LimitExceeded",
    "ConnectError",
    "ConnectionLost",
    "SessionTimeout",
    "ServerError",
    "CapacityError",
    "PoolUnavailable",
    "SpaceMappingError",
    "UnicodeText",
    "JsonText",
    "BoundedSequence",
    "UnboundedInteger",
    "UnsizedSequence",
    "Tool",
    "list_tools",
]

_register_builtin()
register_bench_envs()
