"""A stock OpenEnv connection: one WebSocket is one session, JSON text frames, one request in flight.

Built on the same Sans-I/O plumbing as the fast path (:mod:`.websocket`): each
reply is decoded and parsed inside the event loop's ``data_received`` callback
and handed straight to the callback of the one request in flight
(:meth:`StockConnection.send_request`); no task, future or queue per message.

Stock replies carry no request id, so a reply cannot be matched to a request
except by order. Whenever the order may be broken (a request timed out or was
cancelled, a reply was malformed or came unasked) the connection is aborted
and never reused: a late reply would be read as the answer to the next
request (OpenEnv issue #1143).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any, Callable

from ..config import Limits, Timeouts
from ..errors import ConnectionLost, OpenEnvGymError, ProtocolError, SessionTimeout
from ..protocol.codec import JsonCodec
from ..protocol.messages import ErrorReply, Reply, close_request, parse_reply
from .open_socket import OpenSocket
from .websocket import PING_INTERVAL, PING_TIMEOUT, WebSocketConnection, settle

__all__ = ["StockConnection", "StockCallback"]

logger = logging.getLogger(__name__)

#: Called exactly once per request with the parsed reply (an
#: :class:`~openenv_gym.protocol.messages.ErrorReply` is a reply too), or with
#: the error that ended the wait (:class:`SessionTimeout`, :class:`ConnectionLost`,
#: :class:`ProtocolError`).
StockCallback = Callable[[Reply | OpenEnvGymError], None]

# Plain-Python messages (the pool's) skip building an encoder per message;
# anything else (numpy values, ...) goes through the codec.
_encode_plain = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class StockConnection(WebSocketConnection):
    """The client end of one stock OpenEnv session (JSON over ``/ws``).

    Open it with :meth:`connect`, or build it from a :class:`OpenSocket` whose
    codec is ``"json"`` (such as :attr:`SubprotocolNotSelected.transport
    <openenv_gym.client.fast_connection.SubprotocolNotSelected.transport>`): the
    connection takes over the transport's socket, and what the server already
    sent is kept. All methods must run on the event loop that opened it.

    A stock server that refuses the session (``CAPACITY_REACHED``,
    ``FACTORY_ERROR``, ...) says so right after the handshake and closes; that
    error reply is the answer to the first request.

    Attributes:
        url: the WebSocket URL.
    """

    codec = "json"

    # ------------------------------------------------------------ opening

    def __init__(self, transport: OpenSocket, *, timeouts: Timeouts, limits: Limits) -> None:
        """Take over an open ``websockets`` connection that negotiated no subprotocol."""
        if transport.codec != "json":
            raise ValueError("StockConnection needs a transport that speaks stock JSON")
        ws = transport.ws
        self._setup(transport.url, ws.protocol, timeouts, limits, PING_INTERVAL, PING_TIMEOUT)
        self._adopt(ws, replay=True)

    def _setup_requests(self) -> None:
        self._codec = JsonCodec(self._limits)
        # The request in flight: its callback, timeout (s) and deadline (loop time).
        self._waiting: StockCallback | None = None
        self._timeout = 0.0
        self._deadline = 0.0
        self._asked = False  # whether a request was ever sent
        self._refusal: ErrorReply | None = None  # sent before the first request

    # ------------------------------------------------------------ public API

    @property
    def busy(self) -> bool:
        """Whether a request is in flight."""
        return self._waiting is not None

    def send_request(self, message: dict[str, Any], on_reply: StockCallback, timeout: float | None = None) -> None:
        """Send ``message`` (a stock request, see :mod:`~openenv_gym.protocol.messages`) now.

        ``on_reply`` is called exactly once, later, from an event loop
        callback: with the parsed :data:`~openenv_gym.protocol.messages.Reply`,
        or with :class:`SessionTimeout` (no reply within ``timeout`` seconds,
        default ``Timeouts.step``), :class:`ConnectionLost` or
        :class:`ProtocolError` (a malformed reply). After a timeout or a
        malformed reply the connection is aborted. No task or future is created.

        Raises (at once, and ``on_reply`` is then never called):
            ConnectionLost, SessionTimeout, ProtocolError: the connection has
                already failed or closed (the error that ended it).
            RuntimeError: a request is already in flight.
            TypeError, ValueError: the message cannot be encoded as JSON.
        """
        refusal = self._refusal
        if refusal is not None:
            # The server refused the session before it was asked; that is the answer.
            self._refusal = None
            self._asked = True
            self._loop.call_soon(self._call, on_reply, refusal)
            return
        if self._failure is not None:
            raise self._failure
        if self._waiting is not None:
            raise RuntimeError(f"a request to {self.url} is already in flight; stock sessions take one at a time")
        try:
            data = _encode_plain(message).encode()  # (non-ASCII as UTF-8, as JsonCodec writes it)
        except (TypeError, UnicodeEncodeError):  # numpy values; lone surrogates, which the codec escapes
            data = self._codec.encode(message).encode()
        if not self._send_message(data, True):
            raise ConnectionLost(f"connection to {self.url} is closing", url=self.url)
        self._asked = True
        if timeout is None:
            timeout = self._timeouts.step
        deadline = self._loop.time() + timeout
        self._waiting = on_reply
        self._timeout = timeout
        self._deadline = deadline
        self._watch(deadline)  # (the timer stays armed between requests; it moves only for an earlier deadline)

    async def request(self, message: dict[str, Any], timeout: float | None = None) -> Reply:
        """Send ``message`` and wait for the reply (an error reply is returned, not raised).

        If the wait is cancelled, the connection is aborted.

        Raises:
            SessionTimeout: no reply within ``timeout`` (default ``Timeouts.step``) seconds.
            ConnectionLost, ProtocolError: the connection failed or the reply was malformed.
        """
        future: asyncio.Future[Reply] = self._loop.create_future()
        self.send_request(message, functools.partial(settle, future), timeout)
        try:
            return await future
        finally:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, even if our waiter was cancelled meanwhile
            else:  # cancelled while waiting (which cancels ``future`` too)
                self.abort(ConnectionLost(f"a request to {self.url} was cancelled; the session is closed", url=self.url))

    async def close(self) -> None:
        """End the session (a stock ``close`` message) and close the connection; idempotent.

        Bounded by ``Timeouts.close``; never raises.
        """
        if self._failure is None and self._waiting is None:
            self._send_message(self._codec.encode(close_request()).encode(), True)
        await super().close()

    # ------------------------------------------------------------ messages

    def _on_message(self, payload: bytes, text: bool) -> bool:
        """Parse one reply and hand it to the request in flight; ``False`` if the connection failed."""
        if not text:
            self._fail(ProtocolError(f"malformed reply from {self.url}: expected a text frame, got binary"))
            return False
        try:
            reply = parse_reply(self._codec.decode(payload.decode()))
        except UnicodeDecodeError as exc:
            self._fail(ProtocolError(f"malformed reply from {self.url}: invalid UTF-8: {exc}"))
            return False
        except ProtocolError as exc:
            self._fail(type(exc)(f"malformed reply from {self.url}: {exc}"))
            return False
        on_reply = self._waiting
        if on_reply is None:
            if not self._asked and self._refusal is None and isinstance(reply, ErrorReply) and reply.closes_connection:
                self._refusal = reply  # the server refuses the session; it closes next
                return True
            self._fail(ProtocolError(f"{self.url} sent a {type(reply).__name__} with no request in flight"))
            return False
        self._waiting = None
        self._call(on_reply, reply)
        return True

    def _deadline_passed(self, now: float) -> float | None:
        if self._waiting is None:
            return None  # answered in time; the next request arms the timer again
        if now < self._deadline:
            return self._deadline
        # The server may still answer, and that answer would be taken for the next one's.
        timeout = self._timeout
        self.abort(SessionTimeout(f"no reply from {self.url} within {timeout} s; the session is closed", url=self.url, timeout=timeout))
        return None

    def _fail_requests(self, error: OpenEnvGymError) -> None:
        on_reply, self._waiting = self._waiting, None
        if on_reply is not None:
            self._call(on_reply, error)

    def _call(self, on_reply: StockCallback, result: Reply | OpenEnvGymError) -> None:
        try:
            on_reply(result)
        except Exception:
            logger.exception("reply callback on %s failed", self.url)
