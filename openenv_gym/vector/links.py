"""Links: how the pool talks to one server, whatever protocol it speaks.

A link hosts some of the pool's sessions and resets or steps any subset of
them, delivering :class:`Results` in column form:

- :class:`FastLink` (``openenv.msgpack.v1`` servers): all the link's sessions on
  one connection (or a few), one frame each way per reset or step.
- :class:`StockLink` (stock OpenEnv servers): one :class:`~openenv_gym.client.Session`
  per env, every session's message in flight at once.

Links only move results; they know nothing of autoreset or Gymnasium batches.
"""

from __future__ import annotations

import asyncio
import math
import ssl as ssl_module
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..client.fast import FastConnection, SubprotocolNotSelected
from ..client.session import Session
from ..config import Limits, Timeouts
from ..errors import OpenEnvGymError, ProtocolError
from ..protocol import fast as fastp
from ..protocol.fast import Column
from ..protocol.messages import ErrorReply

__all__ = ["Results", "Link", "FastLink", "StockLink", "connect_link"]


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


class Link:
    """One server, seen by the pool. Handles are opaque per-session tokens."""

    url: str
    codec: str

    async def open(self, count: int) -> list[Any]:  # pragma: no cover - interface
        raise NotImplementedError

    async def reset(
        self, handles: Sequence[Any], seeds: Sequence[int | None], options: Mapping[str, Any] | None
    ) -> Results:  # pragma: no cover - interface
        raise NotImplementedError

    async def step(
        self, handles: Sequence[Any], actions: Mapping[str, Column], resets: np.ndarray | None = None
    ) -> Results:  # pragma: no cover - interface
        """Step ``handles``; those marked in ``resets`` (bool, optional) are reset instead."""
        raise NotImplementedError

    async def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _errors_from(replies: list[ErrorReply | None] | None, url: str) -> list[OpenEnvGymError | None] | None:
    if replies is None:
        return None
    return [None if e is None else e.exception(url) for e in replies]


class FastLink(Link):
    """A server that speaks the fast path: sessions multiplexed on one connection."""

    codec = "msgpack"

    def __init__(self, connection: FastConnection) -> None:
        self.url = connection.url
        self._conn = connection

    async def open(self, count: int) -> list[int]:
        return await self._conn.open_sessions(count)

    def _results(self, reply: fastp.FastReply, handles: Sequence[int]) -> Results:
        if isinstance(reply, fastp.FastErrorReply):
            raise reply.error.exception(self.url)
        if not isinstance(reply, fastp.BatchReply) or len(reply.sessions) != len(handles):
            raise ProtocolError(f"{self.url}: expected a batch for {len(handles)} sessions, got {type(reply).__name__}")
        return Results(reply.observation, reply.reward, reply.done, reply.metadata, _errors_from(reply.errors, self.url))

    async def reset(self, handles, seeds, options) -> Results:
        reply = await self._conn.request(lambda rid: fastp.reset_batch_request(rid, handles, seeds, options))
        return self._results(reply, handles)

    async def step(self, handles, actions, resets=None) -> Results:
        reply = await self._conn.request(lambda rid: fastp.step_batch_request(rid, handles, actions, resets))
        return self._results(reply, handles)

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
        self._sessions: list[Session] = []
        self._spare = spare

    async def open(self, count: int) -> list[Session]:
        spare: list[Session] = []
        if self._spare is not None and count > 0:
            spare, self._spare = [self._spare], None
        opened = spare + await asyncio.gather(
            *(Session.connect(self.url, **self._connect) for _ in range(count - len(spare))), return_exceptions=True
        )
        sessions = [s for s in opened if isinstance(s, Session)]
        self._sessions.extend(sessions)
        failures = [s for s in opened if not isinstance(s, Session)]
        if failures:
            await asyncio.gather(*(s.close() for s in sessions))
            raise failures[0]
        return sessions

    async def _gather(self, calls) -> Results:
        replies = await asyncio.gather(*calls, return_exceptions=True)
        k = len(replies)
        reward = np.full(k, math.nan)
        done = np.zeros(k, dtype=np.bool_)
        fields: dict[str, list[Any]] = {}
        metadata: list[dict[str, Any]] = []
        errors: list[OpenEnvGymError | None] = [None] * k
        failed = False
        for i, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                if not isinstance(reply, OpenEnvGymError):
                    raise reply
                errors[i] = reply
                failed = True
                metadata.append({})
                continue
            for name, value in reply.observation.items():
                fields.setdefault(name, [None] * k)[i] = value
            if reply.reward is not None:
                reward[i] = reply.reward
            done[i] = reply.done
            metadata.append(reply.metadata)
        return Results(fields, reward, done, metadata if any(metadata) else None, errors if failed else None)

    async def reset(self, handles: Sequence[Session], seeds, options) -> Results:
        extra = dict(options or {})
        return await self._gather(s.reset(seed=seed, **extra) for s, seed in zip(handles, seeds))

    async def step(
        self, handles: Sequence[Session], actions: Mapping[str, Column], resets: np.ndarray | None = None
    ) -> Results:
        names = list(actions)
        return await self._gather(
            s.reset() if resets is not None and resets[i] else s.step({name: actions[name][i] for name in names})
            for i, s in enumerate(handles)
        )

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, []
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
    try:
        connection = await FastConnection.connect(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl)
    except SubprotocolNotSelected as stock:
        # A stock server: the probe connection already holds a session; keep it as the first.
        spare = Session(stock.transport, timeouts=timeouts, limits=limits)
        return StockLink(base_url, headers=headers, timeouts=timeouts, limits=limits, ssl=ssl, spare=spare)
    return FastLink(connection)

