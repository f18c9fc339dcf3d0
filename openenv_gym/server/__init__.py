"""Serve any Gymnasium env or OpenEnv Environment over the OpenEnv protocol, with a fast path.

- ``/ws`` speaks the stock OpenEnv JSON protocol to every client, and the
  multi-session msgpack protocol ``openenv.msgpack.v1`` (``docs/PROTOCOL.md``)
  to clients that offer it;
- ``GET /health``, ``/schema`` (with the exact Gymnasium spaces under
  ``"x-openenv-gym"``), ``/metadata``.

Entry points: :func:`serve` / :func:`run` (in this process), and the command
``openenv-gym serve ENV_ID``; :func:`openenv_gym.launch_local` starts local
server processes for a block of code (client side: :mod:`openenv_gym.launch`;
``openenv_gym.server.launch_local`` still names it).

Subpackages, by job:

- :mod:`.hosting`: what is hosted, with no sockets: :mod:`.hosting.hosts`
  (what the loops call), :mod:`.hosting.gym_host`, :mod:`.hosting.openenv_host`,
  :mod:`.hosting.resolve`, :mod:`.hosting.runner` (inline or threads),
  :mod:`.hosting.sessions` (capacity), :mod:`.hosting.values`,
  :mod:`.hosting.schema`, :mod:`.hosting.openenv_app` (the stock OpenEnv server);
- :mod:`.wire`: what is said on a connection: :mod:`.wire.fast_loop` and
  :mod:`.wire.stock_loop` (the connection loops), :mod:`.wire.framing`,
  :mod:`.wire.mcp_http`;
- :mod:`.net`: the port and the processes: :mod:`.net.connection`,
  :mod:`.net.http1`, :mod:`.net.routes` (HTTP), :mod:`.net.security` (bearer
  token and TLS), :mod:`.net.unix`, :mod:`.net.workers`, :mod:`.net.busy_poll`.

:mod:`.app` puts them together; :mod:`.context` holds the server's
configuration and the state its loops share.
"""

from .app import SHUTDOWN_CODE, SHUTDOWN_REASON, run, serve
from .context import ServerConfig
from .hosting.gym_host import GymHostFactory
from .hosting.hosts import Host, HostFactory, StepOutput
from .hosting.resolve import resolve_factory
from .net.security import server_ssl_context

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
    # OpenEnvHostFactory needs the optional openenv package only when used. launch_local and
    # LaunchError live in openenv_gym.launch (client side, needs httpx); they are still named
    # here, where they were documented before, and loaded only in the process that starts servers.
    if name == "OpenEnvHostFactory":
        from .hosting.openenv_host import OpenEnvHostFactory

        return OpenEnvHostFactory
    if name in ("launch_local", "LaunchError"):
        from .. import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
