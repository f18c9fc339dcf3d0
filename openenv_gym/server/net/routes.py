"""Plain HTTP on the WebSocket port: ``GET /health``, ``/schema``, ``/metadata``.

Answered from ``process_request`` before any WebSocket handshake, with JSON
bodies as stock OpenEnv servers send them. A WebSocket upgrade to ``/ws``
goes on to the handshake; anything else gets a 404 JSON body, and another
method than ``GET`` on these paths a 405, as from the stock server.

With a bearer token, every request but those to ``/health`` must carry it, or gets
401 with ``WWW-Authenticate: Bearer`` and ``{"detail": "missing or wrong
bearer token"}``; unknown paths get the 401 too, so an unauthenticated client
learns nothing about the routes.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, Callable

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .security import UNAUTHORIZED_DETAIL, BearerToken

__all__ = ["MCP_PATH", "WS_PATH", "Routes", "json_body", "route_path"]

logger = logging.getLogger(__name__)

WS_PATH = "/ws"
#: MCP's JSON-RPC endpoint (``POST`` only; answered by the HTTP exchange, :mod:`openenv_gym.server.net.connection`).
MCP_PATH = "/mcp"


def route_path(target: str) -> str:
    """The path of a request target that the routes go by: no query or fragment, no trailing ``/``."""
    return target.split("?", 1)[0].split("#", 1)[0].rstrip("/") or "/"


def json_body(value: Any) -> bytes:
    """Compact UTF-8 JSON; raises ``ValueError`` on non-finite floats."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _response(status: HTTPStatus, body: bytes, *extra: tuple[str, str]) -> Response:
    headers = Headers(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *extra,
        ]
    )
    return Response(status.value, status.phrase, headers, body)


_NOT_ALLOWED = json_body({"detail": "Method Not Allowed"})


class Routes:
    """The HTTP endpoints, with bodies encoded once.

    Args:
        schema: the ``/schema`` body.
        metadata: the ``/metadata`` body.
        capacity: returns ``(active_sessions, max_sessions)`` of this process;
            ``/health`` reports them next to the stock ``{"status": "healthy"}``
            so that clients can place sessions by free capacity.
        token: the bearer token every request but ``GET /health`` must carry
            (``None``: no token).
    """

    def __init__(
        self,
        schema: dict[str, Any],
        metadata: dict[str, Any],
        capacity: Callable[[], tuple[int, int]] | None = None,
        *,
        token: str | None = None,
    ) -> None:
        self._capacity = capacity
        self._token = BearerToken(token) if token is not None else None
        self._unauthorized = json_body({"detail": UNAUTHORIZED_DETAIL})
        self._bodies = {
            "/health": json_body({"status": "healthy"}),
            "/schema": json_body(schema),
            "/metadata": json_body(metadata),
        }

    @property
    def bearer(self) -> BearerToken | None:
        """The token requests must carry, or ``None``."""
        return self._token

    def _health(self) -> bytes:
        if self._capacity is None:
            return self._bodies["/health"]
        active, most = self._capacity()
        return json_body({"status": "healthy", "active_sessions": active, "max_sessions": most})

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        """``process_request`` for ``websockets.asyncio.server.serve``."""
        # (websockets before 14 read GET requests only, and its Request had no method)
        return self.answer(connection, request.path, request.headers, getattr(request, "method", "GET"))

    def answer(self, connection: Any, target: str, headers: Headers, method: str = "GET") -> Response | None:
        """The response to ``method target``, or ``None`` for a WebSocket upgrade to :data:`WS_PATH`.

        The routes are ``GET`` only, as the stock server's: another method
        gets 405 (``Allow: GET``) on them, 404 elsewhere (whoever answers a
        ``HEAD`` sends the headers alone). ``connection`` is for logs (its
        ``remote_address``).
        """
        path = route_path(target)
        upgrade = headers.get("Upgrade", "").lower() == "websocket"
        health = path == "/health" and not upgrade
        get = method == "GET"
        if health and get:
            return _response(HTTPStatus.OK, self._health())
        if not health and self._token is not None and not self._token.admits(headers):
            logger.info("refused %.100s from %s: %s", path, getattr(connection, "remote_address", None), UNAUTHORIZED_DETAIL)
            return _response(HTTPStatus.UNAUTHORIZED, self._unauthorized, ("WWW-Authenticate", "Bearer"))
        if path == MCP_PATH:  # (a POST /mcp goes to the exchange's MCP service, not here)
            return _response(HTTPStatus.METHOD_NOT_ALLOWED, _NOT_ALLOWED, ("Allow", "POST"))
        if not get:
            if path in self._bodies or path == WS_PATH:
                return _response(HTTPStatus.METHOD_NOT_ALLOWED, _NOT_ALLOWED, ("Allow", "GET"))
            return _response(HTTPStatus.NOT_FOUND, json_body({"detail": "Not Found"}))
        if path == WS_PATH and upgrade:
            return None
        body = None if upgrade else self._bodies.get(path)
        if body is not None:
            return _response(HTTPStatus.OK, body)
        if path == WS_PATH:
            return _response(HTTPStatus.UPGRADE_REQUIRED, json_body({"detail": "/ws needs a WebSocket upgrade"}))
        return _response(HTTPStatus.NOT_FOUND, json_body({"detail": "Not Found"}))
