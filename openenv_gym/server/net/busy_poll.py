"""Busy polling: a server's event loop that polls its sockets for a moment before it sleeps.

A server that sleeps between requests is woken by the kernel when the next
one comes. On a virtual machine that wake-up is dear: the idle virtual CPU
has halted, and the next request waits for the hypervisor to run it again.
Between a pool's lockstep steps (the gap in which the trainer reads the
replies and sends the next actions) that happens twice per step.

:class:`BusyPollSelector` waits the way Linux's ``net.core.busy_poll`` and
KVM's ``haltpoll`` do: it polls (``select`` with a zero timeout) for up to
``window`` seconds before it blocks, calling ``sched_yield`` between polls.
It gets out of the way of other work:

- it polls only after a wait for events that was itself no longer than
  ``window`` (not after one a timer ended): a server whose requests come
  back to back polls between them, one whose client pauses (a trainer
  computing between steps) sleeps, after one wait that polled in vain;
- it stops polling, and blocks, as soon as a ``sched_yield`` let another
  process run (it came back after more than :data:`YIELDED` seconds): a
  poller never takes turns with work that wants its CPU.

It still spends CPU that nobody else wants at that moment, and any peer
that sends bytes once per window keeps it polling: it is for fleets whose
clients are trusted with the CPU. POSIX only (``os.sched_yield``). Off by
default (``ServerConfig.busy_poll = 0``); ``openenv-gym serve --busy-poll
500`` turns it on; the README has the measurements.
"""

from __future__ import annotations

import asyncio
import math
import os
import selectors
import time
from typing import Callable

__all__ = ["BusyPollSelector", "BusyPollLoops", "check_window", "loop_factory", "MAX_WINDOW", "YIELDED"]

#: The longest busy-poll window a server takes, seconds.
MAX_WINDOW = 0.1
#: A ``sched_yield`` that took longer than this (seconds) let another process run: polling stops.
YIELDED = 50e-6

_yield: Callable[[], None] | None = getattr(os, "sched_yield", None)
_clock = time.monotonic


def check_window(window: float) -> None:
    """``ValueError`` unless ``window`` (seconds) is a busy-poll window this platform can poll for."""
    if not 0 < window <= MAX_WINDOW:
        raise ValueError(f"busy_poll: a busy-poll window is more than 0 and at most {MAX_WINDOW} s, got {window}")
    if _yield is None:
        raise ValueError("busy_poll: busy polling needs os.sched_yield (POSIX)")


class BusyPollSelector(selectors.DefaultSelector):
    """The platform's default selector, polling up to ``window`` seconds before a blocking wait that follows a short one.

    Attributes:
        window: seconds to poll before blocking.
        polled: waits that ended with events found by polling.
        slept: waits that blocked (after polling in vain, or without polling).
        yielded: polls cut short because another process ran.
    """

    def __init__(self, window: float) -> None:
        check_window(window)
        super().__init__()
        self.window = window
        self.polled = 0
        self.slept = 0
        self.yielded = 0
        self._last_wait = 0.0  # seconds the last wait for events lasted (inf: a timer ended it)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        ready = super().select(0)
        if ready:
            self._last_wait = 0.0
            return ready
        clock, yield_cpu = _clock, _yield
        assert yield_cpu is not None  # (checked when made)
        start = clock()
        window = self.window
        if self._last_wait <= window:
            end = start + (window if timeout is None else min(window, timeout))
            now = start
            while now < end:
                yield_cpu()
                before, now = now, clock()
                ready = super().select(0)
                if ready:
                    self.polled += 1
                    self._last_wait = clock() - start
                    return ready
                if now - before > YIELDED:  # (someone else wanted this CPU: let them have it)
                    self.yielded += 1
                    break
            if timeout is not None:
                timeout = max(0.0, timeout - (clock() - start))
        ready = super().select(timeout)
        self.slept += 1
        # (a wait that a timer ended says nothing of when requests come: as a long one, no polling after it)
        self._last_wait = clock() - start if ready else math.inf
        return ready


class BusyPollLoops:
    """Makes event loops that busy-poll for ``window`` seconds (a loop factory for ``asyncio.Runner``).

    Each is an ``asyncio.SelectorEventLoop`` whatever the event loop policy
    says; ``asyncio.Runner`` does not make it the thread's current loop.

    Attributes:
        window: seconds to poll before blocking.
        selectors: the selectors of the loops made, with their counts.
    """

    def __init__(self, window: float) -> None:
        check_window(window)  # (now, not as the loop starts)
        self.window = window
        self.selectors: list[BusyPollSelector] = []

    def __call__(self) -> asyncio.AbstractEventLoop:
        selector = BusyPollSelector(self.window)
        self.selectors.append(selector)
        return asyncio.SelectorEventLoop(selector)


def loop_factory(window: float) -> BusyPollLoops | None:
    """:class:`BusyPollLoops` for ``window`` seconds; ``None`` (asyncio's default loop, as ``asyncio.run`` makes it) if ``window`` is 0."""
    return BusyPollLoops(window) if window else None
