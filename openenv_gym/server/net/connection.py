"""Connections on the server's port: WebSocket and ``GET`` for websockets, the rest of HTTP for us.

websockets reads ``GET`` requests, and starts its handshake as soon as a
connection opens. :class:`Connection` waits for the first request's head
instead: a ``GET`` of HTTP/1.1 without a body goes to websockets as before (a
handshake, or a route answered from ``process_request``); anything else to
an :class:`HttpExchange` (HTTP/1.1 and 1.0 with keep-alive, read by
:class:`~openenv_gym.server.net.http1.RequestReader`): ``POST /mcp``, the routes
by another method (405), by HTTP/1.0 or with a body, and a malformed request
(400), which websockets would close without a word. A connection that sends
no whole head is closed after ``open_timeout`` seconds, as websockets closes
one that does not finish its handshake.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from http import HTTPStatus
from typing import Any, Callable

from websockets.asyncio.connection import Connection as _WsConnection
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.frames import DATA_OPCODES, CloseCode, Frame, Opcode
from websockets.protocol import State

from ..._internals import EventHook, route_flow_control, send_data, start_handler
from ..wire.mcp_http import McpService, json_response
from .http1 import MAX_HEAD_BYTES, HttpError, HttpRequest, RequestReader, encode_response, find_head_end, parse_request_line
from .routes import MCP_PATH, Routes, json_body, route_path
from .security import UNAUTHORIZED_DETAIL

__all__ = ["Connection", "ConnectionGate", "HttpExchange", "MCP_PATH"]

logger = logging.getLogger(__name__)

#: The largest body read for a request to another path than ``/mcp`` (bytes): the routes take none,
#: and a request's body is read before its bearer token is checked.
OTHER_BODY_BYTES = 64 * 1024


def _body_limit(target: str) -> int | None:
    """The largest body of a request to ``target`` (bytes); ``None``: the server's ``max_body`` (``/mcp``)."""
    return None if route_path(target) == MCP_PATH else OTHER_BODY_BYTES


#: Requests of one connection read ahead of the one being answered; then reading pauses.
_MAX_QUEUED = 8


class HttpExchange:
    """The HTTP requests of a connection that did not begin with a WebSocket's ``GET``, answered one after another.

    ``POST /mcp`` goes to the :class:`McpService`; any other request
    (a pooling client's ``GET /health`` on the same kept-alive connection,
    a ``HEAD``) to the :class:`~openenv_gym.server.net.routes.Routes`, as on a
    fresh connection.
    At most :data:`_MAX_QUEUED` requests are read ahead (then reading pauses),
    and no answer is written while the peer is not reading the last ones.

    Args:
        connection: the connection (its transport, and its address for logs).
        service: answers ``/mcp``.
        routes: answers the rest.
        max_body: the largest body accepted, in bytes.
        idle_timeout: seconds a kept-alive connection may stay silent, a
            started request may take to arrive whole, and an answer may wait
            for the peer to read.
    """

    def __init__(self, connection: "Connection", service: McpService, routes: Routes, max_body: int, idle_timeout: float) -> None:
        self.connection = connection
        self.transport: asyncio.Transport = connection.transport
        self.service = service
        self.routes = routes
        self.idle_timeout = idle_timeout
        self.reader = RequestReader(max_body, body_limit=_body_limit)
        self.queue: deque[HttpRequest] = deque()
        self.task: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        self.closing = False
        self.paused = False
        self.peer_done = False  # the peer half-closed: answer, then close
        self.refusal: bytes | None = None  # the answer to a malformed request, sent after those before it
        self.writable = asyncio.Event()
        self.writable.set()
        self._timer = self.loop.call_later(idle_timeout, self._expire)
        service.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closing or self.reader.error is not None:
            return
        self.queue.extend(self.reader.feed(data))
        error = self.reader.error
        if error is not None:  # answered after the requests before it, then the connection closes
            logger.info("refused an HTTP request: %s", error.message)
            self.refusal = encode_response(error.status, json_body({"detail": error.message}), keep_alive=False)
            self.transport.pause_reading()
        elif len(self.queue) >= _MAX_QUEUED and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if self.task is None:
            if self.queue:
                self._timer.cancel()
                self.task = self.loop.create_task(self._serve())
            else:
                self._settle()

    def eof_received(self) -> bool:
        """The peer sent all it will: answer what it asked, then close (true: keep the transport open)."""
        self.peer_done = True
        if self.task is None and not self.queue:
            self._settle()
        return True

    def _settle(self) -> None:
        """Nothing to answer now: send the refusal, a pending ``100 Continue``, or close after a half-close."""
        if self.transport.is_closing():
            return
        if self.refusal is not None:
            self.closing = True
            self.transport.write(self.refusal)
            self.transport.close()
        elif self.peer_done:
            self.closing = True
            self.transport.close()
        elif self.reader.expects_continue:  # (only now: after the answers to the requests before it)
            self.reader.expects_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _serve(self) -> None:
        try:
            while self.queue and not self.closing:
                request = self.queue.popleft()
                if self.paused and len(self.queue) < _MAX_QUEUED:
                    self.paused = False
                    self.transport.resume_reading()
                status, body, extra = await self._answer(request)
                if status < 400 and (self.routes.bearer is None or self.routes.bearer.admits(Headers(list(request.headers.items())))):
                    self.connection.prove()
                keep = request.keep_alive and not self.closing
                if self.transport.is_closing():
                    return
                try:  # the peer must read what it was sent before it gets more
                    await asyncio.wait_for(self.writable.wait(), self.idle_timeout)
                except TimeoutError:
                    logger.info("closing an HTTP connection: its peer read no answer in %.0f s", self.idle_timeout)
                    self.closing = True
                    self.transport.abort()
                    return
                head = request.method == "HEAD"
                self.transport.write(encode_response(status, body, keep_alive=keep or self.refusal is not None, extra=extra, head=head))
                if not keep:
                    self.closing = True
                    self.transport.close()
                    return
        except Exception:  # pragma: no cover - a bug here must not leave the connection hanging
            logger.exception("answering an HTTP request failed")
            self.transport.abort()
        finally:
            self.task = None
            if not self.closing and not self.transport.is_closing():
                self._settle()
                if not self.closing:
                    self._timer = self.loop.call_later(self.idle_timeout, self._expire)

    async def _answer(self, request: HttpRequest) -> tuple[HTTPStatus, bytes | bytearray, tuple[tuple[str, str], ...]]:
        headers = Headers(list(request.headers.items()))
        if request.method != "POST" or route_path(request.target) != MCP_PATH:  # (the routes answer 405 on /mcp)
            response = self.routes.answer(self.connection, request.target, headers, request.method)
            if response is None and "websocket" not in headers.get("Upgrade", "").lower():  # (the WebSocket path, by plain HTTP)
                detail = "this path takes WebSocket handshakes (Upgrade: websocket) only"
                return HTTPStatus.UPGRADE_REQUIRED, json_body({"detail": detail}), (("Upgrade", "websocket"),)
            if response is None:  # (a WebSocket upgrade: it needs a connection of its own, and HTTP/1.1)
                return HTTPStatus.BAD_REQUEST, json_body({"detail": "open a new HTTP/1.1 connection for a WebSocket"}), ()
            extra = tuple((k, v) for k, v in response.headers.raw_items() if k.lower() in ("www-authenticate", "allow"))
            return HTTPStatus(response.status_code), response.body, extra
        token = self.routes.bearer
        if token is not None and not token.admits(headers):
            return HTTPStatus.UNAUTHORIZED, json_body({"detail": UNAUTHORIZED_DETAIL}), (("WWW-Authenticate", "Bearer"),)
        return HTTPStatus.OK, json_response(await self.service.handle(request.body)), ()

    def _expire(self) -> None:
        """Silent for ``idle_timeout`` (between requests, or within one): close."""
        if self.task is None and not self.transport.is_closing():
            if not self.reader.idle:
                logger.info("closing an HTTP connection: a request did not arrive whole in %.0f s", self.idle_timeout)
            self.closing = True
            self.transport.close()

    def connection_lost(self) -> None:
        self.closing = True
        self._timer.cancel()
        self.writable.set()
        self.service.connections.discard(self)

    def close(self) -> None:
        """Close now (on shutdown)."""
        self.closing = True
        self._timer.cancel()
        if not self.transport.is_closing():
            self.transport.close()


class Connection(EventHook, ServerConnection):
    """A ``ServerConnection`` that hands what is not a ``GET`` of HTTP/1.1 to a :class:`HttpExchange`.

    Made by websockets' ``serve(create_connection=...)`` through
    :func:`connection_factory`.
    """

    make_exchange: Callable[["Connection"], HttpExchange]
    open_timeout: float = 10.0
    gate: "ConnectionGate | None" = None
    #: Seconds a fragmented message may take from its first frame to its last (``None``: no bound); then
    #: the connection is closed (1008): frames of a message left unfinished are memory held for nothing.
    fragment_timeout: float | None = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._first = bytearray()
        self._exchange: HttpExchange | None = None
        self._started = False
        self._waiting: asyncio.TimerHandle | None = None
        self._counted = False  # (counted by the gate: to be let go of)
        self._fragment_timer: asyncio.TimerHandle | None = None  # (a fragmented message is under way)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not ServerConnection's: it starts websockets' handshake at once. That waits for the first bytes.
        _WsConnection.connection_made(self, transport)
        self._waiting = self.loop.call_later(self.open_timeout, self._silent)
        # Reading pauses for either of two reasons: websockets' queue of received messages is full,
        # or the peer reads none of our frames (pongs included: each ping it sends makes one).
        self._reading_held: set[str] = set()
        self._reading_handed_over = False  # (the fast path took the socket over: its reading is its own)
        route_flow_control(self, functools.partial(self._hold_reading, "queue"), functools.partial(self._release_reading, "queue"))
        self._counted = self.gate is not None and self.gate.enter(self)
        if self.gate is not None and not self._counted:  # one too many: refused before anything is read
            self._cancel_wait()
            transport.pause_reading()  # type: ignore[attr-defined]
            transport.write(_TOO_MANY)  # type: ignore[attr-defined]
            transport.close()

    def hand_over_reading(self) -> None:
        """Stop pausing and resuming reading (whoever takes the socket over does it from now on)."""
        self._reading_handed_over = True
        self._reading_held.clear()

    def _hold_reading(self, reason: str) -> None:
        if self._reading_handed_over:
            return
        if not self._reading_held:
            self.transport.pause_reading()
        self._reading_held.add(reason)

    def _release_reading(self, reason: str) -> None:
        if reason in self._reading_held and not self._reading_handed_over:
            self._reading_held.discard(reason)
            if not self._reading_held:
                self.transport.resume_reading()

    def _silent(self) -> None:
        if not self._started and self._exchange is None:
            self.transport.abort()

    def _start_websockets(self) -> None:
        self._started = True
        start_handler(self)

    def data_received(self, data: bytes) -> None:
        if self._started:
            super().data_received(data)
            return
        if self._exchange is not None:
            self._exchange.data_received(data)
            return
        searched = len(self._first)
        self._first += data
        end, body = find_head_end(self._first, searched)
        if end < 0 and len(self._first) <= MAX_HEAD_BYTES:
            return  # (the request's head is not whole yet)
        self._cancel_wait()
        first, self._first = bytes(self._first), bytearray()
        if _for_websockets(first, end, body):
            self._start_websockets()
            super().data_received(first)
        else:
            self._exchange = self.make_exchange(self)
            self._exchange.data_received(first)

    def _cancel_wait(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None

    def eof_received(self) -> bool | None:  # type: ignore[override]  # (asyncio's: true keeps the transport open)
        if self._exchange is not None:
            return self._exchange.eof_received()
        return super().eof_received()

    def pause_writing(self) -> None:
        if self._exchange is not None:
            self._exchange.writable.clear()
        elif self._started:  # (a peer that sends and never reads fills its own buffers, not our memory)
            self._hold_reading("writes")
        super().pause_writing()

    def resume_writing(self) -> None:
        if self._exchange is not None:
            self._exchange.writable.set()
        else:
            self._release_reading("writes")
        super().resume_writing()

    def on_event(self, event: Any) -> None:
        """Before websockets handles ``event``: a deadline for a fragmented message (the stock path's, whose frames websockets assembles)."""
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            if event.opcode is not Opcode.CONT and not event.fin:
                self.fragment_begun()
            elif event.opcode is Opcode.CONT and event.fin:
                self.fragment_done()

    def fragment_begun(self, expire: Callable[[], None] | None = None) -> None:
        """A fragmented message began: it has ``fragment_timeout`` seconds to end, else ``expire()`` (default: close 1008)."""
        if self.fragment_timeout is not None and self._fragment_timer is None:
            self._fragment_timer = self.loop.call_later(self.fragment_timeout, expire or self.fragment_expired)

    def fragment_done(self) -> None:
        """The fragmented message ended (or the connection did)."""
        if self._fragment_timer is not None:
            self._fragment_timer.cancel()
            self._fragment_timer = None

    def fragment_expired(self) -> None:
        """Close the connection (1008) for a fragmented message not finished in time; abort it if its peer does not close."""
        self._fragment_timer = None
        logger.info("closing a connection: a fragmented message was not finished in %g s", self.fragment_timeout)
        if self.protocol.state is State.OPEN:
            self.protocol.fail(CloseCode.POLICY_VIOLATION, f"fragmented message not finished in {self.fragment_timeout:g} s")
            send_data(self)
        self.loop.call_later(self.close_timeout or 0, self.transport.abort)  # (its frames are let go of then at the latest)

    def prove(self) -> None:
        """This connection is wanted (a WebSocket handshake passed, a request with the token answered): keep it."""
        if self._counted and self.gate is not None:
            self.gate.prove(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_wait()
        self.fragment_done()
        if self._counted:
            self._counted = False
            self.gate.leave(self)  # type: ignore[union-attr]
        if self._exchange is not None:
            self._exchange.connection_lost()
        super().connection_lost(exc)


def _for_websockets(first: bytes, end: int, body: int) -> bool:
    """Whether a connection whose first bytes are ``first`` goes to websockets (else to an :class:`HttpExchange`).

    ``end``, ``body``: where the first request's head ends and its body
    begins (:func:`~openenv_gym.server.net.http1.find_head_end`), or -1 for a
    head longer than :data:`MAX_HEAD_BYTES` (so far). websockets gets
    WebSocket handshakes alone: ``GET`` requests of HTTP/1.1 with CRLF line
    ends, ``Upgrade: websocket`` and no body, and nothing after them (a
    client waits for the 101 before it sends frames). websockets answers one
    request a connection and closes a connection that sends what it cannot
    read without a word, so the exchange answers the rest: plain ``GET`` s of
    the routes (pipelined ones in order, as uvicorn does), ``POST /mcp``, the
    routes by another method, by HTTP/1.0, with a body or with bare LF line
    ends, and a status (400, 505) for a malformed request.
    """
    line_end = first.find(b"\r\n")
    if line_end < 0 or (0 <= end < line_end):
        return False
    try:
        method, _, version = parse_request_line(first[:line_end])
    except HttpError:
        return False
    if method != b"GET" or version != b"HTTP/1.1":
        return False
    if end < 0 or end > MAX_HEAD_BYTES:  # (too long for the exchange: websockets' own limits decide)
        return True
    head = first[:end]
    if body - end != 4 or head.count(b"\n") != head.count(b"\r\n") or body < len(first):  # (a bare LF; pipelined bytes)
        return False
    lengths = set()
    upgrade = False
    for field in head[line_end + 2 :].split(b"\r\n"):
        name, _, value = field.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return False
        if name == b"content-length":
            lengths.add(value.strip())
        if name == b"upgrade" and b"websocket" in value.lower():
            upgrade = True
    return upgrade and lengths <= {b"0"}


class ConnectionGate:
    """Counts a server's open connections against ``limit``, and those not proven yet against ``pending_limit``.

    A connection is *pending* until it proves it is wanted: a WebSocket whose
    handshake (and bearer token) passed, an HTTP connection that had a request
    answered (with the token, where the server wants one). Pending connections
    are the cheap ones to open by the hundred and leave silent: at most
    ``pending_limit`` are kept, and a new connection that finds either limit
    reached takes the place of the oldest pending one. Only when proven
    connections fill ``limit`` alone is a new one refused (503). So silent or
    unauthenticated peers can neither hold more than ``pending_limit``
    connections nor keep a client with the token out.
    """

    def __init__(self, limit: int, pending_limit: int | None = None) -> None:
        self.limit = limit
        self.pending_limit = min(limit, pending_limit if pending_limit is not None else max(1, limit // 2))
        self.open = 0
        self.refused = 0
        self.dropped = 0
        self.pending: dict[Connection, None] = {}  # (oldest first)

    def enter(self, connection: "Connection") -> bool:
        """Count ``connection`` as open and pending; ``False`` (not counted) if proven ones fill ``limit``."""
        if self.open >= self.limit and not self.pending:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                logger.warning("%d connections open, the limit: refused a connection (%d so far)", self.open, self.refused)
            return False
        while self.pending and (self.open >= self.limit or len(self.pending) >= self.pending_limit):
            self._drop(next(iter(self.pending)))
        self.open += 1
        self.pending[connection] = None
        return True

    def prove(self, connection: "Connection") -> None:
        """``connection`` proved it is wanted: it is never dropped for another."""
        self.pending.pop(connection, None)

    def leave(self, connection: "Connection") -> None:
        self.pending.pop(connection, None)
        self.open -= 1

    def _drop(self, connection: "Connection") -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            logger.warning(
                "%d connections open, %d not proven: dropped the oldest of those for a new one (%d so far)",
                self.open,
                len(self.pending),
                self.dropped,
            )
        self.leave(connection)
        connection._counted = False
        connection.transport.abort()


_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)


def connection_factory(
    make_exchange: Callable[[Connection], HttpExchange],
    open_timeout: float = 10.0,
    gate: ConnectionGate | None = None,
    fragment_timeout: float | None = 10.0,
) -> type[Connection]:
    """A :class:`Connection` class whose plain HTTP requests go to ``make_exchange(connection)`` (see :func:`_for_websockets`).

    ``gate`` bounds how many are open; ``fragment_timeout`` (seconds) how long a fragmented message may take.
    """
    attributes = {
        "make_exchange": staticmethod(make_exchange),
        "open_timeout": open_timeout,
        "gate": gate,
        "fragment_timeout": fragment_timeout,
    }
    return type("OpenEnvGymConnection", (Connection,), attributes)
