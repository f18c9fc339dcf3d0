"""A fast-path connection: many sessions on one WebSocket, several requests in flight.

A reader task receives every reply and hands it to the request that named its
id. A request that times out only forgets its id: a reply that arrives later
is recognised and dropped, so the connection and its other sessions go on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable

from websockets.exceptions import ConnectionClosed

from ..config import Limits, Timeouts
from ..errors import ConnectionLost, OpenEnvGymError, ProtocolError, SessionTimeout
from ..protocol.codec import MsgpackCodec
from ..protocol.fast import (
    ClosedReply,
    FastErrorReply,
    FastReply,
    OpenedReply,
    close_batch_request,
    open_request,
    parse_fast_reply,
)
from .transport import Transport

__all__ = ["FastConnection"]

logger = logging.getLogger(__name__)


class FastConnection:
    """The client end of one ``openenv.msgpack.v1`` connection.

    Build it from a :class:`Transport` whose codec is ``"msgpack"``.
    All methods must run on the event loop that opened the transport.
    """

    def __init__(self, transport: Transport, *, timeouts: Timeouts, limits: Limits) -> None:
        if transport.codec != "msgpack":
            raise ValueError("FastConnection needs a transport that negotiated msgpack")
        self.url = transport.url
        self._ws = transport.ws
        self._codec = MsgpackCodec(limits)
        self._timeouts = timeouts
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[FastReply]] = {}
        self._failure: OpenEnvGymError | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"openenv-gym reader {self.url}")

    @property
    def closed(self) -> bool:
        """Whether the connection has failed or been closed."""
        return self._failure is not None

    def next_id(self) -> int:
        """A fresh request id."""
        return next(self._ids)

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                try:
                    reply = parse_fast_reply(self._codec.decode(frame))
                except ProtocolError as exc:
                    self._fail(ProtocolError(f"{self.url}: {exc}"))
                    return
                if reply.id is None:
                    # An error for a request the server could not read: ours are
                    # always readable, so the stream is out of step.
                    assert isinstance(reply, FastErrorReply)
                    self._fail(ProtocolError(f"{self.url}: server could not read a request: {reply.error.message}"))
                    return
                future = self._pending.pop(reply.id, None)
                if future is None:
                    logger.debug("dropping reply to forgotten request %s from %s", reply.id, self.url)
                elif not future.done():
                    future.set_result(reply)
            rcvd = self._ws.protocol.close_rcvd
            self._fail(
                ConnectionLost(
                    f"{self.url} closed the connection"
                    + (f" ({rcvd.code} {rcvd.reason})" if rcvd else ""),
                    url=self.url,
                    code=rcvd.code if rcvd else None,
                    reason=rcvd.reason if rcvd else None,
                )
            )
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            self._fail(
                ConnectionLost(
                    f"connection to {self.url} lost" + (f" ({rcvd.code} {rcvd.reason})" if rcvd else ""),
                    url=self.url,
                    code=rcvd.code if rcvd else None,
                    reason=rcvd.reason if rcvd else None,
                )
            )
        except asyncio.CancelledError:
            self._fail(ConnectionLost(f"connection to {self.url} closed by the client", url=self.url))
            raise
        except Exception as exc:  # pragma: no cover - defensive: never leave requests hanging
            self._fail(ConnectionLost(f"connection to {self.url} failed: {exc!r}", url=self.url))

    def _fail(self, error: OpenEnvGymError) -> None:
        if self._failure is None:
            self._failure = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._failure)
        if isinstance(error, ProtocolError):
            # The stream is out of step: nothing more on it can be trusted.
            self._ws.transport.abort()

    async def request(self, build: Callable[[int], dict[str, Any]], timeout: float | None = None) -> FastReply:
        """Send the message ``build(request_id)`` and wait for its reply.

        Raises:
            SessionTimeout: no reply within ``timeout`` (default ``Timeouts.step``) seconds.
            ConnectionLost, ProtocolError: the connection failed.
        """
        if self._failure is not None:
            raise self._failure
        rid = self.next_id()
        future: asyncio.Future[FastReply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        timeout = self._timeouts.step if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                await self._ws.send(self._codec.encode(build(rid)))
                return await future
        except TimeoutError:
            raise SessionTimeout(f"no reply from {self.url} within {timeout} s", url=self.url, timeout=timeout) from None
        except ConnectionClosed:
            if self._failure is None:
                self._fail(ConnectionLost(f"connection to {self.url} lost", url=self.url))
            raise self._failure from None
        finally:
            self._pending.pop(rid, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the reader may have failed it while we left

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
        """Close the connection (bounded by ``Timeouts.close``); idempotent."""
        if self._failure is None:
            self._failure = ConnectionLost(f"connection to {self.url} closed by the client", url=self.url)
        try:
            async with asyncio.timeout(self._timeouts.close):
                await self._ws.close()
        except (TimeoutError, OSError):
            self._ws.transport.abort()
        self._reader.cancel()
        try:
            await self._reader
        except (asyncio.CancelledError, Exception):
            pass
        self._fail(self._failure)

