"""Busy polling: a server's event loop that polls its sockets for a moment before it sleeps.

A server that sleeps between requests is woken by the kernel when the next
one comes. On a virtual machine that wake-up is dear: the idle virtual CPU
has halted, and the next request waits for the hypervisor to run it again.
Between a pool's lockstep steps (the gap in which the trainer reads the
replies and sends the next actions) that happens twice per step.

:class:`BusyPollSelector` waits the way Linux's ``net.core.busy_poll`` and
KVM's ``haltpoll`` do: it polls (``select`` with no timeout, yielding the
CPU between polls with ``sched_yield``, so that any other runnable process
goes first) for up to ``window`` seconds before it blocks. It polls only
after a wait for events that was itself no longer than ``window`` (not
after one a timer ended): a server whose
requests come in bursts polls between them, one whose client pauses (a
trainer computing between steps) sleeps as before, after one blocked wait.

Off by default (``ServerConfig.busy_poll = 0``): polling spends CPU that a
trainer on the same cores may want. ``openenv-gym serve --busy-poll 500``
turns it on; the README has the measurements.
"""

from __future__ import annotations

import asyncio
import math
import os
import selectors
import time
from typing import Any, Callable

__all__ = ["BusyPollSelector", "loop_factory"]

#: The longest busy-poll window a server takes, seconds.
MAX_WINDOW = 0.1

_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


def _check_window(window: float) -> None:
    if not 0 < window <= MAX_WINDOW:
        raise ValueError(f"a busy-poll window is more than 0 and at most {MAX_WINDOW} s, got {window}")


class BusyPollSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's default selector, polling up to ``window`` seconds before each blocking wait that follows a short one.

    Attributes:
        window: seconds to poll before blocking.
        polled: waits that ended with events found by polling.
        slept: waits that blocked (found nothing by polling, or did not poll).
    """

    def __init__(self, window: float) -> None:
        _check_window(window)
        super().__init__()
        self.window = window
        self.polled = 0
        self.slept = 0
        self._last_wait = 0.0  # seconds the last wait for events lasted

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        ready = super().select(0)
        if ready:
            self._last_wait = 0.0
            return ready
        clock = time.monotonic
        start = clock()
        window = self.window
        if self._last_wait <= window:
            end = start + (window if timeout is None else min(window, timeout))
            while clock() < end:
                _yield()
                ready = super().select(0)
                if ready:
                    self.polled += 1
                    self._last_wait = clock() - start
                    return ready
            if timeout is not None:
                timeout = max(0.0, timeout - (clock() - start))
        ready = super().select(timeout)
        self.slept += 1
        # (a wait that a timer ended says nothing of when requests come: as a long one, no polling after it)
        self._last_wait = clock() - start if ready else math.inf
        return ready


def loop_factory(window: float) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory of event loops that busy-poll for ``window`` seconds (for ``asyncio.Runner``); ``None`` (asyncio's default loop, as ``asyncio.run`` makes it) if ``window`` is 0."""
    if window == 0:
        return None
    _check_window(window)  # (now, not as the loop starts)

    def make() -> Any:
        return asyncio.SelectorEventLoop(BusyPollSelector(window))

    return make
