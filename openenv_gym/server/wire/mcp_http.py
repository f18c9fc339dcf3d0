"""``POST /mcp``: OpenEnv's MCP JSON-RPC endpoint, and the sessions it creates.

OpenEnv 0.10.0's ``MCPToolClient`` runs in "production" mode only: it creates
a session with ``openenv/session/create``, lists and calls the env's tools
with ``tools/list`` and ``tools/call`` (each naming the session), attaches a
WebSocket to the same session with ``/ws?session_id=...`` for reset/step, and
closes it with ``openenv/session/close``. :class:`McpService` answers those
methods as the stock server does (same results, same JSON-RPC error codes).

A session made here counts against ``max_sessions`` like any other; one that
no call has used for ``idle_timeout`` seconds and that has no WebSocket
attached is closed (the stock server keeps them until asked).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...errors import ProtocolError
from ...protocol.codec import JsonCodec
from ..context import ServerContext
from ..hosting.hosts import Host
from ..hosting.sessions import CapacityReached

__all__ = ["McpService", "SessionUnavailable", "json_response"]

logger = logging.getLogger(__name__)

# JSON-RPC 2.0 error codes, as openenv's JsonRpcErrorCode.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

_MESSAGES = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid params",
    INTERNAL_ERROR: "Internal error",
    SERVER_ERROR: "Server error",
}


class SessionUnavailable(Exception):
    """A ``/ws?session_id=`` that names no session this server can attach."""


class _Failure(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


@dataclass(slots=True)
class _Session:
    host: Host
    last_used: float = field(default_factory=time.monotonic)
    attached: bool = False
    closing: bool = False  # asked to close while a WebSocket holds it: closed when that lets go
    calls: asyncio.Lock = field(default_factory=asyncio.Lock)


def _error(request_id: Any, code: int, message: str | None = None, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message or _MESSAGES[code], "data": data}}


class McpService:
    """The ``/mcp`` methods of one server process.

    Args:
        ctx: the server's shared state (sessions are made and counted there).
        idle_timeout: seconds after which an unused, unattached session is closed.
    """

    def __init__(self, ctx: ServerContext, idle_timeout: float = 600.0) -> None:
        self.ctx = ctx
        self.idle_timeout = idle_timeout
        self._codec = JsonCodec(ctx.config.limits)
        self._sessions: dict[str, _Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.connections: set[Any] = set()  # open POST connections (closed on shutdown)

    # ------------------------------------------------------------ JSON-RPC

    async def handle(self, body: bytes) -> dict[str, Any]:
        """The JSON-RPC response to one request body."""
        try:
            request = self._codec.decode(body.decode("utf-8"))
        except (ProtocolError, UnicodeDecodeError):
            return _error(None, PARSE_ERROR)
        if not isinstance(request, dict):  # (the stock server: a parse error for any JSON but an object)
            return _error(None, PARSE_ERROR)
        # As openenv's JsonRpcRequest model (pydantic, lax): jsonrpc "2.0", a string method, object
        # params, an id that is a string or an int (a whole float or a bool read as the int).
        request_id = request.get("id")
        if type(request_id) is float and request_id.is_integer():
            request_id = int(request_id)
        elif type(request_id) is bool:
            request_id = int(request_id)
        problem = None
        if request.keys() - {"jsonrpc", "method", "params", "id"}:
            problem = f"unknown members {sorted(map(str, request.keys() - {'jsonrpc', 'method', 'params', 'id'}))[:8]}"
        elif request.get("jsonrpc") != "2.0":
            problem = "'jsonrpc' must be \"2.0\""
        elif not isinstance(request.get("method"), str):
            problem = "'method' must be a string"
        elif not isinstance(request.get("params", {}), dict):
            problem = "'params' must be an object"
        elif request_id is not None and type(request_id) not in (str, int):
            problem = "'id' must be a string or an integer"
        if problem is not None:
            return _error(None, INVALID_REQUEST, f"Invalid request: {problem}")
        params = request.get("params", {})
        try:
            result = await self._call(request["method"], params)
        except _Failure as failure:
            return _error(request_id, failure.code, failure.message, failure.data)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
        if method == "openenv/session/create":
            return {"session_id": await self._create()}
        if method == "openenv/session/close":
            return await self._close_named(params.get("session_id"))
        if method not in ("tools/list", "tools/call"):
            raise _Failure(METHOD_NOT_FOUND, f"Method not found: {method}")
        name = params.get("name")
        arguments = params.get("arguments", {})
        if method == "tools/call":
            if not name:
                raise _Failure(INVALID_PARAMS, "Missing 'name' in params")
            if not isinstance(name, str) or not isinstance(arguments, dict):  # (stock: the call fails)
                raise _Failure(INTERNAL_ERROR, "'name' must be a string and 'arguments' an object")
        session_id = params.get("session_id")
        if session_id:
            session = self._named(session_id)
            async with session.calls:  # (one call at a time in a session, a WebSocket's steps included)
                if session.closing or self._sessions.get(session_id) is not session:
                    raise _Failure(INVALID_PARAMS, f"Unknown session_id: {str(session_id)[:100]}")
                session.last_used = time.monotonic()
                try:
                    return await self._tools(session.host, method, name, arguments)
                finally:
                    session.last_used = time.monotonic()
        # No session: a temporary env, as the stock server does.
        host = await self._make_host()
        try:
            return await self._tools(host, method, name, arguments)
        finally:
            await self._release(host)

    async def _tools(self, host: Host, method: str, name: Any, arguments: dict[str, Any]) -> Any:
        try:
            if method == "tools/list":
                return {"tools": await host.list_tools(self.ctx.runner.call)}
            return await host.call_tool(self.ctx.runner.call, name, arguments)
        except LookupError as exc:
            raise _Failure(INVALID_PARAMS, str(exc.args[0]) if exc.args else str(exc)) from None
        except Exception as exc:  # (the env's own error: INTERNAL_ERROR with its message, as stock)
            logger.debug("%s %s failed", method, name or "", exc_info=True)
            raise _Failure(INTERNAL_ERROR, str(exc)) from None

    # ------------------------------------------------------------ sessions

    async def _make_host(self) -> Host:
        if self._closed:
            raise _Failure(SERVER_ERROR, "server shutting down")
        try:
            self.ctx.table.reserve(1)
        except CapacityReached as exc:
            raise _Failure(
                SERVER_ERROR, str(exc), {"active_sessions": self.ctx.table.active, "max_sessions": self.ctx.table.max_sessions}
            ) from None
        try:
            return await self.ctx.make_host()
        except Exception:
            self.ctx.table.release(1)
            logger.exception("the %s factory failed", self.ctx.factory.name)
            name = self.ctx.factory.name
            raise _Failure(SERVER_ERROR, f"Environment factory '{name}' failed to create instance.", {"factory_name": name}) from None

    async def _create(self) -> str:
        host = await self._make_host()
        if self._closed:  # (shut down while the env was made)
            await self._release(host)
            raise _Failure(SERVER_ERROR, "server shutting down")
        session_id = str(uuid.uuid4())
        self._sessions[session_id] = _Session(host)
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="mcp-session-reaper")
        return session_id

    def _named(self, session_id: Any) -> _Session:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise _Failure(INVALID_PARAMS, f"Unknown session_id: {str(session_id)[:100]}")
        return session

    async def _close_named(self, session_id: Any) -> dict[str, Any]:
        if not session_id:
            raise _Failure(INVALID_PARAMS, "Invalid params - 'session_id' is required")
        session = self._named(session_id)
        if session.attached:  # closed once its WebSocket lets go, as stock does
            session.closing = True
            return {"session_id": session_id, "closed": False, "closing": True}
        session.closing = True
        async with session.calls:  # (after a call under way)
            await self._drop(session_id)
        return {"session_id": session_id, "closed": True}

    async def _drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await self._release(session.host)

    async def _release(self, host: Host) -> None:
        """Close a host made by :meth:`_make_host` and free its slot."""
        await self.ctx.close_host(host)
        self.ctx.table.release(1)

    def attach(self, session_id: str) -> tuple[Host, asyncio.Lock]:
        """The host of session ``session_id``, for a WebSocket (one at a time), and the lock its calls take.

        Raises:
            SessionUnavailable: no such session, or one with a WebSocket already.
        """
        session = self._sessions.get(session_id)
        if session is None or session.closing:
            raise SessionUnavailable(f"Unknown session_id: {session_id[:100]}")
        if session.attached:
            raise SessionUnavailable(f"Session {session_id[:100]} already has an attached WebSocket")
        session.attached = True
        session.last_used = time.monotonic()
        return session.host, session.calls

    async def detach(self, session_id: str) -> None:
        """The WebSocket of ``session_id`` closed: the session stays (unless a close was asked meanwhile)."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        session.attached = False
        session.last_used = time.monotonic()
        if session.closing:
            async with session.calls:
                await self._drop(session_id)

    async def _reap(self) -> None:
        period = max(min(self.idle_timeout / 4, 30.0), 0.05)
        while not self._closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for session_id, session in list(self._sessions.items()):
                if not session.attached and not session.calls.locked() and now - session.last_used > self.idle_timeout:
                    logger.info("closing MCP session %s: unused for %.0f s", session_id, now - session.last_used)
                    await self._drop(session_id)

    async def close(self) -> None:
        """Close every POST connection and every session (on shutdown)."""
        self._closed = True
        for connection in list(self.connections):
            connection.close()
        if self._reaper is not None:
            self._reaper.cancel()
        for session_id in list(self._sessions):
            await self._drop(session_id)

    @property
    def sessions(self) -> int:
        """Sessions made here and not closed yet."""
        return len(self._sessions)


def json_response(value: dict[str, Any]) -> bytes:
    """A JSON-RPC response body (non-finite floats as null, as the stock server writes them).

    A result JSON cannot hold (an int of more than 4,300 digits, a cycle) is an ``INTERNAL_ERROR``.
    """
    codec = JsonCodec(finite=True)
    try:
        return codec.encode(value).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        return codec.encode(_error(value.get("id"), INTERNAL_ERROR, f"cannot encode the result as JSON: {exc}")).encode("utf-8")
