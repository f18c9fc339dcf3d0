"""A fast-path connection: many sessions on one WebSocket, several requests in flight.

The connection is a plain :class:`asyncio.Protocol` that moves bytes between the
socket and websockets' Sans-I/O :class:`~websockets.client.ClientProtocol`; no
reader task, no per-message locks or queues. Each reply is decoded inside the
event loop's ``data_received`` callback and handed, by request id, straight to
whoever asked: a callback (:meth:`FastConnection.send_request`) or a future
(:meth:`FastConnection.request`). Sending encodes, frames and writes at once.

A request that times out only forgets its id: a reply that arrives later is
recognised and dropped, so the connection and its other sessions go on.

Messages are never fragmented by our servers; a fragmented message is
reassembled all the same (within ``Limits.max_frame_bytes``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import socket
import ssl as ssl_module
from typing import Any, Callable, Mapping

from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidState, InvalidStatus, InvalidURI, PayloadTooBig
from websockets.frames import BINARY, CLOSE, CONT, OK_CLOSE_CODES, PONG, TEXT, CloseCode
from websockets.http11 import Response
from websockets.protocol import OPEN
from websockets.proxy import get_proxy
from websockets.uri import parse_uri

from .._urls import is_loopback, ws_url
from ..config import Limits, Timeouts
from ..errors import ConnectError, ConnectionLost, LimitExceeded, OpenEnvGymError, ProtocolError, SessionTimeout
from ..protocol.codec import MsgpackCodec
from ..protocol.fast import (
    SUBPROTOCOL,
    ClosedReply,
    FastErrorReply,
    FastReply,
    OpenedReply,
    close_batch_request,
    open_request,
    parse_fast_reply,
)
from .transport import Transport, open_transport

__all__ = ["FastConnection", "SubprotocolNotSelected", "ReplyCallback"]

logger = logging.getLogger(__name__)

#: Called exactly once per request with the reply, or with the error that ended
#: the wait (:class:`SessionTimeout`, :class:`ConnectionLost`, :class:`ProtocolError`).
ReplyCallback = Callable[[FastReply | OpenEnvGymError], None]

#: Keepalive defaults, in seconds (as websockets' own).
PING_INTERVAL = 20.0
PING_TIMEOUT = 20.0

USER_AGENT = "openenv-gym"


class SubprotocolNotSelected(ConnectError):
    """The server accepted the WebSocket but selected no ``openenv.msgpack.v1``: it speaks stock JSON.

    Raised by :meth:`FastConnection.connect`. The connection is not wasted:

    Attributes:
        url: the WebSocket URL.
        transport: the open WebSocket, codec ``"json"``, ready for a stock
            :class:`~openenv_gym.client.Session`. The catcher owns it: use it, or
            close it (``transport.ws.transport.abort()`` or ``await transport.ws.close()``).
    """

    def __init__(self, message: str, *, url: str, transport: Transport) -> None:
        super().__init__(message, url=url)
        self.transport = transport


def _settle(future: asyncio.Future, result: FastReply | OpenEnvGymError) -> None:
    """A :data:`ReplyCallback` that completes ``future``."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class FastConnection(asyncio.Protocol):
    """The client end of one ``openenv.msgpack.v1`` connection.

    Open it with :meth:`connect`. (Building it from a :class:`Transport` whose
    codec is ``"msgpack"`` also works: the connection takes over the
    transport's socket.) All methods must run on the event loop that opened it.

    The :class:`asyncio.Protocol` methods (``connection_made``,
    ``data_received``, ...) are called by the event loop, not by users.

    Writes never wait: if the socket's buffer fills, the transport keeps
    buffering (callers such as the pool bound the requests in flight).
    Keepalive: the server's pings are answered at once; we ping every
    ``ping_interval`` seconds and declare the connection lost when no pong
    comes within ``ping_timeout`` seconds.

    Attributes:
        url: the WebSocket URL.
    """

    # ------------------------------------------------------------ opening

    def __init__(self, transport: Transport, *, timeouts: Timeouts, limits: Limits) -> None:
        """Take over an open ``websockets`` connection that negotiated msgpack."""
        if transport.codec != "msgpack":
            raise ValueError("FastConnection needs a transport that negotiated msgpack")
        ws = transport.ws
        self._setup(transport.url, ws.protocol, timeouts, limits, PING_INTERVAL, PING_TIMEOUT)
        self._adopted = ws  # keeps the protocol's logger adapter's referent alive
        if ws.keepalive_task is not None:
            ws.keepalive_task.cancel()
            ws.keepalive_task = None
        if ws.connection_lost_waiter.done():
            self._closed.set_result(None)
            self._fail(ConnectionLost(f"connection to {self.url} lost", url=self.url))
            return
        self._transport = ws.transport
        ws.transport.set_protocol(self)
        if ws.recv_messages.paused:
            ws.transport.resume_reading()
        # Whatever websockets' reader queued (no reply is awaited yet, so it is dropped).
        ws.recv_messages.frames.queue.clear()
        self._on_open()

    def _setup(
        self,
        url: str,
        protocol: ClientProtocol,
        timeouts: Timeouts,
        limits: Limits,
        ping_interval: float | None,
        ping_timeout: float | None,
    ) -> None:
        self.url = url
        self._loop = asyncio.get_running_loop()
        self._protocol = protocol
        self._transport: asyncio.Transport | None = None
        self._codec = MsgpackCodec(limits)
        self._timeouts = timeouts
        self._ids = itertools.count(1)
        # request id -> (callback, timeout handle)
        self._pending: dict[int, tuple[ReplyCallback, asyncio.TimerHandle]] = {}
        self._failure: OpenEnvGymError | None = None
        self._fragments: list[bytes] | None = None
        self._fragmented_text = False
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._close_handle: asyncio.TimerHandle | None = None
        # Keepalive: our pings, and the pong we wait for.
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._ping_handle: asyncio.TimerHandle | None = None
        self._pong_handle: asyncio.TimerHandle | None = None
        self._ping_data: bytes | None = None
        self._ping_sent = 0.0
        # Opening handshake (direct connect only).
        self._opening: asyncio.Future[None] | None = None
        self._request = None
        self._stock: Transport | None = None
        self._adopted: ClientConnection | None = None

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
        ssl: ssl_module.SSLContext | None = None,
        ping_interval: float | None = PING_INTERVAL,
        ping_timeout: float | None = PING_TIMEOUT,
    ) -> "FastConnection":
        """Open a fast-path connection to ``base_url``'s ``/ws`` within ``timeouts.connect`` seconds.

        Offers ``openenv.msgpack.v1`` and nothing else (no compression).

        Args:
            base_url: ``http(s)://host:port[/prefix]`` or ``ws(s)://host:port[/prefix][/ws]``.
            headers: extra handshake headers, for example ``{"Authorization": "Bearer ..."}``.
            timeouts: connect, per-request and close timeouts (defaults: :class:`Timeouts`).
            limits: frame, array and nesting limits for what the server sends.
            ssl: TLS context for ``wss://`` / ``https://`` (default: the system's).
            ping_interval: seconds between our keepalive pings; ``None``: no pings.
            ping_timeout: seconds to wait for a pong before the connection is
                declared lost; ``None``: wait forever.

        Raises:
            SubprotocolNotSelected: the server speaks stock JSON; the exception
                carries the open connection as a stock :class:`Transport`.
            ConnectError: refused, unreachable, TLS or handshake failure, or timeout.
        """
        timeouts = timeouts or Timeouts()
        limits = limits or Limits()
        url = ws_url(base_url)
        try:
            uri = parse_uri(url)
        except InvalidURI as exc:
            raise ConnectError(f"cannot connect to {url}: {exc}", url=url) from None
        if not is_loopback(url) and get_proxy(uri) is not None:
            # Through a proxy: let websockets' client handle the proxy, then take over.
            transport = await open_transport(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)
            if transport.codec != "msgpack":
                raise SubprotocolNotSelected(
                    f"{url} did not select {SUBPROTOCOL}", url=url, transport=transport
                )
            return cls(transport, timeouts=timeouts, limits=limits)

        self = cls.__new__(cls)
        protocol = ClientProtocol(uri, subprotocols=[SUBPROTOCOL], max_size=limits.max_frame_bytes)
        self._setup(url, protocol, timeouts, limits, ping_interval, ping_timeout)
        self._opening = self._loop.create_future()
        tls = ssl if ssl is not None else (True if uri.secure else None)
        try:
            async with asyncio.timeout(timeouts.connect):
                await self._loop.create_connection(
                    lambda: self,
                    uri.host,
                    uri.port,
                    ssl=tls,
                    server_hostname=uri.host if tls else None,
                )
                request = protocol.connect()
                request.headers.update(dict(headers or {}))
                request.headers.setdefault("User-Agent", USER_AGENT)
                self._request = request
                protocol.send_request(request)
                self._flush()
                await self._opening
        except TimeoutError:
            self._abort()
            raise ConnectError(f"connecting to {url} timed out after {timeouts.connect} s", url=url) from None
        except OSError as exc:
            self._abort()
            raise ConnectError(f"cannot connect to {url}: {exc}", url=url) from None
        except BaseException:
            self._abort()
            raise
        exc = protocol.handshake_exc
        if exc is not None:
            self._abort()
            if isinstance(exc, InvalidStatus):
                status = exc.response.status_code
                raise ConnectError(f"{url} refused the WebSocket handshake with HTTP {status}", url=url) from None
            raise ConnectError(f"cannot connect to {url}: {exc}", url=url) from None
        if self._stock is not None:
            raise SubprotocolNotSelected(f"{url} did not select {SUBPROTOCOL}", url=url, transport=self._stock)
        return self

    def _on_handshake(self, events: list) -> list:
        """Handle what arrived during the opening handshake; returns the frames left to dispatch."""
        for i, event in enumerate(events):
            if not isinstance(event, Response):
                continue
            opening, self._opening = self._opening, None
            rest = events[i + 1 :]
            if self._protocol.handshake_exc is None and self._protocol.subprotocol != SUBPROTOCOL:
                self._hand_over(event, rest)
                rest = []
            elif self._protocol.handshake_exc is None:
                self._on_open()
            else:
                rest = []
            if opening is not None and not opening.done():
                opening.set_result(None)
            return rest
        return []

    def _hand_over(self, response: Response, events: list) -> None:
        """The server speaks stock JSON: give the socket to a ``websockets`` connection."""
        transport = self._transport
        assert transport is not None
        ws = ClientConnection(
            self._protocol, ping_interval=PING_INTERVAL, ping_timeout=PING_TIMEOUT, close_timeout=self._timeouts.close
        )
        ws.connection_made(transport)
        ws.request = self._request
        ws.response = response
        ws.response_rcvd.set_result(None)
        transport.set_protocol(ws)
        self._transport = None
        for event in events:
            ws.process_event(event)
        ws.start_keepalive()
        self._stock = Transport(ws, self.url, "json")
        self._failure = ConnectionLost(f"{self.url} speaks stock JSON", url=self.url)

    def _on_open(self) -> None:
        if self._ping_interval is not None:
            self._ping_handle = self._loop.call_later(self._ping_interval, self._ping)

    # ------------------------------------------------------------ public API

    @property
    def closed(self) -> bool:
        """Whether the connection has failed or been closed."""
        return self._failure is not None

    def next_id(self) -> int:
        """A fresh request id."""
        return next(self._ids)

    def send_request(
        self, build: Callable[[int], dict[str, Any]], on_reply: ReplyCallback, timeout: float | None = None
    ) -> int:
        """Send the message ``build(request_id)`` now; returns the request id.

        ``on_reply`` is called exactly once, later, from the event loop's
        callback: with the :data:`FastReply`, or with a :class:`SessionTimeout`
        (no reply within ``timeout`` seconds, default ``Timeouts.step``; a late
        reply is dropped), :class:`ConnectionLost` or :class:`ProtocolError`.
        No task or future is created.

        Raises (at once, and ``on_reply`` is then never called):
            ConnectionLost, ProtocolError: the connection has already failed or closed.
            TypeError: the message cannot be encoded.
        """
        if self._failure is not None:
            raise self._failure
        rid = next(self._ids)
        payload = self._codec.encode(build(rid))
        protocol = self._protocol
        try:
            protocol.send_binary(payload)
        except InvalidState:
            raise self._failure or ConnectionLost(f"connection to {self.url} is closing", url=self.url) from None
        self._flush()
        if timeout is None:
            timeout = self._timeouts.step
        self._pending[rid] = (on_reply, self._loop.call_later(timeout, self._expire, rid, timeout))
        return rid

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``: its callback is never called; a late reply is dropped."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            entry[1].cancel()

    async def request(self, build: Callable[[int], dict[str, Any]], timeout: float | None = None) -> FastReply:
        """Send the message ``build(request_id)`` and wait for its reply.

        Raises:
            SessionTimeout: no reply within ``timeout`` (default ``Timeouts.step``) seconds.
            ConnectionLost, ProtocolError: the connection failed.
        """
        future: asyncio.Future[FastReply] = self._loop.create_future()
        rid = self.send_request(build, functools.partial(_settle, future), timeout)
        try:
            return await future
        finally:
            if future.done():
                if not future.cancelled():
                    future.exception()  # retrieved, even if our waiter was cancelled meanwhile
            else:
                self.forget(rid)

    async def open_sessions(self, count: int, timeout: float | None = None) -> list[int]:
        """Open ``count`` sessions; returns their ids.

        Raises:
            CapacityError: the server cannot host that many more sessions.
            ServerError: any other refusal.
        """
        reply = await self.request(lambda rid: open_request(rid, count), timeout)
        if isinstance(reply, FastErrorReply):
            raise reply.error.exception(self.url)
        if not isinstance(reply, OpenedReply) or len(reply.sessions) != count:
            raise ProtocolError(f"{self.url}: expected {count} opened sessions, got {reply!r}")
        return reply.sessions

    async def close_sessions(self, sessions: list[int]) -> None:
        """Close ``sessions`` (best effort, bounded by ``Timeouts.close``)."""
        if self._failure is not None or not sessions:
            return
        try:
            reply = await self.request(lambda rid: close_batch_request(rid, sessions), self._timeouts.close)
        except OpenEnvGymError as exc:
            logger.debug("closing sessions on %s failed: %s", self.url, exc)
            return
        if not isinstance(reply, (ClosedReply, FastErrorReply)):
            logger.debug("unexpected reply to close from %s: %r", self.url, reply)

    async def close(self) -> None:
        """Close the connection (closing handshake bounded by ``Timeouts.close``); idempotent."""
        self._fail(ConnectionLost(f"connection to {self.url} closed by the client", url=self.url))
        if self._transport is None or self._closed.done():
            return
        if self._protocol.state is OPEN:
            self._protocol.send_close(CloseCode.NORMAL_CLOSURE)
            self._flush()
        try:
            async with asyncio.timeout(self._timeouts.close):
                await asyncio.shield(self._closed)
        except TimeoutError:
            self._abort()

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - platform quirk
                pass

    def data_received(self, data: bytes) -> None:
        protocol = self._protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        self._flush()  # pongs, close echoes
        if self._opening is not None:
            events = self._on_handshake(events)
        for frame in events:
            opcode = frame.opcode
            if opcode is BINARY:
                if frame.fin:
                    if not self._deliver(frame.data):
                        return
                else:
                    self._fragments, self._fragmented_text = [frame.data], False
            elif opcode is CONT:
                assert self._fragments is not None  # the protocol checks the sequence
                self._fragments.append(frame.data)
                if frame.fin:
                    payload, self._fragments = b"".join(self._fragments), None
                    if self._fragmented_text:
                        self._fail(ProtocolError(f"{self.url}: expected a binary frame, got text"))
                        return
                    if not self._deliver(payload):
                        return
            elif opcode is TEXT:
                if frame.fin:
                    self._fail(ProtocolError(f"{self.url}: expected a binary frame, got text"))
                    return
                self._fragments, self._fragmented_text = [frame.data], True
            elif opcode is PONG:
                self._pong(frame.data)
            elif opcode is CLOSE:
                self._fail(self._lost())
                # The server closes the TCP connection next; don't wait forever.
                self._close_handle = self._loop.call_later(self._timeouts.close, self._abort)
            # PING: the protocol queued the pong, already written.
        if protocol.parser_exc is not None and self._failure is None:
            exc = protocol.parser_exc
            if isinstance(exc, PayloadTooBig):
                self._fail(LimitExceeded(f"{self.url}: {exc}"))
            else:
                self._fail(ProtocolError(f"{self.url}: invalid WebSocket frame: {exc}"))

    def eof_received(self) -> bool | None:
        self._protocol.receive_eof()
        self._protocol.events_received()
        self._flush()
        return None  # let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        protocol = self._protocol
        protocol.receive_eof()  # idempotent; the protocol is CLOSED now
        protocol.data_to_send()
        self._transport = None
        if self._close_handle is not None:
            self._close_handle.cancel()
            self._close_handle = None
        if self._opening is not None:
            opening, self._opening = self._opening, None
            if not opening.done():
                opening.set_result(None)  # handshake_exc is set
        self._fail(self._lost())
        if not self._closed.done():
            self._closed.set_result(None)

    # ------------------------------------------------------------ internals

    def _flush(self) -> None:
        transport = self._transport
        for data in self._protocol.data_to_send():
            if transport is None:
                continue
            if data:
                transport.write(data)
            elif transport.can_write_eof():
                try:
                    transport.write_eof()
                except (OSError, RuntimeError):  # pragma: no cover
                    pass
            else:
                transport.close()

    def _deliver(self, payload: bytes) -> bool:
        """Decode one message and hand it to its request; ``False`` if the connection failed."""
        try:
            reply = parse_fast_reply(self._codec.decode(payload))
        except ProtocolError as exc:
            self._fail(ProtocolError(f"{self.url}: {exc}"))
            return False
        rid = reply.id
        if rid is None:
            # An error for a request the server could not read: ours are
            # always readable, so the stream is out of step.
            assert isinstance(reply, FastErrorReply)
            self._fail(ProtocolError(f"{self.url}: server could not read a request: {reply.error.message}"))
            return False
        entry = self._pending.pop(rid, None)
        if entry is None:
            logger.debug("dropping reply to forgotten request %s from %s", rid, self.url)
            return True
        on_reply, handle = entry
        handle.cancel()
        try:
            on_reply(reply)
        except Exception:
            logger.exception("reply callback for request %s on %s failed", rid, self.url)
        return True

    def _expire(self, rid: int, timeout: float) -> None:
        entry = self._pending.pop(rid, None)
        if entry is None:
            return
        error = SessionTimeout(f"no reply from {self.url} within {timeout} s", url=self.url, timeout=timeout)
        try:
            entry[0](error)
        except Exception:
            logger.exception("reply callback for request %s on %s failed", rid, self.url)

    def _lost(self) -> ConnectionLost:
        """The error for a connection the server closed or that broke."""
        rcvd = self._protocol.close_rcvd
        if rcvd is None:
            return ConnectionLost(f"connection to {self.url} lost", url=self.url)
        detail = f" ({rcvd.code} {rcvd.reason})"
        if rcvd.code in OK_CLOSE_CODES:
            message = f"{self.url} closed the connection{detail}"
        else:
            message = f"connection to {self.url} lost{detail}"
        return ConnectionLost(message, url=self.url, code=rcvd.code, reason=rcvd.reason)

    def _fail(self, error: OpenEnvGymError) -> None:
        """Fail every request in flight (with the first failure) and stop the keepalive."""
        if self._failure is None:
            self._failure = error
        for handle in (self._ping_handle, self._pong_handle):
            if handle is not None:
                handle.cancel()
        self._ping_handle = self._pong_handle = None
        pending, self._pending = self._pending, {}
        for rid, (on_reply, handle) in pending.items():
            handle.cancel()
            try:
                on_reply(self._failure)
            except Exception:
                logger.exception("reply callback for request %s on %s failed", rid, self.url)
        if isinstance(error, ProtocolError):
            # The stream is out of step: nothing more on it can be trusted.
            self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _ping(self) -> None:
        self._ping_handle = None
        if self._failure is not None or self._protocol.state is not OPEN:
            return
        self._ping_data = os.urandom(4)
        self._ping_sent = self._loop.time()
        self._protocol.send_ping(self._ping_data)
        self._flush()
        if self._ping_timeout is not None:
            self._pong_handle = self._loop.call_later(self._ping_timeout, self._pong_missed)

    def _pong(self, data: bytes) -> None:
        if self._ping_data is None or bytes(data) != self._ping_data:
            return  # unsolicited
        self._ping_data = None
        if self._pong_handle is not None:
            self._pong_handle.cancel()
            self._pong_handle = None
        if self._failure is None and self._ping_interval is not None:
            latency = self._loop.time() - self._ping_sent
            self._ping_handle = self._loop.call_later(max(0.0, self._ping_interval - latency), self._ping)

    def _pong_missed(self) -> None:
        self._pong_handle = None
        if self._failure is not None:
            return
        if self._protocol.state is OPEN:
            self._protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            self._flush()
        self._fail(
            ConnectionLost(f"connection to {self.url} lost: no pong within {self._ping_timeout} s", url=self.url)
        )
        self._abort()
