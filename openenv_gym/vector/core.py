"""The pool's async core: env slots on links, requests out, arrivals in, sessions repaired.

Runs on the I/O event loop. :meth:`PoolCore.submit` splits a request for some
envs into one request per link (one frame per fast-path server) and returns at
once; each link's answer becomes an :class:`Arrival`. :meth:`PoolCore.collect`
waits until enough envs have arrived.

Faults: an env whose request failed because its session is gone (connection
lost, timeout, malformed reply) is *broken*. The core opens it a new session
in the background: on the same server once it answers again, else on another
server with room, retrying with exponential backoff and jitter. A reset for a
broken env waits for that, at most one step timeout; after that it arrives as
an error (the env stays broken and the next reset tries again). A step is never
sent to a session that was not reset: only resets are routed to new sessions.
Envs moved off their home server go back to it, at their next reset, once it
answers again. When no server can host sessions for longer than the grace
period, every waiting request fails with :class:`~openenv_gym.errors.PoolUnavailable`.

Nothing here knows Gymnasium's autoreset rules: the vector env decides what to
reset and what to step, and what a failed request means for the trainer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .._masks import any_true, same
from ..errors import (
    CapacityError,
    ConnectError,
    ConnectionLost,
    OpenEnvGymError,
    PoolUnavailable,
    ProtocolError,
    SessionTimeout,
)
from ..protocol.multiplex import Column
from .links import Link, Results
from .rows import take_columns

__all__ = ["Arrival", "PoolCore", "session_lost", "call_all"]

logger = logging.getLogger(__name__)

#: Errors after which a session cannot be used again.
_LOST = (ConnectionLost, SessionTimeout, ProtocolError)


def session_lost(error: BaseException | None) -> bool:
    """Whether ``error`` means the session is gone (as opposed to a refused request)."""
    return isinstance(error, _LOST)


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
        server: the URL of the server asked (for error reports).
    """

    kind: str
    env_ids: np.ndarray
    results: Results | OpenEnvGymError
    resets: np.ndarray | None = None
    rows: slice | np.ndarray | None = None
    server: str = ""


@dataclass(slots=True)
class _Parked:
    """A reset waiting for its envs' new sessions."""

    kind: str
    env_ids: np.ndarray
    actions: Mapping[str, Column] | None
    resets: np.ndarray | None
    seeds: list[int | None] | None
    options: Mapping[str, Any] | None
    deadline: float
    timer: asyncio.TimerHandle | None = None

    def part(self, positions: np.ndarray) -> "_Parked":
        """The request for the envs at ``positions`` only (same deadline, no timer)."""
        return _Parked(
            self.kind,
            self.env_ids[positions],
            None if self.actions is None else take_columns(self.actions, positions),
            None if self.resets is None else self.resets[positions],
            None if self.seeds is None else [self.seeds[p] for p in positions.tolist()],
            self.options,
            self.deadline,
        )


def _call_each(calls: Sequence[Any], future: "asyncio.Future[Any]") -> bool:
    """Call each of ``calls``; whether all returned (else ``future`` has the exception, unless done)."""
    interrupt: BaseException | None = None
    for call in calls:
        try:
            call()
        except (KeyboardInterrupt, SystemExit) as exc:
            # The other calls still go out (their envs are counted in flight), then it is raised on,
            # out of the loop: a future done with it would never stop run_until_complete (asyncio
            # takes it for one that has left the loop already). The waiter lets go of the future.
            interrupt = interrupt or exc
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
            if interrupt is not None:
                raise interrupt  # noqa: B904  (the Ctrl-C held meanwhile, with this failure as its context)
            return False
    if interrupt is not None:
        raise interrupt
    return True


def call_all(calls: Sequence[Any], future: "asyncio.Future[Any]") -> None:
    """Call each of ``calls`` on the loop; then ``future`` is done (with the first exception, if one raised)."""
    if _call_each(calls, future) and not future.done():  # (done: abandoned by an interrupted caller)
        future.set_result(None)


class PoolCore:
    """Env slots placed on links.

    Args:
        links: the servers.
        link_of: int ``(num_envs,)``, the link index of each env (its home).
        handles: per env, the link's handle of its session.
        step_timeout: seconds a request may take, including waiting for a new session.
        grace: seconds without any server able to host sessions before waiting
            requests fail with ``PoolUnavailable``.
        capacity: per link, the most sessions it may host (``None``: unknown).
        limit: per link, the server's own session limit, ``max_sessions`` (``None``: unknown).
    """

    def __init__(
        self,
        links: Sequence[Link],
        link_of: np.ndarray,
        handles: Sequence[Any],
        *,
        step_timeout: float = 60.0,
        grace: float = 60.0,
        capacity: Sequence[int | None] | None = None,
        limit: Sequence[int | None] | None = None,
    ) -> None:
        self.links = list(links)
        self.fast_only = all(link.lockstep for link in self.links)  # (a link keeps its kind when it reconnects)
        self.link_of = np.asarray(link_of, dtype=np.int64).copy()
        self.home_of = self.link_of.copy()
        self.handles = list(handles)
        self.broken = np.zeros(len(self.handles), dtype=np.bool_)
        # Envs given a new session that no reset has been sent to yet: a step
        # there would continue an episode the new session never started.
        self.unreset = np.zeros(len(self.handles), dtype=np.bool_)
        self._any_unreset = False
        self.step_timeout = step_timeout
        self.grace = grace
        self.capacity: list[int | None] = list(capacity) if capacity is not None else [None] * len(self.links)
        self.limit: list[int | None] = list(limit) if limit is not None else [None] * len(self.links)
        self.last_error: dict[int, str] = {}  # link index -> last failure seen
        self._avoid_until = [0.0] * len(self.links)  # a link that stalled is not given new sessions until then
        # A link that stalled gets no sessions (no env goes home to it) until it answers again: past
        # its avoid window, the repairer asks it (Link.probe), and a reply on it clears this too.
        self._suspect = [False] * len(self.links)
        self._stalls = [0] * len(self.links)  # stalls in a row: each doubles the avoid window (to 60 s)
        self.fatal: PoolUnavailable | None = None
        self._arrivals: list[Arrival] = []
        self._arrived = 0
        self._outstanding = 0  # requests submitted and not answered
        self._waiter: tuple[asyncio.Future[list[Arrival]], int, asyncio.TimerHandle] | None = None
        self._parked: list[_Parked] = []
        self._repairer: asyncio.Task | None = None
        self._asked = asyncio.Event()  # a request waits for a repair: the repairer tries again now
        self._closing = False
        self._unhosted_since: float | None = None  # when broken envs last had no server to go to
        self._every = np.arange(len(self.link_of))
        self._layout()

    # ------------------------------------------------------------ layout

    def _layout(self) -> None:
        """Recompute per-link env lists after sessions moved."""
        self._all = [np.flatnonzero(self.link_of == j) for j in range(len(self.links))]
        self._slices = [slice(int(p[0]), int(p[-1]) + 1) if p.size and p[-1] - p[0] + 1 == p.size else p for p in self._all]
        self._link_handles = [[self.handles[i] for i in p.tolist()] for p in self._all]

    @property
    def every(self) -> np.ndarray:
        """``arange(num_envs)``; passing this very array to :meth:`submit` skips a check."""
        return self._every

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered (parked ones included)."""
        return self._outstanding

    def settled(self) -> bool:
        """Whether every link is a connected fast-path one, nothing is in flight, and every env is at home on a session it reset.

        Then a step of every env can take the lockstep path (:mod:`.lockstep`).
        """
        return (
            self.fast_only
            and not self._outstanding
            and not self._any_unreset
            and not any_true(self.broken)
            and all(link.alive for link in self.links)
            and same(self.link_of, self.home_of)
        )

    def sessions_per_link(self) -> list[int]:
        """How many envs each link hosts now."""
        return [int(p.size) for p in self._all]

    # ------------------------------------------------------------ requests

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
        partial: bool = False,
        split: bool = True,
    ) -> None:
        """Reset (``actions is None``) or step ``env_ids``; answers arrive later.

        ``actions`` columns, ``resets`` (bool: reset this env instead of
        stepping it) and ``seeds`` run parallel to ``env_ids``. Each server
        gets one request for all of its envs, or (``request_size``) one per
        ``request_size`` envs. ``partial``: envs arrive as they finish, not
        when all of a request's envs have (a fast-path server answers in
        parts; a stock server gets one request per env, unless ``split`` is
        false: then it gets one request, answered when its last env is).
        Resets of broken envs (or of envs going home) wait for their new
        sessions.
        """
        every = env_ids is self._every or (len(env_ids) == len(self.link_of) and np.array_equal(env_ids, self._every))
        if self._any_unreset or any_true(self.broken) or not same(self.link_of, self.home_of):
            restarting = np.ones(len(env_ids), dtype=np.bool_) if actions is None else resets
            moving = self._moving(env_ids, restarting)
            if moving.any():
                self._park(kind, env_ids, moving, actions, resets, seeds, options)
                keep = np.flatnonzero(~moving)
                if keep.size == 0:
                    return
                env_ids = env_ids[keep]
                actions = None if actions is None else take_columns(actions, keep)
                resets = None if resets is None else resets[keep]
                seeds = None if seeds is None else [seeds[p] for p in keep.tolist()]
                every = False
        interrupt: BaseException | None = None
        for j, link in enumerate(self.links):
            if every:
                positions, rows = self._all[j], self._slices[j]
            else:
                positions, rows = np.flatnonzero(self.link_of[env_ids] == j), None
            if positions.size == 0:
                continue
            size = request_size
            if partial and split and not link.partial:
                size = 1  # a server that cannot answer in parts: one env per request
            try:
                if size is not None and positions.size > size:
                    for start in range(0, positions.size, size):
                        chunk = positions[start : start + size]
                        self._request(kind, j, env_ids, chunk, None, actions, resets, seeds, options, partial)
                else:
                    self._request(kind, j, env_ids, positions, rows, actions, resets, seeds, options, partial)
            except (KeyboardInterrupt, SystemExit) as exc:  # (the other links' requests still go out)
                interrupt = interrupt or exc
        if interrupt is not None:
            raise interrupt

    def _request(
        self,
        kind: str,
        j: int,
        env_ids: np.ndarray,
        positions: np.ndarray,
        rows: slice | np.ndarray | None,
        actions: Mapping[str, Column] | None,
        resets: np.ndarray | None,
        seeds: Sequence[int | None] | None,
        options: Mapping[str, Any] | None,
        partial: bool = False,
    ) -> None:
        """One request to link ``j`` for the envs at ``positions`` of ``env_ids``."""
        link = self.links[j]
        ids = env_ids[positions]
        if rows is not None:  # all of the link's envs, in order (the lockstep case)
            handles = self._link_handles[j]
            taken = rows  # a slice (a view) when the envs are contiguous
        else:
            handles = [self.handles[i] for i in ids.tolist()]
            taken = positions
        link_resets = None if (actions is None or resets is None) else resets[taken]
        if self._any_unreset:  # the resets sent here start these sessions' episodes
            if actions is None:
                self.unreset[ids] = False
            elif link_resets is not None:
                self.unreset[ids[link_resets]] = False
            self._any_unreset = bool(self.unreset.any())
        self._outstanding += 1
        done = _Done(self, kind, ids, link_resets, ids if rows is None else rows, j)
        partial = partial and link.partial and len(ids) > 1
        if actions is None:
            link_seeds = [None] * len(ids) if seeds is None else [seeds[p] for p in positions.tolist()]
            if partial:
                link.reset(handles, link_seeds, options, done, partial=True)
            else:
                link.reset(handles, link_seeds, options, done)
        elif partial:
            link.step(handles, take_columns(actions, taken), link_resets, done, partial=True)
        else:
            link.step(handles, take_columns(actions, taken), link_resets, done)

    def _arrive(self, arrival: Arrival, link: int, last: bool = True, check: bool = True) -> None:
        """Queue an answer for :meth:`collect`; ``check``: break the envs whose sessions it says are lost."""
        results = arrival.results
        if check:
            if isinstance(results, OpenEnvGymError):
                if session_lost(results):
                    self._break(arrival.env_ids, link, results)
            elif results.errors is not None:
                lost = [i for i, e in zip(arrival.env_ids.tolist(), results.errors) if session_lost(e)]
                if lost:
                    first = next(e for e in results.errors if e is not None and session_lost(e))
                    self._break(np.array(lost, dtype=np.int64), link, first)
        self._arrivals.append(arrival)
        self._arrived += len(arrival.env_ids)
        if last:
            self._outstanding -= 1
        self._wake_waiter()

    def _arrive_nothing(self) -> None:
        """A request ended with no envs left to answer (``_outstanding`` already counted down)."""
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        waiter = self._waiter
        if waiter is not None and (self._arrived >= waiter[1] or not self._outstanding):
            self._waiter = None
            waiter[2].cancel()
            if not waiter[0].done():  # (one abandoned by an interrupted caller leaves the arrivals queued)
                waiter[0].set_result(self._take_arrivals())

    async def collect(self, min_envs: int, timeout: float, submit: Sequence[Any] = ()) -> list[Arrival]:
        """Wait until arrivals cover ``min_envs`` envs (or nothing more is in flight).

        ``submit`` are deferred :meth:`submit` calls to make first. Returns
        every arrival so far: none if nothing was in flight. ``timeout`` is in seconds.

        Raises:
            SessionTimeout: not enough arrived in time.
        """
        future: asyncio.Future[list[Arrival]] = asyncio.get_running_loop().create_future()
        self.collect_into(future, min_envs, timeout, submit)
        return await future

    def collect_into(self, future: asyncio.Future[list[Arrival]], min_envs: int, timeout: float, submit: Sequence[Any] = ()) -> None:
        """:meth:`collect` without a coroutine: ``future`` gets the arrivals, or :class:`SessionTimeout`.

        Runs on the loop. ``submit`` are deferred :meth:`submit` calls to make
        first, so that a caller on another thread pays one hand-off for
        sending and waiting.
        """
        if not _call_each(submit, future) or future.done():
            # (done: abandoned before it started, the caller was interrupted; the requests went out)
            return
        if self._arrived >= min_envs or not self._outstanding:
            # (With nothing in flight and no arrival, the result is empty: checked here, on the loop,
            # after every request queued before it went out. The pool then knows it lost track.)
            future.set_result(self._take_arrivals())
            return
        if self._waiter is not None:
            if not self._waiter[0].done():  # pragma: no cover - one waiter at a time, by construction
                future.set_exception(RuntimeError("another collect() is waiting"))
                return
            self._waiter[2].cancel()  # abandoned (its caller was interrupted): this one takes over
            self._waiter = None
        timer = asyncio.get_running_loop().call_later(timeout, self._collect_timeout, future, min_envs, timeout)
        self._waiter = (future, min_envs, timer)

    def _collect_timeout(self, future: asyncio.Future[list[Arrival]], min_envs: int, timeout: float) -> None:
        if self._waiter is not None and self._waiter[0] is future:
            self._waiter = None
        if not future.done():
            error = SessionTimeout(f"fewer than {min_envs} envs answered within {timeout} s", timeout=timeout)
            future.set_exception(error)

    def _take_arrivals(self) -> list[Arrival]:
        arrivals, self._arrivals = self._arrivals, []
        self._arrived = 0
        return arrivals

    def requeue(self, arrivals: list[Arrival]) -> None:
        """Put back arrivals a collect took but its caller never got (interrupted as it ended): the next collect gets them first."""
        self._arrivals[:0] = arrivals
        self._arrived += sum(len(a.env_ids) for a in arrivals)

    # ------------------------------------------------------------ faults

    def _break(self, env_ids: np.ndarray, link: int, error: OpenEnvGymError) -> None:
        """These envs' sessions are gone: drop them and start repairs."""
        if self._closing:  # the pool closed them itself
            return
        fresh = env_ids[~self.broken[env_ids]]
        if fresh.size == 0:
            return
        self.last_error[link] = f"{type(error).__name__}: {error}"
        logger.warning("%d session(s) on %s lost (%s); opening new ones", fresh.size, self.links[link].url, error)
        if not isinstance(error, ConnectionLost):
            # Stalled or garbled but still connected: give new sessions to the others for a while.
            self._stalled(link)
        if not self.links[link].alive:
            # The connection is gone: so are the sessions of every env on it.
            fresh = np.flatnonzero((self.link_of == link) & ~self.broken)
        else:
            self.links[link].drop([self.handles[i] for i in fresh.tolist() if self.link_of[i] == link])
        self.broken[fresh] = True
        self._ensure_repairer()

    def _moving(self, env_ids: np.ndarray, restarting: np.ndarray | None) -> np.ndarray:
        """Which of ``env_ids`` cannot be sent as asked: broken, going home, or stepped on an unreset session."""
        broken = self.broken[env_ids]
        unreset = self.unreset[env_ids]
        away = self.link_of[env_ids] != self.home_of[env_ids]
        if away.any():  # going home only where home answers again and has room
            homes = self.home_of[env_ids]
            for j in np.unique(homes[away]).tolist():
                if not self._usable(j):
                    away &= homes != j
        if restarting is None:
            # Steps: a broken or unreset env's step cannot be sent (its episode is gone); it fails in _park.
            return broken | unreset
        return broken | (away & restarting) | (unreset & ~restarting)

    def _park(self, kind, env_ids, moving, actions, resets, seeds, options) -> None:
        positions = np.flatnonzero(moving)
        ids = env_ids[positions]
        if actions is None:
            restarting = np.ones(len(ids), dtype=np.bool_)
        elif resets is None:
            restarting = np.zeros(len(ids), dtype=np.bool_)
        else:
            restarting = resets[positions]
        if actions is not None and not restarting.all():
            # A step (not a reset) for an env whose session is gone: answer with the loss at once.
            stepped = ids[~restarting]
            self._outstanding += 1
            error = ConnectionLost(f"the session of env(s) {stepped.tolist()} is gone; reset them on a new session", url="")
            asyncio.get_running_loop().call_soon(
                self._arrive, Arrival(kind, stepped, error, None, stepped, ""), int(self.link_of[stepped[0]]), True, False
            )
            keep = np.flatnonzero(restarting)
            if keep.size == 0:
                return
            positions, ids = positions[keep], ids[keep]
        parked = _Parked(kind, env_ids, actions, resets, seeds, options, time.monotonic() + self.step_timeout).part(positions)
        # The deadline holds even while a repair is stuck on a slow server.
        parked.timer = asyncio.get_running_loop().call_later(self.step_timeout, self._expire, parked)
        for i in ids.tolist():
            if not self.broken[i]:  # going home: treat as broken so the repairer moves it
                self.links[int(self.link_of[i])].drop([self.handles[i]])
                self.broken[i] = True
        self._parked.append(parked)
        self._outstanding += 1
        self._asked.set()
        self._ensure_repairer()

    def _ensure_repairer(self) -> None:
        if self._closing:
            return
        if self._repairer is None or self._repairer.done():
            self._repairer = asyncio.get_running_loop().create_task(self._repair(), name="openenv-gym repair")

    def _dead_homes(self) -> bool:
        """Whether some env lives away from a home server that does not answer yet (gone, or stalled)."""
        away = self.link_of != self.home_of
        return bool(away.any()) and any(not self.links[j].alive or self._suspect[j] for j in set(self.home_of[away].tolist()))

    def _stalled(self, j: int) -> None:
        """Link ``j`` did not answer in time but is connected: no new sessions there until it answers again."""
        if self._suspect[j] and time.monotonic() < self._avoid_until[j]:
            return  # (the same stall, seen by another of its requests: the window grows only once per stall)
        window = max(5.0, 2 * self.step_timeout) * 2 ** min(self._stalls[j], 4)
        self._avoid_until[j] = time.monotonic() + min(window, max(60.0, 2 * self.step_timeout))
        self._stalls[j] += 1
        self._suspect[j] = True

    def answered(self, j: int) -> None:
        """Link ``j`` answered a request: it no longer counts as stalled."""
        if self._suspect[j]:
            self._suspect[j] = False
            self._stalls[j] = 0
            self._avoid_until[j] = 0.0
            logger.info("%s answers again", self.links[j].url)

    async def _probe_stalled(self) -> None:
        """Ask the stalled links whose avoid window is over whether they answer now (all at once)."""
        now = time.monotonic()
        due = [j for j, link in enumerate(self.links) if self._suspect[j] and link.alive and now >= self._avoid_until[j]]
        if not due:
            return
        timeout = min(self.step_timeout, 5.0)
        outcomes = await asyncio.gather(*(self.links[j].probe(timeout) for j in due), return_exceptions=True)
        for j, ok in zip(due, outcomes):
            if ok is True:
                self.answered(j)
            else:
                self._stalled(j)

    async def _repair(self) -> None:
        """Open new sessions for broken envs, and revive servers envs were moved off (backoff with jitter)."""
        delay = 0.05
        while self.broken.any() or self._parked or self._dead_homes():
            progressed = await self._repair_once()
            if progressed:  # a server hosts sessions again: the grace period starts anew
                self.fatal = None
                self._unhosted_since = None
            self._release_parked()
            if not self.broken.any():
                self._unhosted_since = None
                if not self._parked and self._dead_homes():
                    # Everyone has a session; keep knocking on the servers they came from.
                    await self._nap(delay * random.uniform(0.5, 1.5))
                    delay = min(delay * 2, 5.0)
                continue
            if progressed:
                delay = 0.05
                continue
            now = time.monotonic()
            if self._unhosted_since is None:
                self._unhosted_since = now
            elif now - self._unhosted_since > self.grace and self.fatal is None:
                servers = "; ".join(f"{link.url}: {self.last_error.get(j, 'no error seen')}" for j, link in enumerate(self.links))
                self.fatal = PoolUnavailable(f"no server could host sessions for {self.grace:.0f} s ({servers})")
                self._release_parked(fail_all=True)
            wait = delay * random.uniform(0.5, 1.5)  # exponential backoff with jitter
            if self._parked:  # wake up for the earliest parked deadline
                wait = min(wait, max(self._next_deadline() - time.monotonic(), 0.0))
            # A new request waiting for a session cuts the backoff short (the server may be back).
            delay = 0.05 if await self._nap(wait) else min(delay * 2, 5.0)

    async def _nap(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less if a request starts waiting for a repair meanwhile (then true)."""
        if not self._asked.is_set():
            try:
                async with asyncio.timeout(seconds):
                    await self._asked.wait()
            except TimeoutError:
                return False
        self._asked.clear()
        return True

    def _next_deadline(self) -> float:
        return min((p.deadline for p in self._parked), default=time.monotonic() + 60.0)

    async def _repair_once(self) -> bool:
        """One round: revive dead links, open sessions where there is room. Whether any env got a session."""
        await self._probe_stalled()
        await self._revive_dead()
        progressed = await self._open_for_broken()
        if progressed:
            self._layout()
        return progressed

    async def _revive_dead(self) -> None:
        """Connect the dead links again, all at once; their idle sessions are lost with them (marked broken)."""
        dead = [j for j, link in enumerate(self.links) if not link.alive]
        for j in dead:
            # Its connection took every session on it, idle ones too: their handles must not be used
            # on the new connection, where the same session ids may be other envs' sessions.
            stale = np.flatnonzero((self.link_of == j) & ~self.broken)
            if stale.size:
                logger.warning("%d idle session(s) on %s lost with its connection; opening new ones", stale.size, self.links[j].url)
                self.broken[stale] = True
        if dead:  # all at once: a server that does not answer costs one connect timeout, not one each
            outcomes = await asyncio.gather(*(self.links[j].revive() for j in dead), return_exceptions=True)
            for j, outcome in zip(dead, outcomes):
                if isinstance(outcome, BaseException):
                    self.last_error[j] = f"{type(outcome).__name__}: {outcome}"
                elif self._suspect[j]:
                    self.answered(j)  # (a new connection's handshake is an answer; says so in the log)
                else:
                    logger.info("%s answers again", self.links[j].url)

    async def _open_for_broken(self) -> bool:
        """Open sessions for the envs without one: each env's home link first, then any live link with room. Whether any env got one."""
        progressed = False
        tried: set[int] = set()  # links not to ask again in this round
        usable = [j for j in range(len(self.links)) if self._usable(j)]
        blind = not usable
        if blind:
            # Every server stalled lately or is full by what the pool knows; but room is only known
            # from the start and the last refusal, and other clients come and go: ask the live ones.
            usable = [j for j, link in enumerate(self.links) if link.alive]
        for targets in ("home", "any"):
            broken = np.flatnonzero(self.broken)
            if broken.size == 0:
                break
            if targets == "any":  # least loaded first, each taking a fair share
                usable = sorted(usable, key=self._hosted)
            for n, j in enumerate(usable):
                if j in tried or not self.links[j].alive:
                    continue
                if targets == "home":
                    wanted = broken[self.home_of[broken] == j]
                else:
                    share = -(-broken.size // (len(usable) - n))  # ceil: the rest goes to later links
                    wanted = broken[:share]
                if blind:  # (the server refuses to open more sessions at once than its limit)
                    most = self.limit[j]
                    room = None if most is None else most - self._hosted(j)
                else:
                    room = self._room(j)
                wanted = wanted[: max(room, 0)] if room is not None else wanted
                if wanted.size and await self._open_on(j, wanted, tried):
                    progressed = True
                    broken = np.flatnonzero(self.broken)
        return progressed

    async def _open_on(self, j: int, wanted: np.ndarray, tried: set[int]) -> bool:
        """Open sessions on link ``j`` for the envs ``wanted`` (int64 ``(k,)``); whether any got one.

        A link that refuses, or opens fewer than asked, joins ``tried``; what it said
        updates what the pool knows of its room.
        """
        try:
            handles = await self.links[j].open(int(wanted.size))
        except OpenEnvGymError as exc:
            tried.add(j)  # not again in this round
            self.last_error[j] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, (SessionTimeout, ConnectError)):
                # (a stock link is "alive" with its server gone: new connections to it fail)
                self._stalled(j)
            if isinstance(exc, CapacityError) and exc.max_sessions is not None:
                # Learnt the hard way: the server's room now is what it has left (ours stay ours).
                left = exc.max_sessions - exc.active_sessions if exc.active_sessions is not None else 0
                self.capacity[j] = self._hosted(j) + max(left, 0)
                self.limit[j] = exc.max_sessions
            return False
        if len(handles) < wanted.size:  # (a stock server refuses sessions one by one: it is full now)
            tried.add(j)
            self.capacity[j] = self._hosted(j) + len(handles)
            wanted = wanted[: len(handles)]
            if not wanted.size:
                return False
        for i, handle in zip(wanted.tolist(), handles):
            self.handles[i] = handle
            self.link_of[i] = j
        self.broken[wanted] = False
        self.unreset[wanted] = True
        self._any_unreset = True
        return True

    def _usable(self, j: int) -> bool:
        """Whether link ``j`` may get new sessions now: it answers, has room, and has not stalled (or answered since)."""
        room = self._room(j)
        return self.links[j].alive and (room is None or room > 0) and not self._suspect[j]

    def _room(self, j: int) -> int | None:
        """How many more sessions link ``j`` may host, as far as the pool knows (``None``: no limit known)."""
        most = self.capacity[j]
        if most is None:
            return None
        return most - self._hosted(j)

    def _hosted(self, j: int) -> int:
        """How many of the pool's sessions link ``j`` hosts."""
        return int(np.count_nonzero((self.link_of == j) & ~self.broken))

    def _release_parked(self, fail_all: bool = False) -> None:
        """Send parked resets whose envs all have sessions; fail those past their deadline (``fail_all``: every other).

        Requests parked once the pool is unavailable still get their step
        timeout to find a session: a server may be back.
        """
        now = time.monotonic()
        still: list[_Parked] = []
        for parked in self._parked:
            have = ~self.broken[parked.env_ids]
            if have.any() and not have.all() and now < parked.deadline and not fail_all:
                # Those with a session go now; the others wait on (a server with room for some
                # of them would otherwise hold them all back, and see its new sessions dropped).
                self._send(parked.part(np.flatnonzero(have)))
                rest = parked.part(np.flatnonzero(~have))  # (the same object waits on: its timer names it)
                parked.env_ids, parked.actions, parked.resets, parked.seeds = rest.env_ids, rest.actions, rest.resets, rest.seeds
                still.append(parked)
                continue
            ready = bool(have.all())
            if ready or now >= parked.deadline or fail_all:
                self._outstanding -= 1
                if parked.timer is not None:
                    parked.timer.cancel()
                if ready:
                    self._send(parked)
                else:
                    error = self.fatal or SessionTimeout(
                        f"no server could host a new session for env(s) {parked.env_ids.tolist()} within {self.step_timeout} s; retrying",
                        timeout=self.step_timeout,
                    )
                    self._arrive_failed(parked, error)
            else:
                still.append(parked)
        self._parked = still

    def _send(self, parked: _Parked) -> None:
        """Send a parked request (its envs have sessions now)."""
        self.submit(parked.kind, parked.env_ids, actions=parked.actions, resets=parked.resets, seeds=parked.seeds, options=parked.options)

    def _expire(self, parked: _Parked) -> None:
        """A parked reset's deadline passed: it arrives as an error (the env stays broken)."""
        if parked in self._parked:
            self._parked.remove(parked)
            self._outstanding -= 1
            error = self.fatal or SessionTimeout(
                f"no server could host a new session for env(s) {parked.env_ids.tolist()} within {self.step_timeout} s; retrying",
                timeout=self.step_timeout,
            )
            self._arrive_failed(parked, error)

    def _arrive_failed(self, parked: _Parked, error: OpenEnvGymError) -> None:
        """A parked request fails as a whole. Not a lost session: those of its envs without one are broken
        already, and one that got a session meanwhile keeps it (that server did nothing wrong)."""
        self._outstanding += 1  # balanced by _arrive
        ids = parked.env_ids
        self._arrive(Arrival(parked.kind, ids, error, parked.resets, ids, ""), int(self.link_of[ids[0]]), check=False)

    async def state(self, env_id: int) -> dict[str, Any]:
        """The state fields of env ``env_id``'s session (as its server answers OpenEnv's ``state``)."""
        return await self.links[int(self.link_of[env_id])].state(self.handles[env_id])

    async def close(self) -> None:
        """Stop repairs and close every link. Requests in flight are abandoned, not repaired."""
        self._closing = True
        if self._repairer is not None:
            self._repairer.cancel()
            await asyncio.gather(self._repairer, return_exceptions=True)
        await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)
        for parked in self._parked:
            if parked.timer is not None:
                parked.timer.cancel()
        self._parked.clear()


class _Done:
    """The callback of one request: turns the link's answer into an arrival."""

    __slots__ = ("core", "kind", "ids", "resets", "rows", "link")

    def __init__(self, core: PoolCore, kind: str, ids: np.ndarray, resets, rows, link: int) -> None:
        self.core, self.kind, self.ids, self.resets, self.rows, self.link = core, kind, ids, resets, rows, link

    def __call__(self, results: Results | OpenEnvGymError, positions: np.ndarray | None = None, last: bool = True) -> None:
        core = self.core
        url = core.links[self.link].url
        if core._suspect[self.link] and not isinstance(results, OpenEnvGymError):
            core.answered(self.link)
        if positions is not None and len(positions) == 0:  # no env in this part
            if last:  # nothing left to answer: the request ends
                core._outstanding -= 1
                core._arrive_nothing()
            return
        if positions is None:
            arrival = Arrival(self.kind, self.ids, results, self.resets, self.rows, url)
        else:  # a part of the request's envs
            ids = self.ids[positions]
            arrival = Arrival(self.kind, ids, results, None if self.resets is None else self.resets[positions], ids, url)
        core._arrive(arrival, self.link, last)
