"""The server: a ``websockets`` asyncio server speaking both protocols on ``/ws``.

A client that offers the subprotocol ``openenv.msgpack.v1`` gets the fast path
(:mod:`.wire.fast_loop`); every other client gets the stock OpenEnv JSON protocol
(:mod:`.wire.stock_loop`). ``GET /health``, ``/schema`` and ``/metadata`` are answered
on the same port (:mod:`.net.routes`), and so is MCP's ``POST /mcp``
(:mod:`.wire.mcp_http`, through :mod:`.net.connection`). With ``config.token`` set, every request
but ``GET /health`` needs ``Authorization: Bearer <token>``; with
``config.ssl`` set, the port speaks TLS (``wss://``, ``https://``); see
:mod:`.net.security`.

On SIGTERM or SIGINT (or when ``stop`` is set) the server stops accepting,
closes every connection with code 1001 and reason ``"server shutting down"``,
waits (at most ``shutdown_timeout`` seconds) for the connection loops to
close their envs, and returns.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
from typing import Any, Callable, Sequence

from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.typing import Subprotocol

from .._reads import read_in_chunks
from ..protocol.multiplex import SUBPROTOCOL
from .context import ServerConfig, ServerContext
from .hosting.hosts import HostFactory
from .net.busy_poll import loop_factory
from .net.connection import Connection, ConnectionGate, HttpExchange, connection_factory
from .net.routes import Routes
from .wire.fast_loop import serve_fast
from .wire.mcp_http import McpService
from .wire.stock_loop import serve_stock

__all__ = ["serve", "run", "SHUTDOWN_CODE", "SHUTDOWN_REASON"]

logger = logging.getLogger(__name__)

SHUTDOWN_CODE = 1001
SHUTDOWN_REASON = "server shutting down"

#: Seconds a kept-alive POST connection may stay silent (and a request may take to arrive whole).
_HTTP_IDLE_TIMEOUT = 30.0


def _base_url(scheme: str, sockname: tuple | str) -> str:
    if isinstance(sockname, str):  # a Unix socket
        return f"unix:{sockname}"
    host, port = sockname[:2]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _select_subprotocol(connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    # Stock clients offer nothing and get the stock protocol; never refuse a handshake.
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


async def serve(
    factory: HostFactory,
    config: ServerConfig | None = None,
    *,
    sock: socket.socket | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
    on_ready: Callable[[list[str]], None] | None = None,
    after_close: Callable[[], None] | None = None,
) -> None:
    """Serve ``factory``'s env until SIGTERM/SIGINT or ``stop`` is set.

    Args:
        factory: what to host.
        config: host, port, limits, ... (defaults: :class:`ServerConfig`).
        sock: an already bound listening socket to serve on instead of
            ``config.host``/``config.port`` (used by ``--workers``).
        stop: an event that ends the server when set.
        handle_signals: install SIGTERM/SIGINT handlers that set ``stop``.
        on_ready: called with the base URLs (``http://host:port``, or
            ``https://host:port`` with TLS, or ``unix:PATH``) once listening.
        after_close: called on shutdown once the server no longer listens,
            before open connections are closed (a Unix socket's
            :meth:`~openenv_gym.server.net.unix.UnixListener.release`).

    Raises:
        OSError: the address cannot be bound.
        Exception: whatever ``factory.schema()`` / ``factory.metadata()`` raise.
    """
    config = config or ServerConfig()
    ctx = ServerContext(factory, config)
    routes = Routes(
        factory.schema(),
        factory.metadata(),
        lambda: (ctx.table.active, ctx.table.max_sessions),
        token=config.token,
    )
    stop = stop or asyncio.Event()
    mcp = ctx.mcp = McpService(ctx, idle_timeout=config.mcp_session_timeout)
    server = await _listen(ctx, routes, mcp, sock)
    loop = asyncio.get_running_loop()
    installed = _handle_signals(loop, stop) if handle_signals else []
    names = [s.getsockname() for s in server.sockets]
    try:
        urls = _announce(factory.name, config, names)
        if on_ready is not None:
            on_ready(urls)
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        logger.info("shutting down: closing %d connections", len(server.connections))
        server.close(close_connections=True, code=SHUTDOWN_CODE, reason=SHUTDOWN_REASON)
        if after_close is not None:
            after_close()
        try:
            async with asyncio.timeout(config.shutdown_timeout):
                await mcp.close()
                await server.wait_closed()
        except TimeoutError:
            logger.warning("connections still open after %.1f s; exiting anyway", config.shutdown_timeout)
        ctx.shutdown()
        logger.info("server stopped")


async def _listen(ctx: ServerContext, routes: Routes, mcp: McpService, sock: socket.socket | None) -> Server:
    """Listen on ``sock``, else on ``config.host``/``config.port``: each WebSocket to the protocol it chose, HTTP to ``routes`` and ``mcp``."""
    config = ctx.config
    connection_class = connection_factory(
        lambda connection: HttpExchange(connection, mcp, routes, config.limits.max_frame_bytes, _HTTP_IDLE_TIMEOUT),
        gate=ConnectionGate(config.connection_limit, config.pending_limit),
        fragment_timeout=config.fragment_timeout,
    )

    async def handler(ws: ServerConnection) -> None:
        if isinstance(ws, Connection):  # (its handshake passed, token and all: never dropped for a newcomer)
            ws.prove()
        read_in_chunks(ws.transport)
        if ws.subprotocol == SUBPROTOCOL:
            await serve_fast(ws, ctx)
        else:
            await serve_stock(ws, ctx)

    options: dict[str, Any] = dict(
        process_request=routes,
        select_subprotocol=_select_subprotocol,
        max_size=config.limits.max_frame_bytes,
        max_queue=config.stock_read_ahead,
        ping_interval=config.ping_interval,
        ping_timeout=config.ping_timeout,
        close_timeout=config.close_timeout,
        compression="deflate" if config.compression else None,
        server_header="openenv-gym",
        ssl=config.ssl,  # websockets bounds the TLS handshake by its open_timeout (10 s)
        create_connection=connection_class,  # (POST /mcp beside websockets' GET)
    )
    if sock is not None:
        return await ws_serve(handler, sock=sock, **options)
    return await ws_serve(handler, config.host, config.port, **options)


def _handle_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> list[signal.Signals]:
    """Set ``stop`` on SIGTERM and SIGINT; the signals whose handlers were installed."""
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread / Windows
            pass
    return installed


def _announce(name: str, config: ServerConfig, socknames: list[Any]) -> list[str]:
    """Log where the server listens (and a warning if it is open beyond loopback with no token); its base URLs."""
    scheme = "https" if config.ssl is not None else "http"
    urls = [_base_url(scheme, sockname) for sockname in socknames]
    logger.info(
        "serving %s on %s (max %d sessions; bearer token %s)",
        name,
        ", ".join(urls),
        config.max_sessions,
        "required" if config.token is not None else "not required",
    )
    if config.token is None and not all(isinstance(sockname, str) or _is_loopback(sockname[0]) for sockname in socknames):
        logger.warning("listening beyond loopback without a bearer token: anyone who reaches %s can run envs here", ", ".join(urls))
    return urls


def run(
    factory: HostFactory,
    config: ServerConfig | None = None,
    *,
    sock: socket.socket | None = None,
    after_close: Callable[[], None] | None = None,
) -> None:
    """Run :func:`serve` in a new event loop (one that busy-polls with ``config.busy_poll``) until SIGTERM/SIGINT."""
    loops = loop_factory((config or ServerConfig()).busy_poll)
    try:
        with asyncio.Runner(loop_factory=loops) as runner:
            runner.run(serve(factory, config, sock=sock, after_close=after_close))
    finally:
        for selector in loops.selectors if loops is not None else ():
            logger.info(
                "busy polling (%.0f us): %d waits found a request by polling, %d slept, %d polls cut short by other processes",
                selector.window * 1e6,
                selector.polled,
                selector.slept,
                selector.yielded,
            )
