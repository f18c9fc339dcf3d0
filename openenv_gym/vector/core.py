"""The pool's async core: env slots on links, requests submitted, arrivals collected.

Runs on the I/O event loop. :meth:`PoolCore.submit` splits a request for some
envs into one request per link (one frame per fast-path server) and returns at
once; each link's answer becomes an :class:`Arrival`. :meth:`PoolCore.collect`
waits until enough envs have arrived. Nothing here knows Gymnasium's autoreset
rules: the vector env decides what to reset and what to step.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import OpenEnvGymError, SessionTimeout
from ..protocol.fast import Column
from .links import Link, Results

__all__ = ["Arrival", "PoolCore", "take_columns"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Arrival:
    """One link's answer to one request.

    Attributes:
        kind: what was asked, as named by the submitter (``"step"``, ``"reset"``, ...).
        env_ids: int64 ``(k,)``, the envs answered, in the order of ``results``.
        results: the results, or the exception that failed the whole request.
        resets: for a step, bool ``(k,)`` marking envs that were reset instead, or ``None``.
        rows: ``env_ids`` as a slice when they are a contiguous run (cheaper to
            index batch buffers with), else ``env_ids`` itself.
    """

    kind: str
    env_ids: np.ndarray
    results: Results | OpenEnvGymError
    resets: np.ndarray | None = None
    rows: slice | np.ndarray | None = None


def take_columns(columns: Mapping[str, Column], positions: np.ndarray) -> dict[str, Column]:
    """The entries at ``positions`` of each column."""
    out: dict[str, Column] = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray):
            out[name] = column[positions]
        else:
            out[name] = [column[p] for p in positions.tolist()]
    return out


class PoolCore:
    """Env slots placed on links.

    Args:
        links: the servers.
        link_of: int ``(num_envs,)``, the link index of each env.
        handles: per env, the link's handle of its session.
    """

    def __init__(self, links: Sequence[Link], link_of: np.ndarray, handles: Sequence[Any]) -> None:
        self.links = list(links)
        self.link_of = np.asarray(link_of, dtype=np.int64)
        self.handles = list(handles)
        self._arrivals: list[Arrival] = []
        self._arrived = 0
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._outstanding = 0  # requests submitted and not answered
        # For a request that covers every env: each link's envs, ready-made.
        self._all = [np.flatnonzero(self.link_of == j) for j in range(len(self.links))]
        self._every = np.arange(len(self.link_of))
        self._slices = [
            slice(int(p[0]), int(p[-1]) + 1) if p.size and p[-1] - p[0] + 1 == p.size else p for p in self._all
        ]

    @property
    def every(self) -> np.ndarray:
        """``arange(num_envs)``; passing this very array to :meth:`submit` skips a check."""
        return self._every

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        return self._outstanding

    def submit(
        self,
        kind: str,
        env_ids: np.ndarray,
        *,
        actions: Mapping[str, Column] | None = None,
        resets: np.ndarray | None = None,
        seeds: Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
        request_size: int | None = None,
    ) -> None:
        """Reset (``actions is None``) or step ``env_ids``; answers arrive later.

        ``actions`` columns, ``resets`` (bool: reset this env instead of
        stepping it) and ``seeds`` run parallel to ``env_ids``. Each server
        gets one request for all of its envs, or (``request_size``) one per
        ``request_size`` envs, so that those finish independently.
        """
        every = env_ids is self._every or (
            len(env_ids) == len(self.link_of) and np.array_equal(env_ids, self._every)
        )
        for j, link in enumerate(self.links):
            if every:
                positions = self._all[j]
                rows = self._slices[j]
            else:
                positions = np.flatnonzero(self.link_of[env_ids] == j)
                rows = None
            if positions.size == 0:
                continue
            if request_size is not None and positions.size > request_size:
                for start in range(0, positions.size, request_size):
                    chunk = positions[start : start + request_size]
                    self._request(kind, link, env_ids, chunk, None, actions, resets, seeds, options)
            else:
                self._request(kind, link, env_ids, positions, rows, actions, resets, seeds, options)

    def _request(
        self,
        kind: str,
        link: Link,
        env_ids: np.ndarray,
        positions: np.ndarray,
        rows: slice | np.ndarray | None,
        actions: Mapping[str, Column] | None,
        resets: np.ndarray | None,
        seeds: Sequence[int | None] | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        """One request to ``link`` for the envs at ``positions`` of ``env_ids``."""
        ids = env_ids[positions]
        handles = [self.handles[i] for i in ids.tolist()]
        if actions is None:
            link_seeds = [None] * len(ids) if seeds is None else [seeds[p] for p in positions.tolist()]
            op = link.reset(handles, link_seeds, options)
            link_resets = None
        else:
            link_resets = None if resets is None else resets[positions]
            op = link.step(handles, take_columns(actions, positions), link_resets)
        self._outstanding += 1
        task = asyncio.get_running_loop().create_task(
            self._run(kind, ids, op, link_resets, ids if rows is None else rows)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, kind: str, env_ids: np.ndarray, op, resets: np.ndarray | None, rows) -> None:
        try:
            results: Results | OpenEnvGymError = await op
        except OpenEnvGymError as exc:
            results = exc
        except Exception as exc:  # never lose an answer: surface it as an arrival
            logger.exception("request to a link failed")
            results = OpenEnvGymError(f"internal error: {exc!r}")
        self._arrivals.append(Arrival(kind, env_ids, results, resets, rows))
        self._arrived += len(env_ids)
        self._outstanding -= 1
        self._wake.set()

    async def collect(self, min_envs: int, timeout: float, submit: Sequence[Callable[[], None]] = ()) -> list[Arrival]:
        """Wait until arrivals cover ``min_envs`` envs (or nothing more is in flight).

        ``submit`` are deferred :meth:`submit` calls to make first, so that a
        caller on another thread pays one hand-off for sending and waiting.
        Returns every arrival so far. ``timeout`` is in seconds.

        Raises:
            SessionTimeout: not enough arrived in time.
        """
        for call in submit:
            call()
        try:
            async with asyncio.timeout(timeout):
                while self._arrived < min_envs and self._outstanding:
                    self._wake.clear()
                    await self._wake.wait()
        except TimeoutError:
            raise SessionTimeout(f"fewer than {min_envs} envs answered within {timeout} s", timeout=timeout) from None
        arrivals, self._arrivals = self._arrivals, []
        self._arrived = 0
        return arrivals

    async def close(self) -> None:
        """Cancel what is in flight and close every link."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)
