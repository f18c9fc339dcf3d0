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
reassembled all the same (within ``Limits.max_frame_bytes``). Opening,
keepalive, closing and reassembly live in :mod:`.websocket`, shared with the
stock connection (:mod:`.stock_connection`); this module gives the frames their meaning.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from typing import Any, Callable

from websockets.asyncio.client import ClientConnection
from websockets.http11 import Response

from .._internals import opened
from ..config import Limits, Timeouts
from ..errors import ConnectError, ConnectionLost, OpenEnvGymError, ProtocolError, SessionTimeout
from ..protocol.codec import MsgpackCodec
from ..protocol.lane import BATCH, BATCH_AFTER, RAW_MARK, RawBatch, raw_header
from ..protocol.multiplex import (
    SUBPROTOCOL,
    BatchReply,
    ClosedReply,
    FastErrorReply,
    FastReply,
    OpenedReply,
    close_batch_request,
    open_request,
    parse_fast_reply,
)
from .open_socket import OpenSocket
from .websocket import PING_INTERVAL, PING_TIMEOUT, USER_AGENT, WebSocketConnection, settle  # noqa: F401

__all__ = ["FastConnection", "SubprotocolNotSelected", "ReplyCallback"]

logger = logging.getLogger(__name__)

#: Called exactly once per request with the reply, or with the error that ended
#: the wait (:class:`SessionTimeout`, :class:`ConnectionLost`, :class:`ProtocolError`).
ReplyCallback = Callable[[FastReply | RawBatch | OpenEnvGymError], None]

_RAW = bytes((RAW_MARK,))


class SubprotocolNotSelected(ConnectError):
    """The server accepted the WebSocket but selected no ``openenv.msgpack.v1``: it speaks stock JSON.

    Raised by :meth:`FastConnection.connect`. The connection is not wasted:

    Attributes:
        url: the WebSocket URL.
        transport: the open WebSocket, codec ``"json"``, ready for a stock
            :class:`~openenv_gym.client.Session` or
            :class:`~openenv_gym.client.stock_connection.StockConnection` (either takes its
            socket over). The catcher owns it: use it, or close it
            (``transport.ws.transport.abort()`` or ``await transport.ws.close()``).
    """

    def __init__(self, message: str, *, url: str, transport: OpenSocket) -> None:
        super().__init__(message, url=url)
        self.transport = transport


class FastConnection(WebSocketConnection):
    """The client end of one ``openenv.msgpack.v1`` connection.

    Open it with :meth:`connect`. (Building it from a :class:`OpenSocket` whose
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

    SUBPROTOCOLS = (SUBPROTOCOL,)

    # ------------------------------------------------------------ opening

    def __init__(self, transport: OpenSocket, *, timeouts: Timeouts, limits: Limits) -> None:
        """Take over an open ``websockets`` connection that negotiated msgpack."""
        if transport.codec != "msgpack":
            raise ValueError("FastConnection needs a transport that negotiated msgpack")
        ws = transport.ws
        self._setup(transport.url, ws.protocol, timeouts, limits, PING_INTERVAL, PING_TIMEOUT)
        # Whatever websockets' reader queued is dropped: no reply is awaited yet.
        self._adopt(ws, replay=False)

    def _setup_requests(self) -> None:
        self._codec = MsgpackCodec(self._limits)
        self._ids = itertools.count(1)
        # request id -> (callback, deadline in loop time, timeout in seconds), in sending order
        self._pending: dict[int, tuple[ReplyCallback, float, float]] = {}
        self._stock: OpenSocket | None = None

    def _check_opened(self) -> None:
        if self._stock is not None:
            raise SubprotocolNotSelected(f"{self.url} did not select {SUBPROTOCOL}", url=self.url, transport=self._stock)

    @classmethod
    def _from_transport(cls, transport: OpenSocket, timeouts: Timeouts, limits: Limits) -> "FastConnection":
        if transport.codec != "msgpack":
            raise SubprotocolNotSelected(f"{transport.url} did not select {SUBPROTOCOL}", url=transport.url, transport=transport)
        return cls(transport, timeouts=timeouts, limits=limits)

    def _on_response(self, response: Response, events: list) -> list:
        if self._protocol.subprotocol != SUBPROTOCOL:
            self._hand_over(response, events)
            return []
        self._on_open()
        return events

    def _hand_over(self, response: Response, events: list) -> None:
        """The server speaks stock JSON: give the socket to a ``websockets`` connection."""
        transport = self._transport
        assert transport is not None
        ws = ClientConnection(self._protocol, ping_interval=PING_INTERVAL, ping_timeout=PING_TIMEOUT, close_timeout=self._timeouts.close)
        ws.connection_made(transport)
        transport.set_protocol(ws)
        self._transport = None
        opened(ws, self._request, response, events)
        self._stock = OpenSocket(ws, self.url, "json")
        self._failure = ConnectionLost(f"{self.url} speaks stock JSON", url=self.url)

    # ------------------------------------------------------------ public API

    def send_request(
        self,
        build: Callable[[int], dict[str, Any]] | Callable[[int], bytes],
        on_reply: ReplyCallback,
        timeout: float | None = None,
        *,
        raw: bool = False,
    ) -> int:
        """Send the message ``build(request_id)`` now; returns the request id.

        ``raw``: ``build`` makes the frame's bytes itself (a raw lane frame,
        :mod:`openenv_gym.protocol.lane`), not a message to encode; its reply
        may be a :class:`~openenv_gym.protocol.lane.RawBatch`.

        ``on_reply`` is called later, from the event loop's callback: with the
        :data:`FastReply`, or with a :class:`SessionTimeout` (no reply within
        ``timeout`` seconds, default ``Timeouts.step``; a late reply is
        dropped), :class:`ConnectionLost` or :class:`ProtocolError`. It is
        called once, except for a ``partial`` request: once per part of the
        results (a :class:`BatchReply` with ``last`` false), then once more
        with the last part or the error that ends the request. No task or
        future is created.

        Raises (at once, and ``on_reply`` is then never called):
            ConnectionLost, ProtocolError: the connection has already failed or closed.
            TypeError: the message cannot be encoded.

        A ``KeyboardInterrupt`` is raised too. In the encoding, ``on_reply``
        then gets an :class:`OpenEnvGymError` (nothing was sent). In the write,
        the connection is failed first: ``on_reply`` gets
        :class:`ConnectionLost`, as every request in flight on it does.
        """
        if self._failure is not None:
            raise self._failure
        if timeout is None:
            timeout = self._timeouts.step
        deadline = self._loop.time() + timeout
        rid = next(self._ids)
        self._pending[rid] = (on_reply, deadline, timeout)  # (before encoding and writing: see below)
        try:
            payload: bytes = build(rid) if raw else self._codec.encode(build(rid))  # type: ignore[assignment]
        except BaseException as exc:
            del self._pending[rid]  # nothing was sent
            if not isinstance(exc, Exception):
                # Interrupted (a Ctrl-C): the request fails, the connection and its sessions are fine.
                error = OpenEnvGymError(f"{self.url}: a request was interrupted before it was sent")
                self._loop.call_soon(on_reply, error)
            raise
        try:
            sent = self._send_message(payload, False)
        except BaseException:
            # Cut short (a Ctrl-C in the write): the frame may be half out, so the stream is done
            # for. Every request on it, this one too, gets ConnectionLost, and the interrupt goes on.
            self.abort(ConnectionLost(f"a write to {self.url} was interrupted; the connection is closed", url=self.url))
            raise
        if not sent:
            del self._pending[rid]
            raise self._failure or ConnectionLost(f"connection to {self.url} is closing", url=self.url)
        self._watch(deadline)
        return rid

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id``: its callback is never called; a late reply is dropped."""
        self._pending.pop(request_id, None)  # the deadline timer finds nothing to expire

    async def request(self, build: Callable[[int], dict[str, Any]], timeout: float | None = None) -> FastReply:
        """Send the message ``build(request_id)`` and wait for its reply.

        Raises:
            SessionTimeout: no reply within ``timeout`` (default ``Timeouts.step``) seconds.
            ConnectionLost, ProtocolError: the connection failed.
        """
        future: asyncio.Future[FastReply] = self._loop.create_future()
        rid = self.send_request(build, functools.partial(settle, future), timeout)
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

    # ------------------------------------------------------------ messages

    def _on_message(self, payload: bytes, text: bool) -> bool:
        """Decode one message and hand it to its request; ``False`` if the connection failed."""
        if text:
            self._fail(ProtocolError(f"{self.url}: expected a binary frame, got text"))
            return False
        if payload[:1] == _RAW:
            return self._on_raw(payload)
        try:
            reply = parse_fast_reply(self._codec.decode(payload))
        except ProtocolError as exc:
            self._fail(ProtocolError(f"{self.url}: {exc}"))
            return False
        except BaseException:
            # Interrupted (a Ctrl-C) while decoding: this reply is gone, and its request would wait
            # out its timeout. Fail the connection now instead, so that its sessions are repaired.
            self.abort(ConnectionLost(f"{self.url}: interrupted while reading a reply; the connection is closed", url=self.url))
            raise
        rid = reply.id
        if rid is None:
            # An error for a request the server could not read: ours are
            # always readable, so the stream is out of step.
            assert isinstance(reply, FastErrorReply)
            self._fail(ProtocolError(f"{self.url}: server could not read a request: {reply.error.message}"))
            return False
        if type(reply) is BatchReply and not reply.last:
            entry = self._pending.get(rid)  # one part of a partial request's results: more to come
        else:
            entry = self._pending.pop(rid, None)
        if entry is None:
            logger.debug("dropping reply to forgotten request %s from %s", rid, self.url)
            if type(reply) is OpenedReply and reply.sessions:
                # Opened for a request that timed out (a stalled server): nobody holds these sessions,
                # and the server would keep them, and their room, until the connection closes.
                self._close_orphans(reply.sessions)
            return True
        try:
            entry[0](reply)
        except Exception:
            logger.exception("reply callback for request %s on %s failed", rid, self.url)
        return True

    def _on_raw(self, payload: bytes) -> bool:
        """A raw batch (a lane's step answered in its fixed layout): to its request, unread (the lane reads it)."""
        try:
            kind, lane, rid = raw_header(payload)
            if kind != BATCH and kind != BATCH_AFTER:
                raise ProtocolError(f"a raw frame of kind {kind} from a server")
        except ProtocolError as exc:
            self._fail(ProtocolError(f"{self.url}: {exc}"))
            return False
        entry = self._pending.pop(rid, None)
        if entry is None:
            logger.debug("dropping raw reply to forgotten request %s from %s", rid, self.url)
            return True
        try:
            entry[0](RawBatch(rid, lane, bytes(payload), kind))
        except Exception:
            logger.exception("reply callback for request %s on %s failed", rid, self.url)
        return True

    def _close_orphans(self, sessions: list[int]) -> None:
        """Close sessions that a late ``opened`` reply named (best effort; the reply is not waited for)."""
        logger.info("closing %d session(s) %s opened after their request timed out", len(sessions), self.url)
        try:
            self.send_request(lambda rid: close_batch_request(rid, list(sessions)), lambda _: None, self._timeouts.close)
        except OpenEnvGymError:  # the connection is going: the server closes them with it
            pass

    def _deadline_passed(self, now: float) -> float | None:
        """Fail the requests past their deadline; the earliest deadline left."""
        late = [rid for rid, (_, deadline, _) in self._pending.items() if deadline <= now]
        for rid in late:
            on_reply, _, timeout = self._pending.pop(rid)
            error = SessionTimeout(f"no reply from {self.url} within {timeout} s", url=self.url, timeout=timeout)
            try:
                on_reply(error)
            except Exception:
                logger.exception("reply callback for request %s on %s failed", rid, self.url)
        return min((deadline for _, deadline, _ in self._pending.values()), default=None)

    def _fail_requests(self, error: OpenEnvGymError) -> None:
        pending, self._pending = self._pending, {}
        for rid, (on_reply, _, _) in pending.items():
            try:
                on_reply(error)
            except Exception:
                logger.exception("reply callback for request %s on %s failed", rid, self.url)
