"""One client WebSocket on websockets' Sans-I/O protocol, moved by a plain :class:`asyncio.Protocol`.

The part that the fast-path connection (:class:`~openenv_gym.client.fast_connection.FastConnection`)
and the stock one (:class:`~openenv_gym.client.stock_connection.StockConnection`) share:
opening (TCP, TLS, the opening handshake), taking over an open ``websockets``
connection, keepalive pings, the closing handshake, reassembling fragmented
messages, and failing whatever is in flight when the connection fails.

No reader task, no per-message locks or queues: bytes go from the socket to
websockets' :class:`~websockets.client.ClientProtocol` inside the event loop's
``data_received`` callback, and each whole message goes to the subclass's
:meth:`WebSocketConnection._on_message`. What a message means, and who waits
for it, is the subclass's business.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl as ssl_module
import struct
from typing import Any, Iterable, Mapping, Self, Sequence

from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, InvalidURI, PayloadTooBig
from websockets.frames import OK_CLOSE_CODES, CloseCode, Opcode, apply_mask
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.proxy import get_proxy
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from .._internals import connection_lost, current_size, reading_paused, stop_keepalive, take_read_frames, unparsed_bytes
from .._reads import read_in_chunks
from .._urls import is_loopback, socket_of, ws_url
from ..config import Limits, Timeouts
from ..errors import ConnectError, ConnectionLost, LimitExceeded, OpenEnvGymError, ProtocolError, refused_because
from .open_socket import PROTOCOL_LOGGER, OpenSocket, open_socket

__all__ = ["WebSocketConnection", "PING_INTERVAL", "PING_TIMEOUT", "USER_AGENT", "settle", "client_frame"]


def client_frame(payload: bytes, opcode: int, key: bytes) -> bytes:
    """One unfragmented client frame (RFC 6455 section 5.2): FIN, ``opcode``, masked with the 4-byte ``key``."""
    n, first = len(payload), 0x80 | opcode
    if n < 126:
        header = bytes((first, 0x80 | n))
    elif n < 0x10000:
        header = struct.pack("!BBH", first, 0xFE, n)
    else:
        header = struct.pack("!BBQ", first, 0xFF, n)
    return header + key + apply_mask(payload, key)


logger = logging.getLogger(__name__)

CONT, TEXT, BINARY, CLOSE, PONG = Opcode.CONT, Opcode.TEXT, Opcode.BINARY, Opcode.CLOSE, Opcode.PONG

#: Keepalive defaults, in seconds (as websockets' own).
PING_INTERVAL = 20.0
PING_TIMEOUT = 20.0

USER_AGENT = "openenv-gym"

#: Masking keys are drawn from ``os.urandom`` this many bytes at a time.
MASK_POOL_BYTES = 4096


class _MaskKeys:
    """Fresh 4-byte masking keys from the OS's entropy, one ``os.urandom`` call per 1024 keys.

    websockets draws each key with its own ``os.urandom(4)``, a system call per
    frame sent; RFC 6455 asks for unpredictable keys, not for a call each.
    """

    __slots__ = ("_pool", "_at")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool = os.urandom(MASK_POOL_BYTES)
            at = 0
        self._at = at + 4
        return self._pool[at : at + 4]


_mask_keys = _MaskKeys()


def settle(future: asyncio.Future, result: Any) -> None:
    """A reply callback that completes ``future`` (an exception result is raised by it)."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class WebSocketConnection(asyncio.Protocol):
    """The client end of one WebSocket; subclasses give its messages a meaning.

    Subclasses implement :meth:`_on_message` (one whole message arrived) and
    :meth:`_fail_requests` (the connection failed: tell everyone waiting), and
    may override :meth:`_on_response` (the handshake's answer arrived). All
    methods must run on the event loop that opened the connection.

    The :class:`asyncio.Protocol` methods (``connection_made``,
    ``data_received``, ...) are called by the event loop, not by users.

    Writes never wait: if the socket's buffer fills, the transport keeps
    buffering. Keepalive: the server's pings are answered at once; we ping
    every ``ping_interval`` seconds and declare the connection lost when no
    pong comes within ``ping_timeout`` seconds.

    Attributes:
        url: the WebSocket URL.
    """

    # ------------------------------------------------------------ opening

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
        sizes = [size for size in (protocol.max_message_size, protocol.max_fragment_size) if size is not None]
        self._max_size = min(sizes, default=1 << 63)
        self._transport: asyncio.Transport | None = None
        self._timeouts = timeouts
        self._limits = limits
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
        self._request: Request | None = None
        self._adopted: ClientConnection | None = None
        # One timer for every reply deadline, armed for the earliest: no timer made per request.
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._setup_requests()

    def _setup_requests(self) -> None:
        """Set up the subclass's request state (codec, requests in flight); part of :meth:`_setup`."""

    #: The subprotocols the handshake offers (none: the stock OpenEnv JSON protocol).
    SUBPROTOCOLS: tuple[str, ...] = ()

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
    ) -> Self:
        """Open a connection to ``base_url``'s ``/ws`` within ``timeouts.connect`` seconds.

        Offers :attr:`SUBPROTOCOLS` and nothing else (no compression): the fast
        path's ``openenv.msgpack.v1`` for a :class:`~.fast_connection.FastConnection`,
        none for a :class:`~.stock_connection.StockConnection`.

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
            SubprotocolNotSelected: (fast path) the server speaks stock JSON; the
                exception carries the open connection as a stock :class:`OpenSocket`.
            ConnectError: refused, unreachable, TLS or handshake failure, or timeout.
        """
        self = await cls._open(
            base_url,
            subprotocols=cls.SUBPROTOCOLS,
            headers=headers,
            timeouts=timeouts,
            limits=limits,
            ssl=ssl,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
        )
        self._check_opened()
        return self

    def _check_opened(self) -> None:
        """Raise if the connection, open now, does not speak what it offered (see :meth:`connect`)."""

    @classmethod
    async def _open(
        cls,
        base_url: str,
        *,
        subprotocols: Sequence[str],
        headers: Mapping[str, str] | None,
        timeouts: Timeouts | None,
        limits: Limits | None,
        ssl: ssl_module.SSLContext | None,
        ping_interval: float | None,
        ping_timeout: float | None,
    ) -> Any:
        """Connect to ``base_url``'s ``/ws`` within ``timeouts.connect`` seconds, offering ``subprotocols``.

        No extension (compression) is offered. Through a proxy, websockets'
        own client opens the connection and :meth:`_from_transport` takes it over.

        Raises:
            ConnectError: refused, unreachable, TLS or handshake failure, or timeout.
        """
        timeouts = timeouts or Timeouts()
        limits = limits or Limits()
        try:
            socket_path, url = socket_of(base_url, tls=ssl is not None)
            uri = parse_uri(ws_url(base_url))
        except (ValueError, InvalidURI) as exc:
            raise ConnectError(f"cannot connect to {base_url}: {exc}", url=base_url) from None
        if socket_path is None and not is_loopback(url) and get_proxy(uri) is not None:
            transport = await open_socket(
                base_url, headers=headers, timeouts=timeouts, limits=limits, offer_msgpack=bool(subprotocols), ssl=ssl
            )
            return cls._from_transport(transport, timeouts, limits)

        self = cls.__new__(cls)
        protocol = ClientProtocol(
            uri, subprotocols=[Subprotocol(s) for s in subprotocols] or None, max_size=limits.max_frame_bytes, logger=PROTOCOL_LOGGER
        )
        self._setup(url, protocol, timeouts, limits, ping_interval, ping_timeout)
        self._opening = self._loop.create_future()
        tls = ssl if ssl is not None else (True if uri.secure else None)
        try:
            async with asyncio.timeout(timeouts.connect):
                if socket_path is not None:
                    await self._loop.create_unix_connection(lambda: self, socket_path)
                else:
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
        refusal = protocol.handshake_exc
        if refusal is not None:
            self._abort()
            if isinstance(refusal, InvalidStatus):
                status = refusal.response.status_code
                raise ConnectError(f"{url} refused the WebSocket handshake with HTTP {status}{refused_because(status)}", url=url) from None
            raise ConnectError(f"cannot connect to {url}: {refusal}", url=url) from None
        return self

    @classmethod
    def _from_transport(cls, transport: OpenSocket, timeouts: Timeouts, limits: Limits) -> Any:
        """The connection for a ``websockets`` connection opened through a proxy."""
        return cls(transport, timeouts=timeouts, limits=limits)  # type: ignore[call-arg]

    def _adopt(self, ws: ClientConnection, *, replay: bool) -> None:
        """Take over the socket of an open ``websockets`` connection (after :meth:`_setup`).

        Messages ``ws`` has already read are handed to :meth:`_on_message` when
        ``replay``, else dropped.
        """
        self._adopted = ws  # keeps the protocol's logger adapter's referent alive
        stop_keepalive(ws)
        frames = take_read_frames(ws)
        lost = connection_lost(ws)
        if not lost:
            self._transport = ws.transport
            ws.transport.set_protocol(self)
            read_in_chunks(ws.transport)
            if reading_paused(ws):
                ws.transport.resume_reading()
        if replay:
            self._on_frames(frames)
        if lost:
            self._closed.set_result(None)
            self._fail(self._lost())
        elif self._failure is None:
            self._on_open()

    def _on_handshake(self, events: list) -> list:
        """Handle what arrived during the opening handshake; returns the frames left to dispatch."""
        for i, event in enumerate(events):
            if not isinstance(event, Response):
                continue
            opening, self._opening = self._opening, None
            rest = events[i + 1 :]
            if self._protocol.handshake_exc is None:
                rest = self._on_response(event, rest)
            else:
                rest = []
            if opening is not None and not opening.done():
                opening.set_result(None)
            return rest
        return []

    def _on_response(self, response: Response, events: list) -> list:
        """The server accepted the handshake; returns the frames left to dispatch. Override to vet it."""
        self._on_open()
        return events

    def _on_open(self) -> None:
        if self._ping_interval is not None:
            self._ping_handle = self._loop.call_later(self._ping_interval, self._ping)

    # ------------------------------------------------------------ for subclasses

    def _on_message(self, payload: bytes, text: bool) -> bool:  # pragma: no cover - interface
        """One whole message arrived (``text``: a text message, else binary).

        Returns ``False`` if the connection failed on it (nothing more is dispatched).
        """
        raise NotImplementedError

    def _fail_requests(self, error: OpenEnvGymError) -> None:  # pragma: no cover - interface
        """The connection failed with ``error``: call everyone waiting for a reply with it."""
        raise NotImplementedError

    def _deadline_passed(self, now: float) -> float | None:  # pragma: no cover - interface
        """The deadline timer fired at ``now`` (loop time): fail what is late; the next deadline, if any."""
        raise NotImplementedError

    # ------------------------------------------------------------ deadlines

    def _watch(self, deadline: float) -> None:
        """Make sure :meth:`_deadline_passed` runs by ``deadline`` (loop time)."""
        timer = self._deadline_timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._deadline_timer = self._loop.call_at(deadline, self._on_deadline_timer)

    def _unwatch(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def _on_deadline_timer(self) -> None:
        self._deadline_timer = None
        upcoming = self._deadline_passed(self._loop.time())
        if upcoming is not None:
            self._watch(upcoming)

    # ------------------------------------------------------------ public API

    def direct_reader(self) -> "tuple[int, WebSocketConnection, asyncio.Transport] | None":
        """``(file descriptor, self, transport)``, when a waiting caller may read the socket itself and hand the bytes to :meth:`data_received`.

        Only for an open connection on a plain TCP or Unix socket (not TLS)
        whose transport is reading and not closing (see
        :meth:`LoopThread.run_started`); else ``None``.
        """
        transport = self._transport
        if transport is None or self._failure is not None or transport.is_closing() or not transport.is_reading():
            return None
        if transport.get_extra_info("sslcontext") is not None:
            return None
        sock = transport.get_extra_info("socket")
        fd = -1 if sock is None else sock.fileno()
        return None if fd < 0 else (fd, self, transport)

    @property
    def closed(self) -> bool:
        """Whether the connection has failed or been closed."""
        return self._failure is not None

    async def wait_closed(self) -> None:
        """Wait until the TCP connection is closed (by either side)."""
        await asyncio.shield(self._closed)

    def abort(self, error: OpenEnvGymError | None = None) -> None:
        """Drop the connection now, without a closing handshake; idempotent.

        Requests in flight get ``error`` (default: :class:`ConnectionLost`),
        and so does every later request.
        """
        self._fail(error or ConnectionLost(f"connection to {self.url} closed by the client", url=self.url))
        self._abort()

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
        read_in_chunks(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - platform quirk
                pass

    def data_received(self, data: bytes) -> None:
        protocol = self._protocol
        # The common case, parsed here: ``data`` is exactly one whole, unmasked,
        # unfragmented text or binary frame, and the protocol holds nothing
        # half-read. The protocol has nothing to do for such a frame.
        if len(data) > 1 and protocol.state is OPEN and current_size(protocol) is None and not unparsed_bytes(protocol):
            first, length = data[0], data[1]
            if first == 0x81 or first == 0x82:  # FIN, no RSV bits, text or binary
                if length < 126:  # (an unmasked 7-bit length)
                    start = 2
                elif length == 126 and len(data) > 3:
                    start, length = 4, (data[2] << 8) | data[3]
                else:
                    start = 0
                if start and len(data) == start + length and length <= self._max_size:
                    self._on_message(data[start:], first == 0x81)
                    return
        try:
            protocol.receive_data(data)
            events = protocol.events_received()
        except BaseException:
            # Interrupted inside websockets' parser (a KeyboardInterrupt): the parser is
            # gone, so is the stream. Fail the connection now, so that it is repaired.
            self._fail(ConnectionLost(f"{self.url}: interrupted while reading a frame", url=self.url))
            self._abort()
            raise
        self._flush()  # pongs, close echoes
        if self._opening is not None:
            events = self._on_handshake(events)
        if events:
            self._on_frames(events)
        if protocol.parser_exc is not None and self._failure is None:
            exc = protocol.parser_exc
            if isinstance(exc, PayloadTooBig):
                self._fail(LimitExceeded(f"{self.url}: {exc}"))
            else:
                self._fail(ProtocolError(f"{self.url}: invalid WebSocket frame: {exc}"))

    def eof_received(self) -> bool | None:
        try:
            self._protocol.receive_eof()
            self._protocol.events_received()
        except Exception:  # the parser died earlier (see data_received): connection_lost follows
            return None
        self._flush()
        return None  # let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        protocol = self._protocol
        try:
            protocol.receive_eof()  # idempotent; the protocol is CLOSED now
            protocol.data_to_send()
        except Exception:  # the parser died earlier (see data_received)
            pass
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

    def _on_frames(self, frames: Iterable[Any]) -> None:
        """Reassemble messages from ``frames`` and dispatch them; handle pongs and the close frame."""
        for frame in frames:
            opcode = frame.opcode
            if opcode is TEXT or opcode is BINARY:
                if frame.fin:
                    if not self._on_message(frame.data, opcode is TEXT):
                        return
                else:
                    self._fragments, self._fragmented_text = [frame.data], opcode is TEXT
            elif opcode is CONT:
                assert self._fragments is not None  # the protocol checks the sequence
                if len(self._fragments) >= self._limits.max_fragments:
                    self._fragments = None
                    self._fail(LimitExceeded(f"{self.url}: a message of more than {self._limits.max_fragments} fragments"))
                    self._abort()
                    return
                self._fragments.append(frame.data)
                if frame.fin:
                    payload, self._fragments = b"".join(self._fragments), None
                    if not self._on_message(payload, self._fragmented_text):
                        return
            elif opcode is PONG:
                self._pong(frame.data)
            elif opcode is CLOSE:
                self._fail(self._lost())
                # The server closes the TCP connection next; don't wait forever.
                self._close_handle = self._loop.call_later(self._timeouts.close, self._abort)
            # PING: the protocol queued the pong, already written.

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

    def _send_message(self, payload: bytes, text: bool) -> bool:
        """Frame (unfragmented, masked) and write one message now; ``False`` if the connection is not open.

        Equivalent to websockets' ``send_text``/``send_binary`` with no
        extension, minus a system call per frame for the masking key. Safe
        because whatever the protocol queues is written at once (:meth:`_flush`),
        and we never fragment, so frames cannot interleave.
        """
        transport = self._transport
        if transport is None or self._protocol.state is not OPEN:
            return False
        transport.write(client_frame(payload, 0x1 if text else 0x2, _mask_keys.next()))
        return True

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
        self._unwatch()  # nothing is waited for any more
        self._fail_requests(self._failure)
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
        self._fail(ConnectionLost(f"connection to {self.url} lost: no pong within {self._ping_timeout} s", url=self.url))
        self._abort()
