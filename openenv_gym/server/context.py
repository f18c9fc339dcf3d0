"""The server's configuration and the per-process state the connection loops share."""

from __future__ import annotations

import logging
import ssl as ssl_module
from dataclasses import dataclass, field
from typing import Any

from ..config import Limits
from .hosting.hosts import Host, HostFactory
from .hosting.runner import Execution, Runner
from .hosting.sessions import SessionTable
from .net.busy_poll import check_window as check_busy_poll
from .net.security import check_token

__all__ = ["ServerConfig", "ServerContext", "SERVER_LIMITS"]

#: What a server accepts from clients by default. Clients send actions, which
#: are small: 16 MiB frames, 16 MiB arrays and 262,144 lists and maps a
#: message (~25 MB decoded at most; without that bound a frame of hostile
#: empty maps would take ~80x its size in Python objects), and 1,048,576 lists
#: and objects a JSON message (~80 MB).
SERVER_LIMITS = Limits(
    max_frame_bytes=16 * 1024 * 1024, max_array_bytes=16 * 1024 * 1024, max_containers=1 << 18, max_json_containers=1 << 20
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How one server process runs.

    Attributes:
        host: address to bind; loopback unless told otherwise.
        port: TCP port (``0``: any free port).
        max_sessions: sessions this process hosts at once, over both paths.
        limits: frame, array and nesting limits for what clients send
            (``max_frame_bytes`` is the WebSocket message size limit).
        ping_interval: seconds between keepalive pings (``None``: no pings).
        ping_timeout: seconds to wait for a pong before the connection is
            deemed dead and its sessions are closed (``None``: wait forever).
        close_timeout: seconds to wait for a closing handshake (also how long a
            connection whose peer stopped answering pings lingers before its
            sessions are released).
        shutdown_timeout: seconds to wait, on SIGTERM, for connections to close
            and envs to be closed before exiting anyway.
        execution: where env calls run: ``"auto"`` (inline on the event loop
            until env calls take longer than ``thread_threshold`` on average,
            then threads; see :mod:`openenv_gym.server.hosting.runner`), ``"inline"``,
            ``"thread"`` or ``"session"`` (a thread of its own per session, as
            OpenEnv's server runs an env). ``None``: the env kind's default
            (``"session"`` for OpenEnv ``Environment`` classes, ``"auto"`` for
            Gymnasium envs). An env kind that needs one thread for all
            (``REQUIRES_SINGLE_THREAD_EXECUTOR``) gets it whatever this says.
        thread_threshold: seconds, see ``execution``.
        threads: size of the env-call thread pool.
        max_inflight: requests of one fast-path connection processed at once;
            later ones are read ahead and held (up to 1 MiB, pings and pongs
            answered meanwhile), then the server stops reading from that connection.
        max_waiting_bytes: bytes of the frames of one fast-path connection's
            requests that wait for their sessions (each keeps its frame); past
            it, later requests are held as past ``max_inflight``.
        max_held_bytes: bytes of one fast-path connection's requests read ahead
            and held (past ``max_inflight`` or ``max_waiting_bytes``) before the
            server stops reading that connection.
        stock_read_ahead: frames a stock-path connection reads ahead of the
            one being answered (websockets' default is 16, each up to
            ``limits.max_frame_bytes``); its requests are answered one at a time anyway.
        compression: offer permessage-deflate (costs CPU; off by default).
        token: if set, every WebSocket handshake and every ``GET`` but
            ``/health`` must carry ``Authorization: Bearer <token>``; others
            get HTTP 401 (see :mod:`openenv_gym.server.net.security`). Never shown
            in the ``repr``.
        ssl: a server-side TLS context (for example from
            :func:`~openenv_gym.server.net.security.server_ssl_context`): the server
            then speaks ``wss://`` and ``https://`` only.
        mcp_session_timeout: seconds after which a session made by ``POST /mcp``
            (``openenv/session/create``) that nothing used and no WebSocket holds
            is closed.
        max_connections: connections open at once in this process
            (WebSocket and HTTP; with TLS, counted once their TLS handshake is
            done, which websockets bounds in time); one more gets ``503
            Service Unavailable`` and is closed. ``None``: ``2 * max_sessions
            + 64`` (a stock client holds a connection per session). Each
            connection may hold up to ``max_waiting_bytes`` and
            ``max_held_bytes`` of requests, so this bounds their sum.
        max_pending_connections: connections kept open at once that have not
            proven themselves yet (a WebSocket whose handshake, with the bearer
            token, has not passed; an HTTP connection with no request answered
            with it): a new connection takes the place of the oldest of them
            when there are more, or when ``max_connections`` are open, so that
            silent or unauthenticated peers never keep a client with the token
            out. ``None``: half of ``max_connections`` (at least 1).
        fragment_timeout: seconds a fragmented WebSocket message may take
            from its first frame to its last; then the connection is closed
            (1008) and its frames let go of (``None``: no bound). A client
            that starts a message and sends no more would otherwise hold up
            to ``limits.max_frame_bytes`` for as long as it answers pings.
        busy_poll: seconds the event loop polls its sockets before it sleeps,
            after a wait no longer than that (``0``: never polls; see
            :mod:`openenv_gym.server.net.busy_poll`). Up to ~0.5 ms is enough
            for a pool's lockstep steps; it spends CPU that a trainer on the
            same cores may want.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 256
    limits: Limits = field(default_factory=lambda: SERVER_LIMITS)
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    close_timeout: float = 2.0
    shutdown_timeout: float = 5.0
    execution: Execution | None = None
    thread_threshold: float = 0.005
    threads: int = 64
    max_inflight: int = 256
    max_waiting_bytes: int = 8 << 20
    max_held_bytes: int = 1 << 20
    stock_read_ahead: int = 2
    compression: bool = False
    token: str | None = field(default=None, repr=False)
    ssl: ssl_module.SSLContext | None = None
    mcp_session_timeout: float = 600.0
    max_connections: int | None = None
    max_pending_connections: int | None = None
    fragment_timeout: float | None = 10.0
    busy_poll: float = 0.0

    @property
    def pending_limit(self) -> int:
        """``max_pending_connections``, or its default: half of :attr:`connection_limit`."""
        return self.max_pending_connections if self.max_pending_connections is not None else max(1, self.connection_limit // 2)

    @property
    def connection_limit(self) -> int:
        """``max_connections``, or its default ``2 * max_sessions + 64``."""
        return self.max_connections if self.max_connections is not None else 2 * self.max_sessions + 64

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.fragment_timeout is not None and not self.fragment_timeout > 0:
            raise ValueError(f"fragment_timeout must be > 0 or None, got {self.fragment_timeout}")
        if self.max_pending_connections is not None and self.max_pending_connections < 1:
            raise ValueError(f"max_pending_connections must be >= 1, got {self.max_pending_connections}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not self.mcp_session_timeout > 0:
            raise ValueError(f"mcp_session_timeout must be > 0, got {self.mcp_session_timeout}")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.max_waiting_bytes < 1:
            raise ValueError(f"max_waiting_bytes must be >= 1, got {self.max_waiting_bytes}")
        if self.max_held_bytes < 1:
            raise ValueError(f"max_held_bytes must be >= 1, got {self.max_held_bytes}")
        if self.busy_poll != 0:
            check_busy_poll(self.busy_poll)
        if self.stock_read_ahead < 1:
            raise ValueError(f"stock_read_ahead must be >= 1, got {self.stock_read_ahead}")
        if self.token is not None:
            check_token(self.token)
        if self.ssl is not None and (
            not isinstance(self.ssl, ssl_module.SSLContext) or self.ssl.protocol == ssl_module.PROTOCOL_TLS_CLIENT
        ):
            raise ValueError("ssl must be a server-side ssl.SSLContext, for example server_ssl_context(certfile, keyfile)")


class ServerContext:
    """What the connection loops of one process share.

    Attributes:
        config: the :class:`ServerConfig`.
        factory: makes a host per session.
        table: the session count against ``config.max_sessions``.
        runner: runs env calls (reset, step, close).
        make_runner: runs env construction (timed separately: building an env is
            often slow even when its steps are cheap).
    """

    #: the ``POST /mcp`` service (:class:`~openenv_gym.server.wire.mcp_http.McpService`), set by the server
    mcp: Any = None

    def __init__(self, factory: HostFactory, config: ServerConfig) -> None:
        self.config = config
        self.factory = factory
        self.table = SessionTable(config.max_sessions)
        mode = factory.execution or config.execution or factory.default_execution or "auto"
        threads = factory.threads or config.threads
        self.runner = Runner(f"{factory.name} env calls", mode=mode, threshold=config.thread_threshold, threads=threads)
        if factory.threads == 1:
            self.make_runner = self.runner  # the same single thread for everything
        else:
            self.make_runner = Runner(f"{factory.name} env construction", mode=mode, threshold=config.thread_threshold, threads=threads)

    async def make_host(self) -> Host:
        """A new host for a session (the caller has reserved its slot)."""
        if self.runner.mode == "session":
            host = await self.runner.open_session(self.factory.make)
        else:
            host = await self.make_runner.call(self.factory.make)
        host.limits = self.config.limits  # (what its parse_action may accept)
        try:
            await host.open_async()
        except BaseException:
            await self.close_host(host)
            raise
        return host

    async def close_host(self, host: Host) -> None:
        """Close a host; errors are logged, never raised."""
        try:
            await host.close_async()
            await self.runner.call(host.close)
        except Exception:
            logger.exception("closing a %s env failed", self.factory.name)
        finally:
            self.runner.end_session(host)

    def shutdown(self) -> None:
        """Stop the thread pools (without waiting for calls still running)."""
        self.runner.shutdown()
        self.make_runner.shutdown()
