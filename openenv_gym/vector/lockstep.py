"""The lockstep path: a ``step()`` of every env, when every server is a healthy fast-path one.

A pool's ``step()`` is the hot path of most training loops: every env
stepped, one frame to each server, every answer awaited. The general road
(:meth:`PoolCore.submit` and :meth:`PoolCore.collect_into`) serves any
subset of envs, parked resets, answers in parts and repairs. This path
serves the common case only, with fewer layers per frame, and changes
nothing in what a step returns: its answers are the same :class:`Arrival` s.
A server whose sessions are bound into a lane (:meth:`FastLink.lane_for`)
gets the step as a raw frame, msgpack on neither side.

An answer that is not one whole batch without errors (an error reply, a
timeout, a lost connection, envs that failed), or one that comes after its
caller stopped waiting (a Ctrl-C), takes the general road: it becomes an
arrival of the core, and so does every other answer of the step, so that
the caller collects them all there. Faults are handled by the same code
whichever way a step went out.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Mapping

import numpy as np

from ..errors import OpenEnvGymError, SessionTimeout
from ..protocol.multiplex import Column
from .core import Arrival, PoolCore, _Done, call_all
from .links import FastLink, Results
from .rows import take_columns

__all__ = ["step_every_env"]


def step_every_env(
    core: PoolCore,
    future: "asyncio.Future[list[Arrival] | None]",
    *,
    actions: Mapping[str, Column],
    resets: np.ndarray | None,
    backstop: float,
) -> None:
    """Step every env (on the loop, from :meth:`LoopThread.run_started`).

    ``actions`` columns and ``resets`` (bool: reset this env instead) run
    over all envs. ``future`` gets the step's arrivals, one per server; or
    ``None`` when they are the core's to collect (the step went the general
    road); or :class:`SessionTimeout` after ``backstop`` seconds (only if
    an answer were lost: each request has its own deadline).
    """
    if not core.settled():
        call_all([functools.partial(core.submit, "step", core.every, actions=actions, resets=resets, partial=True, split=False)], future)
        return
    _Step(core, future, backstop).send(actions, resets)


class _Step:
    """One step of every env on the lockstep path: its answers, held until the last is in."""

    __slots__ = ("core", "future", "arrivals", "links", "left", "general", "backstop", "timer")

    def __init__(self, core: PoolCore, future: asyncio.Future, backstop: float) -> None:
        self.core = core
        self.future = future
        self.arrivals: list[Arrival | None] = []  # per request, in link order
        self.links: list[int] = []  # per request, its link
        self.left = 0  # requests not answered yet
        self.general = False  # an answer went the general road: so do all of them
        self.backstop = backstop
        self.timer = asyncio.get_running_loop().call_later(backstop, self._expire)

    def send(self, actions: Mapping[str, Column], resets: np.ndarray | None) -> None:
        core = self.core
        interrupt: BaseException | None = None
        for j, link in enumerate(core.links):
            ids = core._all[j]
            if not ids.size:
                continue
            assert isinstance(link, FastLink)
            rows = core._slices[j]
            link_resets = None if resets is None else resets[rows]
            handles, columns = core._link_handles[j], take_columns(actions, rows)
            lane = link.lane_for(handles, columns)
            request = _Request(self, len(self.arrivals), j, ids, rows, link_resets, link.url)
            self.arrivals.append(None)
            self.links.append(j)
            self.left += 1
            core._outstanding += 1
            try:  # (the link answers a failed send too: the connection gone, a value msgpack cannot carry)
                link.step(handles, columns, link_resets, request, partial=True, lane=lane)
            except (KeyboardInterrupt, SystemExit) as exc:
                # (the request is answered all the same; the other links' requests still go out)
                interrupt = interrupt or exc
        if not self.left:  # pragma: no cover - a pool has at least one env
            self._finish()
        if interrupt is not None:
            raise interrupt

    def answered(self, slot: int, arrival: Arrival) -> None:
        """A clean answer: held for the caller, or queued in the core once the step went the general road."""
        self.left -= 1
        if self.general or self.future.done():  # (done: its caller stopped waiting)
            self._go_general()
            self.core._arrive(arrival, self.links[slot], last=False, check=False)
        else:
            self.arrivals[slot] = arrival
        if not self.left:
            self._finish()

    def went_general(self, last: bool) -> None:
        """An answer (``last``: its request's last part) took the general road: it is an arrival of the core now."""
        self._go_general()
        if last:
            self.left -= 1
            if not self.left:
                self._finish()

    def _go_general(self) -> None:
        """Queue the clean answers held so far in the core, where the caller collects every answer of the step."""
        if self.general:
            return
        self.general = True
        for slot, arrival in enumerate(self.arrivals):
            if arrival is not None:
                self.core._arrive(arrival, self.links[slot], last=False, check=False)
        self.arrivals = []

    def _finish(self) -> None:
        self.timer.cancel()
        if not self.future.done():
            self.future.set_result(None if self.general else self.arrivals)

    def _expire(self) -> None:
        if not self.future.done():
            error = SessionTimeout(f"the step's answers did not all come within {self.backstop} s", timeout=self.backstop)
            self.future.set_exception(error)


class _Request:
    """The ``done`` of one link's request of a lockstep step (the link has checked the answer, as for any request)."""

    __slots__ = ("step", "slot", "link", "ids", "rows", "resets", "url")

    def __init__(self, step: _Step, slot: int, link: int, ids: np.ndarray, rows, resets: np.ndarray | None, url: str) -> None:
        self.step, self.slot, self.link, self.ids, self.rows, self.resets, self.url = step, slot, link, ids, rows, resets, url

    def __call__(self, results: Results | OpenEnvGymError, positions: np.ndarray | None = None, last: bool = True) -> None:
        step = self.step
        core = step.core
        if type(results) is Results and results.errors is None and positions is None:
            core._outstanding -= 1
            if core._suspect[self.link]:
                core.answered(self.link)
            step.answered(self.slot, Arrival("step", self.ids, results, self.resets, self.rows, self.url))
            return
        # The general road: an arrival of the core (or the envs' failure), as any request's answer; a part
        # (some envs' results while others still step) as one, the others' results or timeout to come.
        try:
            _Done(core, "step", self.ids, self.resets, self.rows, self.link)(results, positions, last)
        finally:
            step.went_general(last)
