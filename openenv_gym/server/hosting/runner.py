"""Where env calls run: inline on the event loop, or in a thread pool.

Most Gymnasium steps take microseconds; a thread hop costs tens of
microseconds, more than the step. Some envs block (a simulator, a sleep, a
remote call) and would stall every other session of the process if run on the
loop. :class:`Runner` in ``"auto"`` mode runs calls inline and keeps a moving
average of their durations (each call weighs :data:`SMOOTHING`); once the
average exceeds ``threshold`` seconds, the runner moves to the thread pool
(one log line). So one call longer than ``threshold / SMOOTHING`` (50 ms by
default) switches at once, as do calls that keep taking longer than
``threshold``; a lone slow call (Gymnasium's env checker on the first reset,
the process being preempted) does not. Once the switch happens in the middle
of a frame's calls, the rest of them run in threads. The calls in threads are
timed too: after :data:`RETURN_AFTER` of them in a row faster than
``threshold``, once their average is below ``threshold * RETURN_FRACTION``,
calls run inline again (one log line), so that a few slow calls (a peer's
reset with huge options, say) do not cost every later call a thread hop,
while an env whose calls are slow now and then stays in threads.
``"inline"`` and ``"thread"`` force one way. ``"session"`` gives each
session a thread of its own, made with it, that runs all its env's calls
(construction, reset, step, close): what OpenEnv's own server does, for envs
whose resources belong to the thread that made them (an ``sqlite3``
connection) or whose steps run an event loop of their own (``asyncio.run``).
Calls that belong to no session (an MCP request's) run in the pool.

One runner serves all sessions of one kind of env in a process; the
connection loops keep each session's calls in order, so a session's env is
never called from two threads at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Literal, TypeVar

__all__ = ["Execution", "Runner", "SMOOTHING", "RETURN_AFTER", "RETURN_FRACTION"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

Execution = Literal["auto", "inline", "thread", "session"]

#: Weight of the newest call in the moving average of call durations.
SMOOTHING = 0.1

#: ``"auto"``: calls in a row faster than the threshold, made in threads, before calls may run inline again.
RETURN_AFTER = 1024

#: ``"auto"``: calls return inline once their average is below this fraction of the threshold.
RETURN_FRACTION = 0.25


class Runner:
    """Runs synchronous env calls for the connection loops.

    Args:
        name: what the calls are for, in log lines (for example the env id).
        mode: ``"auto"`` (inline until a call takes longer than ``threshold``),
            ``"inline"``, ``"thread"`` or ``"session"`` (a thread per session:
            hosts made by :meth:`open_session`).
        threshold: seconds; in ``"auto"`` mode, when the moving average of call
            durations exceeds it, later calls run in threads (until they are
            fast again: see the module's description).
        threads: worker threads of the pool (created on first use).
    """

    def __init__(self, name: str, *, mode: Execution = "auto", threshold: float = 0.005, threads: int = 64) -> None:
        if mode not in ("auto", "inline", "thread", "session"):
            raise ValueError(f"execution mode must be auto, inline, thread or session, got {mode!r}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.name = name
        self.mode = mode
        self.threshold = float(threshold)
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._threaded = mode in ("thread", "session")
        self._session_threads: dict[int, ThreadPoolExecutor] = {}  # id(host): its own thread ("session")
        self._average = 0.0  # seconds, moving average of call durations
        self._fast_in_threads = 0  # calls in a row made in threads faster than the threshold

    @property
    def threaded(self) -> bool:
        """Whether calls now run in the thread pool."""
        return self._threaded

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="openenv-gym-env")
        return self._pool

    def _executor_of(self, fn: Callable[..., Any]) -> ThreadPoolExecutor:
        """Where ``fn`` runs in threads: its host's own thread (a bound method of a session's host), else the pool."""
        if self._session_threads:
            own = self._session_threads.get(id(getattr(fn, "__self__", None)))
            if own is not None:
                return own
        return self._executor()

    async def open_session(self, make: Callable[[], T]) -> T:
        """``make()`` (a new host) on a new thread, which then runs every call of that host (``"session"`` mode).

        Until :meth:`end_session`, calls whose ``fn`` is a bound method of the
        host run there, one at a time, in order.
        """
        thread = ThreadPoolExecutor(1, thread_name_prefix="openenv-gym-session")
        try:
            host = await asyncio.get_running_loop().run_in_executor(thread, make)
        except BaseException:
            thread.shutdown(wait=False, cancel_futures=True)
            raise
        self._session_threads[id(host)] = thread
        return host

    def end_session(self, host: Any) -> None:
        """Let ``host``'s own thread go (after its last call, its ``close``); nothing if it has none."""
        thread = self._session_threads.pop(id(host), None)
        if thread is not None:
            thread.shutdown(wait=False)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, inline or in a thread; exceptions propagate."""
        if self._threaded:
            return await asyncio.get_running_loop().run_in_executor(self._executor_of(fn), self._timed, fn, args)
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._observe(time.perf_counter() - start)

    def _observe(self, elapsed: float) -> None:
        """Fold one inline call's duration (seconds) into the average; maybe switch to threads."""
        self._average += (elapsed - self._average) * SMOOTHING
        self._check(elapsed)

    def _timed(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn(*args)`` in a pool thread, its duration folded in (:meth:`_observe_threaded`)."""
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._observe_threaded(time.perf_counter() - start)

    def _observe_threaded(self, elapsed: float) -> None:
        """Fold one threaded call's duration (seconds) in; maybe return to inline calls.

        Runs in pool threads: an update lost to a race only delays the return.
        """
        self._average += (elapsed - self._average) * SMOOTHING
        self._fast_in_threads = self._fast_in_threads + 1 if elapsed < self.threshold else 0
        if (
            self.mode == "auto"
            and self._threaded
            and self._fast_in_threads >= RETURN_AFTER
            and self._average < self.threshold * RETURN_FRACTION
        ):
            self._threaded = False
            logger.info(
                "%s: calls take %.2f ms on average (threshold %.1f ms); env calls run inline again",
                self.name,
                self._average * 1e3,
                self.threshold * 1e3,
            )

    def _check(self, elapsed: float) -> None:
        if self._average > self.threshold and self.mode == "auto" and not self._threaded:
            self._fast_in_threads = 0
            self._threaded = True
            logger.info(
                "%s: calls take %.1f ms on average (last %.1f ms, threshold %.1f ms); env calls run in threads from now on",
                self.name,
                self._average * 1e3,
                elapsed * 1e3,
                self.threshold * 1e3,
            )

    def observe(self, elapsed: float) -> bool:
        """Fold one inline call's duration (seconds) in; whether calls now go to threads.

        :meth:`_observe` and :meth:`_check` in one call: this runs once per env call.
        """
        average = self._average = self._average + (elapsed - self._average) * SMOOTHING
        if average > self.threshold and self.mode == "auto" and not self._threaded:
            self._check(elapsed)
        return self._threaded

    async def call_many(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        """Run independent calls (of different sessions); results or exceptions, in order.

        Inline, they run one after the other, until the runner moves to
        threads; the rest then run in threads, all at once.
        """
        results = [] if self._threaded else self.call_many_inline(calls)
        if len(results) < len(calls):
            results += await self._call_in_threads(calls[len(results) :])
        return results

    def call_many_inline(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        """Run ``calls`` one after the other on this thread; results or exceptions, in order.

        Stops early (fewer results than calls) as soon as the calls made it
        move to threads: the caller runs the rest there, so that a batch of
        slow calls does not hold the event loop for all of them.
        """
        results: list[Any] = []
        append = results.append
        clock = time.perf_counter
        # Without a coroutine per call: this loop is the server's hot path.
        for fn, args in calls:
            start = clock()
            try:
                append(fn(*args))
            except Exception as exc:
                append(exc)
            self._observe(clock() - start)
            if self._threaded:
                break
        return results

    def call_each(
        self,
        calls: list[tuple[Callable[..., Any], tuple[Any, ...]]],
        on_result: Callable[[int, Any], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Start ``calls`` in the pool at once; ``on_result(k, result or exception)`` runs on ``loop`` as each ends."""

        def run(k: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
            try:
                result = self._timed(fn, args)
            except Exception as exc:
                result = exc
            loop.call_soon_threadsafe(on_result, k, result)

        for k, (fn, args) in enumerate(calls):
            self._executor_of(fn).submit(run, k, fn, args)

    async def _call_in_threads(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        """Run ``calls`` in the pool at once; wake the event loop once, when the last one ends."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        results: list[Any] = [None] * len(calls)
        left = [len(calls)]
        lock = threading.Lock()

        def run(i: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
            try:
                results[i] = self._timed(fn, args)
            except Exception as exc:
                results[i] = exc
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(_finish, finished)

        for i, (fn, args) in enumerate(calls):
            self._executor_of(fn).submit(run, i, fn, args)
        await finished
        return results

    def shutdown(self) -> None:
        """Stop the pool without waiting for calls still running."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        threads, self._session_threads = list(self._session_threads.values()), {}
        for thread in threads:
            thread.shutdown(wait=False, cancel_futures=True)


def _finish(future: "asyncio.Future[None]") -> None:
    """Complete ``future`` unless it is done already (a loop callback)."""
    if not future.done():
        future.set_result(None)
