"""One caller at a time inside a pool, and the one thread its awaited calls (``areset``, ``astep``, ``arecv``) run on.

The pool is not thread-safe: :func:`one_caller` refuses a second thread,
with one exception (an awaited ``arecv`` lets go of the pool while it waits
for replies, so that a ``send`` from the event loop's thread goes out
meanwhile). An ``arecv`` whose await is cancelled runs on; its batch is
handed to the next ``recv`` (:meth:`AwaitedCalls.claim`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from ..errors import SessionTimeout

if TYPE_CHECKING:
    from .env import OpenEnvVectorEnv

T = TypeVar("T")

#: What may be called while an awaited ``arecv`` runs on the pool's worker: it lets go of the pool
#: while it waits for replies, so that code awaiting ``arecv`` in one task can ``send`` from another.
#: (An awaited reset or step does not: a send would mix with the envs it waits for.)
_WHILE_AWAITED = frozenset({"send", "step_async"})


class AwaitedCalls:
    """The pool's lock, its worker thread for awaited calls, and the calls of cancelled ``arecv`` s.

    Attributes:
        in_use: held by the thread inside a public method of the pool.
        episodes: resets so far: a cancelled ``arecv``'s batch from before the last one is stale.
    """

    def __init__(self) -> None:
        self.in_use = threading.Lock()
        self.episodes = 0
        self._worker: ThreadPoolExecutor | None = None  # runs the awaited calls, one at a time
        self._worker_ident: int | None = None  # its thread
        self._running: str | None = None  # the awaited call running on it: "recv", or "other"
        self._unclaimed: collections.deque[Future] = collections.deque()  # calls of cancelled arecvs, oldest first
        self._claims = threading.Lock()

    def run(self, call: Callable[[], T], kind: str = "other") -> "Future[T]":
        """Run ``call`` on the worker thread (made on first use); ``kind``: ``"recv"`` for an ``arecv``."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-gym-await")

        def awaited() -> T:
            self._worker_ident = threading.get_ident()
            self._running = kind
            try:
                return call()
            finally:
                self._running = None

        return self._worker.submit(awaited)

    def claim(self) -> "Future | None":
        """The oldest call of a cancelled ``arecv``, if any (thread-safe)."""
        with self._claims:
            return self._unclaimed.popleft() if self._unclaimed else None

    def unclaim(self, job: Future, *, first: bool = False) -> None:
        """Hand ``job`` (a cancelled ``arecv``'s call) to the next ``recv``; ``first``: before the others."""
        with self._claims:
            if first:
                self._unclaimed.appendleft(job)
            else:
                self._unclaimed.append(job)

    def forget(self) -> None:
        """Drop the calls of cancelled ``arecv`` s (a reset makes their batches stale; a close, unwanted)."""
        with self._claims:
            self._unclaimed.clear()

    def handed_on(self, job: Future, error: BaseException | None, timeout: float | None) -> Any:
        """The batch of a cancelled ``arecv``'s call, once waited for (``error``: what the wait raised).

        ``None`` when it has none to give: it failed (its envs are still in
        flight, or the pool is closed), or it is from before a reset.

        Raises:
            SessionTimeout: the wait ran out before the call ended (it stays handed on).
        """
        if error is None:
            episodes, batch = job.result()
            return batch if episodes == self.episodes else None
        if isinstance(error, TimeoutError) and not (job.done() and job.exception() is error):
            self.unclaim(job, first=True)  # still running (or just done): the next recv takes it
            raise SessionTimeout(f"no env was ready within {timeout} s", timeout=timeout) from None
        return None

    @contextlib.contextmanager
    def letting_go(self) -> Iterator[None]:
        """Within: the pool is free for a ``send`` from another thread, if this is an awaited ``arecv`` waiting for replies."""
        letting_go = self._running == "recv" and threading.get_ident() == self._worker_ident
        if letting_go:
            self.in_use.release()
        try:
            yield
        finally:
            if letting_go:
                self.in_use.acquire()

    def shutdown(self) -> None:
        """Stop the worker (calls still queued on it run, and find the pool closed) and forget handed-on calls."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=False)
        self.forget()

    def enter(self, name: str, interleaves: bool, wait_bound: Callable[[], float]) -> None:
        """Take :attr:`in_use` for a call of the pool's method ``name``, or raise; the caller releases it.

        ``interleaves``: the method may run while an awaited ``arecv`` waits for
        replies (it waits at most ``wait_bound()`` seconds for the pool).
        """
        lock = self.in_use
        awaited = self._running
        on_worker = awaited is not None and threading.get_ident() == self._worker_ident
        beside = interleaves and awaited == "recv" and not on_worker  # (a send while an arecv waits)
        if not lock.acquire(blocking=False):
            if not (on_worker or beside) or not lock.acquire(timeout=wait_bound()):
                raise _refuse(name)
        if self._running is not awaited:  # (an awaited call began as this thread came in: judge by it)
            awaited = self._running
            on_worker = awaited is not None and threading.get_ident() == self._worker_ident
            beside = interleaves and awaited == "recv" and not on_worker
        if awaited is not None and not (on_worker or beside):
            lock.release()
            raise _refuse(name)  # (an awaited arecv waits for replies, and lets go of the pool meanwhile)


def _refuse(name: str) -> RuntimeError:
    return RuntimeError(f"OpenEnvVectorEnv.{name}: the pool is in use by another thread (it is not thread-safe)")


def one_caller(method: Callable[..., T]) -> Callable[..., T]:
    """Refuse a second thread while one is inside the pool (it is not thread-safe).

    The one exception: :data:`_WHILE_AWAITED` calls while an awaited ``arecv``
    runs. They wait for the moments in which it works on the pool's buffers,
    and it waits for them in turn.
    """
    name = method.__name__.lstrip("_")
    interleaves = name in _WHILE_AWAITED

    @functools.wraps(method)
    def guarded(self: "OpenEnvVectorEnv", *args: Any, **kwargs: Any) -> T:
        calls = self._awaited_calls
        calls.enter(name, interleaves, self._wait_bound)
        try:
            with self._io.holding_ctrl_c():  # (a Ctrl-C waits for a safe point: see the pool's _receive, _take_ready)
                return method(self, *args, **kwargs)
        finally:
            calls.in_use.release()

    return guarded
