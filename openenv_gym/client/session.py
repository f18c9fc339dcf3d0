"""An asyncio client for one environment session on an OpenEnv server.

``Session`` speaks whatever the server selected in the handshake:

- stock OpenEnv (JSON text frames): one connection is the session, one request
  is in flight at a time, and replies carry no id. A session whose request
  timed out, was cancelled or got a malformed reply is closed and never reused,
  since a late reply would be read as the answer to the next request (OpenEnv
  issue #1143).
- the fast path (``openenv.msgpack.v1``): the session is one of the
  connection's sessions, requests carry ids, and arrays travel as raw bytes.

Either way the caller sees the same methods and the same
:class:`~openenv_gym.protocol.messages.StepReply`.
"""

from __future__ import annotations

import asyncio
import math
import ssl as ssl_module
from typing import Any, Mapping

from ..config import Limits, Timeouts
from ..errors import ConnectionLost, OpenEnvGymError, ProtocolError
from ..protocol import multiplex as fastp
from ..protocol.messages import (
    ErrorReply,
    StateReply,
    StepReply,
    reset_request,
    state_request,
    step_request,
)
from .fast_connection import FastConnection, SubprotocolNotSelected
from .open_socket import OpenSocket
from .stock_connection import StockConnection

__all__ = ["Session"]


class Session:
    """One server-side environment session.

    Open it with :meth:`connect`; use it as ``async with`` or call :meth:`close`.
    All methods must be awaited on the event loop that connected it.

    Attributes:
        url: the WebSocket URL.
        codec: ``"msgpack"`` on the fast path, ``"json"`` on a stock server.
    """

    def __init__(
        self,
        transport: OpenSocket | None,
        *,
        timeouts: Timeouts,
        limits: Limits,
        fast: FastConnection | None = None,
        stock: StockConnection | None = None,
    ) -> None:
        """Wrap a stock ``transport`` (its socket is taken over), a ``fast`` connection or a ``stock`` one."""
        if fast is None and stock is None:
            if transport is None:
                raise ValueError("a Session needs a stock transport or connection, or a fast connection")
            stock = StockConnection(transport, timeouts=timeouts, limits=limits)
        self.url = fast.url if fast is not None else stock.url  # type: ignore[union-attr]
        self.codec = "msgpack" if fast is not None else "json"
        self._stock: StockConnection | None = stock  # the stock path's connection
        self._timeouts = timeouts
        self._limits = limits
        self._fast: FastConnection | None = fast
        self._sid = -1  # the fast path's session id (-1: none yet)
        self._lost: OpenEnvGymError | None = None
        self._busy = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
        offer_msgpack: bool = True,
        ssl: ssl_module.SSLContext | None = None,
    ) -> "Session":
        """Open a session on the server at ``base_url``.

        Args:
            base_url: ``http(s)://host:port[/prefix]`` or ``ws(s)://host:port[/prefix][/ws]``.
            headers: extra handshake headers, for example ``{"Authorization": "Bearer ..."}``.
            timeouts: connect and per-message timeouts (defaults: :class:`Timeouts`).
            limits: frame, array and nesting limits for what the server sends.
            offer_msgpack: offer the fast path; ``False`` forces stock JSON.
            ssl: TLS context for ``wss://`` / ``https://``.

        Raises:
            ConnectError: the connection could not be opened in time.
            CapacityError: (fast path) the server is full. A stock server reports
                a full house on the first request instead.
        """
        timeouts = timeouts or Timeouts()
        limits = limits or Limits()
        if not offer_msgpack:
            stock = await StockConnection.connect(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)
            return cls(None, timeouts=timeouts, limits=limits, stock=stock)
        try:
            fast = await FastConnection.connect(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)
        except SubprotocolNotSelected as stock:  # a stock server: JSON on the same socket
            return cls(stock.transport, timeouts=timeouts, limits=limits)
        session = cls(None, timeouts=timeouts, limits=limits, fast=fast)
        try:
            (session._sid,) = await fast.open_sessions(1, timeouts.connect)
        except BaseException:
            session._abort(None)
            raise
        return session

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether the session can no longer be used (closed, lost or timed out)."""
        connection = self._fast if self._fast is not None else self._stock
        return self._lost is not None or (connection is not None and connection.closed)

    # ------------------------------------------------------------ requests

    async def reset(self, seed: int | None = None, **kwargs: Any) -> StepReply:
        """Start a new episode. ``seed`` and ``kwargs`` are passed to the env's ``reset``.

        Stock servers silently drop keyword arguments that the environment's
        ``reset`` does not accept.
        """
        if self._fast is not None:
            return await self._fast_step_like(lambda rid: fastp.reset_batch_request(rid, [self._sid], [seed], kwargs or None))
        return self._expect_step(await self._stock_request(reset_request(seed, **kwargs)))

    async def step(self, action: Mapping[str, Any]) -> StepReply:
        """Take one step. ``action`` maps the action's field names to values (``{"action": 1}`` for a Gymnasium env).

        Raises:
            TypeError: ``action`` is not a mapping.
        """
        if not isinstance(action, Mapping):
            raise TypeError(f"Session.step takes a mapping of the action's fields, such as {{'action': 1}}; got {type(action).__name__}")
        if self._fast is not None:
            columns = {name: [value] for name, value in action.items()}
            return await self._fast_step_like(lambda rid: fastp.step_batch_request(rid, [self._sid], columns))
        return self._expect_step(await self._stock_request(step_request(action)))

    async def state(self) -> dict[str, Any]:
        """The environment's state fields (for example ``episode_id``, ``step_count``)."""
        if self._fast is not None:
            reply = await self._fast_request(lambda rid: fastp.state_batch_request(rid, [self._sid]))
            if not isinstance(reply, fastp.StatesReply):
                raise self._malformed(f"expected states, got {type(reply).__name__}")
            return reply.states[0]
        reply = await self._stock_request(state_request())
        if not isinstance(reply, StateReply):
            raise self._malformed(f"expected a state reply, got {type(reply).__name__}")
        return reply.data

    async def close(self) -> None:
        """End the session and close the connection. Idempotent; never raises."""
        if self._fast is not None:
            if self._lost is None and not self._fast.closed and self._sid >= 0:
                await self._fast.close_sessions([self._sid])
            self._lost = self._lost or ConnectionLost(f"session on {self.url} is closed", url=self.url)
            await self._fast.close()
            return
        if self._lost is not None:
            self._abort(self._lost)
            return
        self._lost = ConnectionLost(f"session on {self.url} is closed", url=self.url)
        assert self._stock is not None
        await self._stock.close()

    # ------------------------------------------------------------ stock path

    async def _stock_request(self, message: dict[str, Any]):
        if self._lost is not None:
            raise self._lost
        stock = self._stock
        assert stock is not None
        async with self._busy:
            try:
                reply = await stock.request(message, self._timeouts.step)
            except OpenEnvGymError as exc:
                # Timed out, malformed or lost: the connection has dropped itself.
                self._lost = exc
                stock.abort(exc)
                raise
            except asyncio.CancelledError:
                # The connection has dropped itself: a late reply would be misread.
                self._lost = ConnectionLost(f"a request to {self.url} was cancelled; the session is closed", url=self.url)
                raise
        return self._stock_checked(reply)

    def _stock_checked(self, reply: Any) -> Any:
        """``reply``, unless it is an error: then that error is raised (closing the session if it says so)."""
        if isinstance(reply, ErrorReply):
            error = reply.exception(self.url)
            if reply.closes_connection:
                self._abort(error)
            raise error
        return reply

    def _expect_step(self, reply: Any) -> StepReply:
        if not isinstance(reply, StepReply):
            # Not awaited here: the caller raises; the socket is dropped now.
            self._lost = ProtocolError(f"{self.url}: expected an observation, got {type(reply).__name__}")
            assert self._stock is not None
            self._stock.abort(self._lost)
            raise self._lost
        return reply

    def _malformed(self, what: str) -> ProtocolError:
        error = ProtocolError(f"malformed reply from {self.url}: {what}")
        self._abort(error)
        return error

    def _abort(self, error: OpenEnvGymError | None) -> None:
        if self._lost is None:
            self._lost = error or ConnectionLost(f"session on {self.url} is closed", url=self.url)
        # No closing handshake: a peer that stalled or garbled would make us wait for it too.
        connection = self._fast if self._fast is not None else self._stock
        assert connection is not None
        connection.abort(self._lost)

    # ------------------------------------------------------------ fast path

    async def _fast_request(self, build) -> fastp.FastReply:
        if self._lost is not None:
            raise self._lost
        assert self._fast is not None
        try:
            reply = await self._fast.request(build)
        except asyncio.CancelledError:
            # As after a timeout: the server may still run the request, so this session is out of step.
            self._lost = ConnectionLost(f"a request to {self.url} was cancelled; the session is closed", url=self.url)
            self._fast.abort(self._lost)
            raise
        except OpenEnvGymError as exc:
            # Timed out (the server may still be running the request: this session is out of step),
            # lost or garbled: close it. The connection is this session's alone.
            self._abort(exc)
            raise
        return self._checked(reply)

    def _checked(self, reply: fastp.FastReply) -> fastp.FastReply:
        """``reply``, unless it is an error: then that error is raised (closing the session if it says so)."""
        if isinstance(reply, fastp.FastErrorReply):
            error = reply.error.exception(self.url)
            if reply.error.closes_connection:
                self._abort(error)
            raise error
        return reply

    async def _fast_step_like(self, build) -> StepReply:
        return self._step_reply(await self._fast_request(build))

    def _step_reply(self, reply: fastp.FastReply) -> StepReply:
        """The :class:`StepReply` in a fast-path batch for this session; the error it carries is raised."""
        if not isinstance(reply, fastp.BatchReply) or reply.sessions != [self._sid]:
            raise self._malformed(f"expected a batch for session {self._sid}, got {reply!r}")
        if reply.errors is not None and reply.errors[0] is not None:
            error = reply.errors[0].exception(self.url)
            if reply.errors[0].closes_connection:
                self._abort(error)
            raise error
        observation = {name: column[0] for name, column in reply.observation.items()}
        reward = float(reply.reward[0])
        metadata = reply.metadata[0] if reply.metadata is not None else {}
        return StepReply(observation, None if math.isnan(reward) else reward, bool(reply.done[0]), metadata)

    def _can_start_step(self) -> bool:
        """Whether :meth:`_start_step` or :meth:`_start_reset` may send now (no other request of this session in flight)."""
        if self._fast is not None:
            return True
        return not self._busy.locked() and self._stock is not None and not self._stock.busy

    def _start_step(self, action: Mapping[str, Any], future: "asyncio.Future[StepReply]") -> None:
        """:meth:`step` without a coroutine, for a caller that drives the loop itself (see :meth:`_start`)."""
        columns = {name: [value] for name, value in action.items()}
        self._start(lambda rid: fastp.step_batch_request(rid, [self._sid], columns), lambda: step_request(action), future)

    def _start_reset(self, seed: int | None, kwargs: Mapping[str, Any], future: "asyncio.Future[StepReply]") -> None:
        """:meth:`reset` without a coroutine, for a caller that drives the loop itself (see :meth:`_start`)."""
        self._start(
            lambda rid: fastp.reset_batch_request(rid, [self._sid], [seed], dict(kwargs) or None),
            lambda: reset_request(seed, **kwargs),
            future,
        )

    def _start(self, fast_request, stock_request, future: "asyncio.Future[StepReply]") -> None:
        """Send a step or reset now; ``future`` gets the :class:`StepReply` or the exception the coroutine would raise.

        The wait is bounded by the step timeout. Cancelling ``future`` once
        the request is sent closes the session, as cancelling the coroutine
        does. Call it on the session's event loop, when
        :meth:`_can_start_step` says so. ``fast_request(request_id)`` and
        ``stock_request()`` build the message for either path.
        """
        if self._lost is not None:
            future.set_exception(self._lost)
            return

        def on_reply(reply: Any) -> None:
            if future.done():  # (cancelled: the session is closed already)
                return
            # (Settled, not cancelled: no callback to queue, which would keep the next step off the direct wait.)
            future.remove_done_callback(self._step_let_go)
            if isinstance(reply, OpenEnvGymError):  # timed out, lost or garbled
                self._abort(reply)
                future.set_exception(reply)
                return
            try:
                if self._fast is not None:
                    future.set_result(self._step_reply(self._checked(reply)))
                else:
                    future.set_result(self._expect_step(self._stock_checked(reply)))
            except Exception as exc:
                future.set_exception(exc)

        try:
            if self._fast is not None:
                self._fast.send_request(fast_request, on_reply)
            else:
                assert self._stock is not None
                self._stock.send_request(stock_request(), on_reply, self._timeouts.step)
        except OpenEnvGymError as exc:
            self._abort(exc)
            future.set_exception(exc)
            return
        except Exception as exc:  # (an action the codec cannot encode: nothing was sent)
            future.set_exception(exc)
            return
        future.add_done_callback(self._step_let_go)

    def _direct_readers(self) -> "tuple[tuple[int, Any, Any], ...] | None":
        """The socket a :meth:`_start_step` reply comes on, for a caller that may read it itself (see ``run_started``)."""
        connection = self._fast if self._fast is not None else self._stock
        reader = connection.direct_reader() if connection is not None else None
        return None if reader is None else (reader,)

    def _step_let_go(self, future: "asyncio.Future[StepReply]") -> None:
        if future.cancelled() and self._lost is None:
            # As after a timeout: the server may still run the step, so this session is out of step.
            self._abort(ConnectionLost(f"a request to {self.url} was cancelled; the session is closed", url=self.url))
