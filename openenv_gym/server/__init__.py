"""Serve any Gymnasium env or OpenEnv Environment over the OpenEnv protocol, with a fast path.

- ``/ws`` speaks the stock OpenEnv JSON protocol to every client, and the
  multi-session msgpack protocol ``openenv.msgpack.v1`` (``docs/PROTOCOL.md``)
  to clients that offer it;
- ``GET /health``, ``/schema`` (with the exact Gymnasium spaces under
  ``"x-openenv-gym"``), ``/metadata``.

Entry points: :func:`launch_local` (local server processes for a block of
code), :func:`serve` / :func:`run` (in this process), and the command
``openenv-gym serve ENV_ID``.

Modules: :mod:`.hosts` (what the loops call), :mod:`.gym_host`,
:mod:`.openenv_host`, :mod:`.schema`, :mod:`.values`, :mod:`.runner`
(inline or threads), :mod:`.sessions` (capacity), :mod:`.stock` and
:mod:`.fast` (connection loops), :mod:`.routes` (HTTP), :mod:`.app`,
:mod:`.workers`, :mod:`.launch`, :mod:`.resolve`, :mod:`.security` (bearer
token and TLS).
"""

from .app import SHUTDOWN_CODE, SHUTDOWN_REASON, run, serve
from .context import ServerConfig
from .gym_host import GymHostFactory
from .hosts import Host, HostFactory, StepOutput
from .resolve import resolve_factory
from .security import server_ssl_context

__all__ = [
    "launch_local",
    "LaunchError",
    "serve",
    "run",
    "ServerConfig",
    "HostFactory",
    "Host",
    "StepOutput",
    "GymHostFactory",
    "resolve_factory",
    "server_ssl_context",
    "SHUTDOWN_CODE",
    "SHUTDOWN_REASON",
]


def __getattr__(name: str):
    # OpenEnvHostFactory needs the optional openenv package only when used; the launcher
    # (which needs httpx) only in the process that starts servers.
    if name == "OpenEnvHostFactory":
        from .openenv_host import OpenEnvHostFactory

        return OpenEnvHostFactory
    if name in ("launch_local", "LaunchError"):
        from . import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
