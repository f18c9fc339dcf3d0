"""Links: how the pool talks to one server, whatever protocol it speaks.

A link hosts some of the pool's sessions and resets or steps any subset of
them, delivering :class:`Results` in column form through a callback, exactly
once per request:

- :class:`FastLink` (``openenv.msgpack.v1`` servers): all the link's sessions on
  one connection, one frame each way per request, no task per request.
- :class:`StockLink` (stock OpenEnv servers): one
  :class:`~openenv_gym.client.stock_connection.StockConnection` per env, every session's
  message in flight at once, no task per request.

A link can be *revived* after its server went away (a new connection) and
sessions can be opened on it again. Links only move results; they know
nothing of autoreset, placement or Gymnasium batches.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import ssl as ssl_module
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..client.fast_connection import FastConnection, SubprotocolNotSelected
from ..client.stock_connection import StockConnection
from ..config import Limits, Timeouts
from ..errors import CapacityError, OpenEnvGymError, ProtocolError, ServerError
from ..protocol import lane as lanes
from ..protocol import multiplex as fastp
from ..protocol.codec import WIRE_DTYPES
from ..protocol.messages import ErrorReply, Reply, StateReply, StepReply, reset_request, state_request, step_request
from ..protocol.multiplex import Column
from ..spaces import SpaceMappingError

__all__ = ["Results", "Done", "Link", "FastLink", "StockLink", "connect_link"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Results:
    """What a reset or step of ``k`` sessions returned, in request order.

    Attributes:
        observation: batch of observation fields, each column with ``k`` entries.
        reward: float64 ``(k,)``; NaN where the server sent none.
        done: bool ``(k,)``.
        metadata: ``k`` dicts, or ``None`` when all are empty.
        errors: ``None``, or ``k`` entries, each ``None`` or the exception of a
            session whose request failed (its other entries are filler).
        after_rows: for a step whose server reset the sessions that ended
            (``autoreset``), int64 ``(k',)``: their positions here; else ``None``.
        after: the results of those resets, ``k'`` entries (reward NaN, not done).
    """

    observation: Mapping[str, Column]
    reward: np.ndarray
    done: np.ndarray
    metadata: list[dict[str, Any]] | None
    errors: list[OpenEnvGymError | None] | None
    after_rows: np.ndarray | None = None
    after: "Results | None" = None


#: ``done(results_or_error, positions=None, last=True)``: the results of the
#: request's envs at ``positions`` (int64 indices into the request; ``None``:
#: all of them), or the error that failed them. Called once per request, or
#: (``partial``) once per part, the last call with ``last=True``; every env of
#: the request is answered exactly once.
Done = Callable[..., None]


class Link:
    """One server, seen by the pool. Handles are opaque per-session tokens."""

    url: str
    codec: str
    #: Whether :meth:`step` and :meth:`reset` take ``partial=True`` (results in parts, as envs finish).
    partial = False
    #: Whether the link takes a pool's lockstep steps, raw on a lane when it has one (``FastLink.lane_for``).
    lockstep = False

    @property
    def alive(self) -> bool:
        """Whether requests can be sent now (a fast link's connection is open)."""
        return True

    async def open(self, count: int) -> list[Any]:  # pragma: no cover - interface
        """Open ``count`` sessions; their handles, fewer where the server has no room for more (it said ``CAPACITY_REACHED``)."""
        raise NotImplementedError

    def reset(
        self,
        handles: Sequence[Any],
        seeds: Sequence[int | None],
        options: Mapping[str, Any] | None,
        done: Done,
        partial: bool = False,
    ) -> None:  # pragma: no cover - interface
        """Reset ``handles``; ``done`` gets the results (once per part with ``partial``, when :attr:`partial` says the link can)."""
        raise NotImplementedError

    def step(
        self,
        handles: Sequence[Any],
        actions: Mapping[str, Column],
        resets: np.ndarray | None,
        done: Done,
        partial: bool = False,
    ) -> None:  # pragma: no cover - interface
        """Step ``handles``; those marked in ``resets`` (bool, optional) are reset instead."""
        raise NotImplementedError

    async def state(self, handle: Any) -> dict[str, Any]:  # pragma: no cover - interface
        """The state fields of the session ``handle`` (raises :class:`OpenEnvGymError` if the server refuses)."""
        raise NotImplementedError

    async def revive(self) -> None:
        """Reconnect after the server went away (raises :class:`OpenEnvGymError` if it is still away)."""

    async def probe(self, timeout: float) -> bool:
        """Whether the server answers within ``timeout`` seconds (asked after it stalled)."""
        return True

    def drop(self, handles: Sequence[Any]) -> None:
        """Forget sessions that are gone or moved elsewhere (best effort, no wait)."""

    async def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _errors_from(replies: list[ErrorReply | None] | None, url: str) -> list[OpenEnvGymError | None] | None:
    if replies is None:
        return None
    return [None if e is None else e.exception(url) for e in replies]


def _results(reply: fastp.BatchReply, url: str) -> Results:
    results = Results(reply.observation, reply.reward, reply.done, reply.metadata, _errors_from(reply.errors, url))
    after = reply.after
    if after is not None:
        results.after_rows = after.rows
        results.after = _resets(after.observation, len(after.rows), after.metadata, _errors_from(after.errors, url))
    return results


def _resets(
    observation: Mapping[str, Column],
    k: int,
    metadata: list[dict[str, Any]] | None = None,
    errors: list[OpenEnvGymError | None] | None = None,
) -> Results:
    """The results of ``k`` resets made after steps (``autoreset``): no reward (NaN), not done."""
    return Results(observation, np.full(k, np.nan), np.zeros(k, dtype=np.bool_), metadata, errors)


#: Binds a server may refuse on one connection before a :class:`FastLink` stops asking for lanes there.
BIND_TRIES = 3


class FastLink(Link):
    """A server that speaks the fast path: sessions multiplexed on one connection."""

    codec = "msgpack"
    partial = True
    lockstep = True

    def __init__(self, connection: FastConnection, connect: Callable[[], Any], url: str | None = None) -> None:
        self.url = url or connection.url  # the base URL the user gave
        #: Ask the server to reset each session whose step ends its episode, in the same request
        #: (a SAME_STEP pool's steps: one round trip), raw on a lane that does so too where one is bound.
        self.autoreset = False
        self._no_resetting_lanes = False  # (its server bound a lane without the resets asked for)
        self._conn = connection
        self._connect = connect  # () -> awaitable FastConnection, for revive()
        self._lane: lanes.Lane | None = None  # the sessions bound for raw steps on this connection, if any
        self._lane_handles: Sequence[int] | None = None  # the handles list last found to be the lane's
        self._binding: asyncio.Task | None = None
        self._refused: tuple[FastConnection | None, int] = (None, 0)  # a connection, and the binds its server refused

    @property
    def alive(self) -> bool:
        return not self._conn.closed

    @property
    def connection(self) -> FastConnection:
        """The connection requests go out on now (a new one after :meth:`revive`)."""
        return self._conn

    async def open(self, count: int) -> list[int]:
        return await self._conn.open_sessions(count)

    def _send(
        self, build: Callable[[int], Any], handles: Sequence[int], done: Done, partial: bool, lane: "lanes.Lane | None" = None
    ) -> None:
        answer = _Answer(self._conn, self.url, handles, done, partial, lane)
        try:
            answer.rid = self._conn.send_request(build, answer, raw=lane is not None)
        except OpenEnvGymError as exc:  # the connection is already gone
            asyncio.get_running_loop().call_soon(done, exc)
        except (TypeError, ValueError, OverflowError) as exc:
            # A value msgpack cannot carry: nothing was sent, the sessions are fine; these envs' step fails.
            error = SpaceMappingError(f"{self.url}: the request could not be encoded ({exc})")
            asyncio.get_running_loop().call_soon(done, error)

    def reset(self, handles, seeds, options, done, partial: bool = False) -> None:
        self._send(lambda rid: fastp.reset_batch_request(rid, handles, seeds, options, partial=partial), handles, done, partial)

    def step(self, handles, actions, resets, done, partial: bool = False, lane: "lanes.Lane | None" = None) -> None:
        """:meth:`Link.step`; with ``lane`` (from :meth:`lane_for`, for these very handles and actions), as a raw frame."""
        if lane is not None:
            column = actions[lane.action_field]
            self._send(lambda rid: lanes.pack_step(lane, rid, column, resets), handles, done, lane.partial, lane)
            return
        autoreset = self.autoreset
        self._send(
            lambda rid: fastp.step_batch_request(rid, handles, actions, resets, partial=partial, autoreset=autoreset),
            handles,
            done,
            partial,
        )

    def lane_for(self, handles: Sequence[int], actions: Mapping[str, Column]) -> "lanes.Lane | None":
        """The lane for a step of exactly ``handles`` with ``actions``, if one is bound; else ``None``, and one is asked for.

        A lane is asked for once per set of sessions, in the background, when
        the actions are one array column: the next step goes raw. Its raw steps
        are ``partial`` requests (a server that does not grant that gets
        msgpack steps, which are), so a timeout costs only the envs past it. A server
        that refuses :data:`BIND_TRIES` times (one that knows no lanes, or an
        env without fixed layouts) is not asked again on this connection.
        """
        if self.autoreset and self._no_resetting_lanes:
            return None  # (its server binds lanes that do not reset: steps go as msgpack, which asks it to)
        lane = self._lane
        if lane is not None and lane.autoreset != self.autoreset:
            lane = None  # (bound anew, below, as this link steps now)
        if lane is not None and (handles is self._lane_handles or tuple(handles) == lane.sessions):
            if not lane.partial:
                return None  # (its server answers raw steps whole: a timeout would cost every env of the frame)
            self._lane_handles = handles
            column = actions.get(lane.action_field)
            if (
                len(actions) == 1
                and type(column) is np.ndarray
                and column.dtype == lane.action.dtype
                and column.shape[1:] == lane.action.shape
            ):
                return lane
            return None
        if self.lanes_refused or (self._binding is not None and not self._binding.done()) or len(actions) != 1:
            return None
        ((field, column),) = actions.items()
        if type(column) is np.ndarray and column.dtype.str in WIRE_DTYPES and column.ndim >= 1:
            layout = lanes.Layout(column.dtype, column.shape[1:])
            self._binding = asyncio.get_running_loop().create_task(self._bind(self._conn, list(handles), field, layout))
        return None

    async def _bind(self, conn: FastConnection, handles: list[int], field: str, layout: "lanes.Layout") -> None:
        autoreset = self.autoreset
        try:
            reply = await conn.request(lambda rid: lanes.bind_request(rid, handles, field, layout, autoreset=autoreset, partial=True))
        except OpenEnvGymError as exc:  # (the connection's own trouble: its requests say so)
            logger.debug("binding a lane on %s failed: %s", self.url, exc)
            return
        if self._conn is not conn:  # (reconnected meanwhile)
            return
        if isinstance(reply, fastp.FastErrorReply):
            # (asked again, up to BIND_TRIES times: one refusal may be of sessions closed just then)
            logger.debug("%s binds no lane: %s", self.url, reply.error.message)
            self._refuse(conn, 1)
            return
        try:
            if not isinstance(reply, fastp.BoundReply):
                raise ProtocolError(f"expected a 'bound' reply, got {type(reply).__name__}")
            lane = lanes.parse_bound(reply.message, handles, field, layout, lanes.MAX_LANE_BYTES)
        except ProtocolError as exc:
            logger.warning("%s: a bad answer to a lane's bind (%s); its steps go as msgpack", self.url, exc)
            self._refuse(conn, BIND_TRIES)
            return
        if autoreset and not lane.autoreset:  # (a server that knows no resetting lanes ignores the ask)
            self._no_resetting_lanes = True
        self._lane, self._lane_handles = lane, None

    def _refuse(self, conn: FastConnection, count: int) -> None:
        known, before = self._refused
        self._refused = (conn, count + (before if known is conn else 0))

    @property
    def lanes_refused(self) -> bool:
        """Whether this connection's server refused lanes for good (:data:`BIND_TRIES` times, or with a bad answer)."""
        conn, count = self._refused
        return conn is self._conn and count >= BIND_TRIES

    async def state(self, handle: int) -> dict[str, Any]:
        reply = await self._conn.request(lambda rid: fastp.state_batch_request(rid, [handle]))
        if isinstance(reply, fastp.FastErrorReply):
            raise reply.error.exception(self.url)
        if not isinstance(reply, fastp.StatesReply) or len(reply.states) != 1:
            raise ProtocolError(f"{self.url}: expected the state of one session, got {type(reply).__name__}")
        return reply.states[0]

    async def revive(self) -> None:
        if self.alive:
            return
        self._conn = await self._connect()
        self._lane = self._lane_handles = None

    async def probe(self, timeout: float) -> bool:
        # A state request for no session: answered at once by a server whose loop runs.
        try:
            await self._conn.request(lambda rid: fastp.state_batch_request(rid, []), timeout)
        except OpenEnvGymError:
            return False
        return True  # (any reply: an error is an answer too)

    def drop(self, handles: Sequence[Any]) -> None:
        if self._lane is not None and not set(self._lane.sessions).isdisjoint(handles):
            self._lane = self._lane_handles = None  # (the server drops it as it closes them)
        if self.alive and handles:
            # Free the server's slots; the reply (if any) is not waited for.
            try:
                self._conn.send_request(lambda rid: fastp.close_batch_request(rid, list(handles)), lambda _: None)
            except OpenEnvGymError:
                pass

    async def close(self) -> None:
        if self._binding is not None:
            self._binding.cancel()
        await self._conn.close()


class _Answer:
    """The reply callback of one fast-path request: checks the reply (or its parts) and calls ``done``.

    Every env of the request is answered exactly once, and ``done(..., last=True)``
    is called exactly once, whatever the server sends. A reply is the
    request's only if it names the request's sessions, in its order (for a
    part, those at the part's positions): results are never put on envs they
    are not of (a relay that reorders or swaps replies); a reply that names
    others fails the request's envs with a :class:`ProtocolError`.
    """

    __slots__ = ("conn", "url", "sessions", "count", "done", "partial", "answered", "got", "settled", "rid", "lane")

    def __init__(
        self, conn: FastConnection, url: str, sessions: Sequence[int], done: Done, partial: bool, lane: "lanes.Lane | None" = None
    ) -> None:
        self.conn, self.url, self.done = conn, url, done
        self.sessions = sessions if type(sessions) is list else list(sessions)  # the request's, in its order
        self.count = len(self.sessions)
        self.lane = lane  # the lane the request went raw on: its answer may be a raw batch
        self.partial = partial
        # (partial requests only) the envs answered so far, made by the first part: most partial
        # requests are answered whole (a server whose env calls are fast), at no cost for the mask
        self.answered: np.ndarray | None = None
        self.got = 0  # envs answered so far
        self.settled = False
        self.rid: int | None = None

    def fail(self, error: OpenEnvGymError) -> None:
        """The envs not answered yet failed with ``error``; the request ends (even with none left)."""
        answered = self.answered
        left = None if answered is None else np.flatnonzero(~answered)
        self.settled = True
        if self.rid is not None:
            self.conn.forget(self.rid)  # whatever else comes for it is dropped
        self.done(error, None if left is None or left.size == self.count else left, True)

    def __call__(self, reply: fastp.FastReply | lanes.RawBatch | OpenEnvGymError) -> None:
        if self.settled:
            return
        url, count = self.url, self.count
        if isinstance(reply, OpenEnvGymError):
            self.fail(reply)
        elif type(reply) is lanes.RawBatch:
            if self.lane is None:
                self.fail(ProtocolError(f"{url}: a raw batch for a request that was not sent raw"))
                return
            lane = self.lane
            try:
                observation, reward, done = reply.columns(lane)
                after = reply.after(lane, done)
            except ProtocolError as exc:  # (the stream is out of step, as after any malformed frame)
                error = ProtocolError(f"{url}: {exc}")
                self.conn.abort(error)
                self.fail(error)
                return
            self.settled = True
            results = Results(observation, reward, done, None, None)
            if after is not None:  # (a lane that resets: the ended sessions' resets, in order)
                results.after_rows = np.flatnonzero(done)
                results.after = _resets({lane.observation_field: after}, len(after))
            self.done(results)
        elif isinstance(reply, fastp.FastErrorReply):
            self.fail(reply.error.exception(url))
        elif not isinstance(reply, fastp.BatchReply):
            self.fail(ProtocolError(f"{url}: expected a batch for {count} sessions, got {type(reply).__name__}"))
        elif reply.part is None:
            if len(reply.sessions) != count or self.got:
                self.fail(ProtocolError(f"{url}: expected a batch for {count} sessions, got {len(reply.sessions)}"))
                return
            if reply.sessions != self.sessions:
                self.fail(ProtocolError(f"{url}: a reply names sessions other than its request's, or in another order"))
                return
            self.settled = True
            self.done(_results(reply, url))
        elif not self.partial:
            self.fail(ProtocolError(f"{url}: a reply part for a request that asked for the whole"))
        else:
            part, answered = reply.part, self.answered
            if answered is None:
                answered = self.answered = np.zeros(count, dtype=np.bool_)
            bad = (part.size == 0 and not reply.last) or (part.size > 0 and (part.min() < 0 or part.max() >= count or answered[part].any()))
            if not bad and part.size:
                answered[part] = True
                if int(np.count_nonzero(answered)) != self.got + part.size:  # an env twice in this part
                    answered[part] = False
                    bad = True
            if not bad and reply.sessions != [self.sessions[p] for p in part.tolist()]:
                answered[part] = False
                self.fail(ProtocolError(f"{url}: a reply part names sessions other than its request's at those positions"))
                return
            if bad:
                self.fail(ProtocolError(f"{url}: a reply part names envs outside the request, or twice"))
                return
            self.got += part.size
            if reply.last and not answered.all():
                if part.size:
                    self.done(_results(reply, url), part, False)
                self.fail(ProtocolError(f"{url}: the last reply part left envs unanswered"))
                return
            self.settled = reply.last
            self.done(_results(reply, url), part, reply.last)


class _StockBatch:
    """One reset or step of ``k`` stock sessions: each reply fills its slot, the last one calls ``done``."""

    __slots__ = ("url", "done", "left", "fields", "reward", "flags", "metadata", "errors")

    def __init__(self, url: str, k: int, done: Done) -> None:
        self.url = url
        self.done = done
        self.left = k + 1  # one more until every request is sent (see sent())
        self.fields: dict[str, Column] = {}
        self.reward: list[float] = [math.nan] * k
        self.flags: list[bool] = [False] * k
        self.metadata: list[dict[str, Any]] = [{}] * k
        self.errors: list[OpenEnvGymError | None] | None = None

    def fill(self, i: int, connection: StockConnection, reply: Reply | OpenEnvGymError) -> None:
        """Slot ``i``'s answer: a :class:`StockCallback` once bound to ``i`` and its connection."""
        if type(reply) is StepReply:
            k = len(self.reward)
            fields = self.fields
            for name, value in reply.observation.items():
                column = fields.get(name)
                if column is None:
                    column = fields[name] = [None] * k
                column[i] = value
            if reply.reward is not None:
                self.reward[i] = reply.reward
            self.flags[i] = reply.done
            self.metadata[i] = reply.metadata
        else:
            if isinstance(reply, ErrorReply):
                error: OpenEnvGymError = reply.exception(self.url)
                if reply.closes_connection:
                    connection.abort(error)
            elif isinstance(reply, OpenEnvGymError):
                error = reply  # the connection has already dropped itself if it had to
            else:
                error = ProtocolError(f"{self.url}: expected an observation, got {type(reply).__name__}")
                connection.abort(error)
            if self.errors is None:
                self.errors = [None] * len(self.reward)
            self.errors[i] = error
        self.left -= 1
        if self.left == 0:
            self.finish()

    def sent(self) -> None:
        """Every request is sent (or failed at once)."""
        self.left -= 1
        if self.left == 0:  # all failed at once: answer later, as always
            asyncio.get_running_loop().call_soon(self.finish)

    def finish(self) -> None:
        metadata = self.metadata
        self.done(
            Results(
                self.fields,
                np.array(self.reward, dtype=np.float64),
                np.array(self.flags, dtype=np.bool_),
                metadata if any(metadata) else None,
                self.errors,
            )
        )


class StockLink(Link):
    """A stock OpenEnv server: one WebSocket session per env, all in flight at once.

    Handles are the sessions' connections (:class:`~openenv_gym.client.stock_connection.StockConnection`).
    """

    codec = "json"

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        timeouts: Timeouts,
        limits: Limits,
        ssl: ssl_module.SSLContext | None = None,
        spare: StockConnection | None = None,
    ) -> None:
        self.url = base_url
        self._connect: dict[str, Any] = dict(headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)
        self._sessions: set[StockConnection] = set()
        self._spare = spare
        self._tasks: set[asyncio.Task] = set()  # closing dropped sessions

    async def open(self, count: int) -> list[StockConnection]:
        spare: list[StockConnection | BaseException] = []
        if self._spare is not None and count > 0:
            spare, self._spare = [self._spare], None
        opened = spare + await asyncio.gather(
            *(StockConnection.connect(self.url, **self._connect) for _ in range(count - len(spare))),
            return_exceptions=True,
        )
        sessions = [s for s in opened if isinstance(s, StockConnection)]
        failures: list[BaseException] = [s for s in opened if not isinstance(s, StockConnection)]
        refused: list[StockConnection] = []
        if not failures:
            # A stock server that has no room says so right after the handshake (CAPACITY_REACHED), as the
            # answer to the first request: a state request each, so that the pool knows before its reset.
            # Any other answer says the session is there (an env's state may refuse before a reset: EXECUTION_ERROR);
            # one that closes it (FACTORY_ERROR: the env could not be made) fails the open.
            replies = await asyncio.gather(*(s.request(state_request()) for s in sessions), return_exceptions=True)
            for session, reply in zip(sessions, replies):
                if isinstance(reply, ErrorReply) and reply.closes_connection:
                    error = reply.exception(self.url)
                    if isinstance(error, CapacityError):
                        refused.append(session)
                    else:
                        failures.append(error)
                elif isinstance(reply, BaseException):
                    failures.append(reply)
        if failures:
            await asyncio.gather(*(s.close() for s in sessions))
            raise failures[0]
        if refused:
            await asyncio.gather(*(s.close() for s in refused))
            sessions = [s for s in sessions if s not in refused]
        self._sessions.update(sessions)
        return sessions

    def _send(self, handles: Sequence[StockConnection], messages: list[dict[str, Any]], done: Done) -> None:
        batch = _StockBatch(self.url, len(handles), done)
        fill = batch.fill
        for i, (connection, message) in enumerate(zip(handles, messages)):
            try:
                connection.send_request(message, functools.partial(fill, i, connection))
            except OpenEnvGymError as exc:  # the session is already gone
                fill(i, connection, exc)
        batch.sent()

    def reset(self, handles: Sequence[StockConnection], seeds, options, done, partial: bool = False) -> None:
        extra = dict(options or {})
        self._send(handles, [reset_request(seed, **extra) for seed in seeds], done)

    def step(self, handles: Sequence[StockConnection], actions, resets, done, partial: bool = False) -> None:
        names = list(actions)
        # Python values, not numpy scalars: JSON-encoded without a fallback per value.
        columns = [c.tolist() if isinstance(c, np.ndarray) else c for c in (actions[name] for name in names)]
        self._send(
            handles,
            [
                reset_request()
                if resets is not None and resets[i]
                else step_request({name: column[i] for name, column in zip(names, columns)})
                for i in range(len(handles))
            ],
            done,
        )

    async def state(self, handle: StockConnection) -> dict[str, Any]:
        reply = await handle.request(state_request())
        if isinstance(reply, ErrorReply):
            raise reply.exception(self.url)
        if not isinstance(reply, StateReply):
            raise ProtocolError(f"{self.url}: expected a state reply, got {type(reply).__name__}")
        return reply.data

    async def probe(self, timeout: float) -> bool:
        # A stock server answers nothing without a session: connect one (its handshake is the answer), and close it.
        try:
            async with asyncio.timeout(timeout):
                session = await StockConnection.connect(self.url, **self._connect)
        except ServerError:  # (full, say: an answer all the same)
            return True
        except (OpenEnvGymError, TimeoutError):
            return False
        await session.close()
        return True

    def drop(self, handles: Sequence[Any]) -> None:
        for connection in handles:
            self._sessions.discard(connection)
            task = asyncio.get_running_loop().create_task(connection.close())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        sessions = list(self._sessions)
        self._sessions.clear()
        if self._spare is not None:
            sessions.append(self._spare)
            self._spare = None
        await asyncio.gather(*(s.close() for s in sessions))


async def connect_link(
    base_url: str,
    *,
    headers: Mapping[str, str] | None,
    timeouts: Timeouts,
    limits: Limits,
    ssl: ssl_module.SSLContext | None = None,
) -> Link:
    """Connect to ``base_url`` and return the link for the protocol it speaks."""

    def connect() -> Any:
        return FastConnection.connect(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)

    try:
        connection = await connect()
    except SubprotocolNotSelected as stock:
        # A stock server: the probe connection already holds a session; keep it as the first.
        spare = StockConnection(stock.transport, timeouts=timeouts, limits=limits)
        return StockLink(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl, spare=spare)
    return FastLink(connection, connect, base_url)
