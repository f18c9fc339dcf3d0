"""Links: how the pool talks to one server, whatever protocol it speaks.

A link hosts some of the pool's sessions and resets or steps any subset of
them, delivering :class:`Results` in column form through a callback, exactly
once per request:

- :class:`FastLink` (``openenv.msgpack.v1`` servers): all the link's sessions on
  one connection, one frame each way per request, no task per request.
- :class:`StockLink` (stock OpenEnv servers): one :class:`~openenv_gym.client.Session`
  per env, every session's message in flight at once.

A link can be *revived* after its server went away (a new connection) and
sessions can be opened on it again. Links only move results; they know
nothing of autoreset, placement or Gymnasium batches.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl as ssl_module
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..client.fast import FastConnection, SubprotocolNotSelected
from ..client.session import Session
from ..config import Limits, Timeouts
from ..errors import OpenEnvGymError, ProtocolError
from ..protocol import fast as fastp
from ..protocol.fast import Column
from ..protocol.messages import ErrorReply

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
    """

    observation: dict[str, Column]
    reward: np.ndarray
    done: np.ndarray
    metadata: list[dict[str, Any]] | None
    errors: list[OpenEnvGymError | None] | None


#: Called exactly once per request: with the results, or the error that failed it whole.
Done = Callable[["Results | OpenEnvGymError"], None]


class Link:
    """One server, seen by the pool. Handles are opaque per-session tokens."""

    url: str
    codec: str

    @property
    def alive(self) -> bool:
        """Whether requests can be sent now (a fast link's connection is open)."""
        return True

    async def open(self, count: int) -> list[Any]:  # pragma: no cover - interface
        """Open ``count`` sessions; their handles."""
        raise NotImplementedError

    def reset(
        self, handles: Sequence[Any], seeds: Sequence[int | None], options: Mapping[str, Any] | None, done: Done
    ) -> None:  # pragma: no cover - interface
        """Reset ``handles``; ``done`` gets the results."""
        raise NotImplementedError

    def step(
        self, handles: Sequence[Any], actions: Mapping[str, Column], resets: np.ndarray | None, done: Done
    ) -> None:  # pragma: no cover - interface
        """Step ``handles``; those marked in ``resets`` (bool, optional) are reset instead."""
        raise NotImplementedError

    async def revive(self) -> None:
        """Reconnect after the server went away (raises :class:`OpenEnvGymError` if it is still away)."""

    def drop(self, handles: Sequence[Any]) -> None:
        """Forget sessions that are gone or moved elsewhere (best effort, no wait)."""

    async def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _errors_from(replies: list[ErrorReply | None] | None, url: str) -> list[OpenEnvGymError | None] | None:
    if replies is None:
        return None
    return [None if e is None else e.exception(url) for e in replies]


class FastLink(Link):
    """A server that speaks the fast path: sessions multiplexed on one connection."""

    codec = "msgpack"

    def __init__(self, connection: FastConnection, connect: Callable[[], Any], url: str | None = None) -> None:
        self.url = url or connection.url  # the base URL the user gave
        self._conn = connection
        self._connect = connect  # () -> awaitable FastConnection, for revive()

    @property
    def alive(self) -> bool:
        return not self._conn.closed

    async def open(self, count: int) -> list[int]:
        return await self._conn.open_sessions(count)

    def _send(self, build: Callable[[int], dict[str, Any]], count: int, done: Done) -> None:
        def on_reply(reply: fastp.FastReply | OpenEnvGymError) -> None:
            if isinstance(reply, OpenEnvGymError):
                done(reply)
            elif isinstance(reply, fastp.FastErrorReply):
                done(reply.error.exception(self.url))
            elif not isinstance(reply, fastp.BatchReply) or len(reply.sessions) != count:
                done(ProtocolError(f"{self.url}: expected a batch for {count} sessions, got {type(reply).__name__}"))
            else:
                done(
                    Results(
                        reply.observation, reply.reward, reply.done, reply.metadata, _errors_from(reply.errors, self.url)
                    )
                )

        try:
            self._conn.send_request(build, on_reply)
        except OpenEnvGymError as exc:  # the connection is already gone
            asyncio.get_running_loop().call_soon(done, exc)

    def reset(self, handles, seeds, options, done) -> None:
        self._send(lambda rid: fastp.reset_batch_request(rid, handles, seeds, options), len(handles), done)

    def step(self, handles, actions, resets, done) -> None:
        self._send(lambda rid: fastp.step_batch_request(rid, handles, actions, resets), len(handles), done)

    async def revive(self) -> None:
        if self.alive:
            return
        self._conn = await self._connect()

    def drop(self, handles: Sequence[Any]) -> None:
        if self.alive and handles:
            # Free the server's slots; the reply (if any) is not waited for.
            try:
                self._conn.send_request(lambda rid: fastp.close_batch_request(rid, list(handles)), lambda _: None)
            except OpenEnvGymError:
                pass

    async def close(self) -> None:
        await self._conn.close()


class StockLink(Link):
    """A stock OpenEnv server: one WebSocket session per env, all in flight at once."""

    codec = "json"

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        timeouts: Timeouts,
        limits: Limits,
        ssl: ssl_module.SSLContext | None = None,
        spare: Session | None = None,
    ) -> None:
        self.url = base_url
        self._connect = dict(headers=headers, timeouts=timeouts, limits=limits, offer_msgpack=False, ssl=ssl)
        self._sessions: set[Session] = set()
        self._spare = spare
        self._tasks: set[asyncio.Task] = set()

    async def open(self, count: int) -> list[Session]:
        spare: list[Session] = []
        if self._spare is not None and count > 0:
            spare, self._spare = [self._spare], None
        opened = spare + await asyncio.gather(
            *(Session.connect(self.url, **self._connect) for _ in range(count - len(spare))), return_exceptions=True
        )
        sessions = [s for s in opened if isinstance(s, Session)]
        failures = [s for s in opened if not isinstance(s, Session)]
        if failures:
            await asyncio.gather(*(s.close() for s in sessions))
            raise failures[0]
        self._sessions.update(sessions)
        return sessions

    def _run(self, calls: list[Any], done: Done) -> None:
        task = asyncio.get_running_loop().create_task(self._gather(calls, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _gather(self, calls: list[Any], done: Done) -> None:
        replies = await asyncio.gather(*calls, return_exceptions=True)
        k = len(replies)
        reward = np.full(k, math.nan)
        flags = np.zeros(k, dtype=np.bool_)
        fields: dict[str, list[Any]] = {}
        metadata: list[dict[str, Any]] = []
        errors: list[OpenEnvGymError | None] = [None] * k
        failed = False
        for i, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                if not isinstance(reply, OpenEnvGymError):
                    reply = OpenEnvGymError(f"{self.url}: {reply!r}")
                errors[i] = reply
                failed = True
                metadata.append({})
                continue
            for name, value in reply.observation.items():
                fields.setdefault(name, [None] * k)[i] = value
            if reply.reward is not None:
                reward[i] = reply.reward
            flags[i] = reply.done
            metadata.append(reply.metadata)
        done(Results(fields, reward, flags, metadata if any(metadata) else None, errors if failed else None))

    def reset(self, handles: Sequence[Session], seeds, options, done) -> None:
        extra = dict(options or {})
        self._run([s.reset(seed=seed, **extra) for s, seed in zip(handles, seeds)], done)

    def step(self, handles: Sequence[Session], actions, resets, done) -> None:
        names = list(actions)
        self._run(
            [
                s.reset() if resets is not None and resets[i] else s.step({name: actions[name][i] for name in names})
                for i, s in enumerate(handles)
            ],
            done,
        )

    def drop(self, handles: Sequence[Any]) -> None:
        for session in handles:
            self._sessions.discard(session)
            self._run([session.close()], lambda _: None)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
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
        spare = Session(stock.transport, timeouts=timeouts, limits=limits)
        return StockLink(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl, spare=spare)
    return FastLink(connection, connect, base_url)
