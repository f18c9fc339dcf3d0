"""One event loop that runs all network I/O for the sync faces.

``OpenEnvEnv`` and ``OpenEnvVectorEnv`` are synchronous; the session client is
asyncio. They meet here, in one event loop per process, driven by whichever
thread needs it:

- A sync call drives the loop itself, on the caller's thread
  (``run_until_complete``). A step then costs no thread switch: the reply is
  read, decoded and handed back by the thread that waits for it.
- When no call has driven the loop for ``idle_after`` seconds, a daemon thread
  takes it over, so that keepalive pings are answered and background work goes
  on while the trainer computes. The next call takes the loop back.
- A caller that is already inside a running asyncio loop (a notebook, an async
  app) cannot run a second loop on its thread: its call is handed to the
  daemon thread instead, which drives the loop meanwhile.

A Ctrl-C that comes while a call runs on the main thread is held for a safe
point, as ``asyncio.run`` holds it for its task (:class:`_DeferredCtrlC`):
between two of the loop's callbacks, where it cancels the call, or at the
calling pool's own safe points (:meth:`LoopThread.holding_ctrl_c`). One that
comes after the call handed its results back is owed: the next call raises it
before it does anything.

A call may also wait without running the loop at all (:meth:`LoopThread.run_started`
with ``readers``): it reads the sockets it waits on itself and hands their bytes
to their protocols, as the loop's transports would. This saves the loop's
machinery on the hot path (a lockstep step of a pool), and is allowed only
while the loop ran a moment ago (:data:`DIRECT_WINDOW`): its timers and other
callbacks run late by at most that much. Anything the loop must see (the end
of a stream, a read error, a Ctrl-C, a wait longer than :data:`DIRECT_WAIT`)
hands the rest of the wait back to the loop.

A lock makes sure that one thread at a time drives the loop. A call made
while another thread's call drives it (pools stepped in several threads) is
handed to the loop being driven, as a hop to the daemon is: it does not wait
for the other call to end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import math
import os
import select
import signal
import threading
import time
from concurrent import futures
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Coroutine, Iterator, TypeVar

from ._internals import c_signal, ready_queue, running_loop, set_running_loop, wake_fd
from ._reads import READ_SIZE

__all__ = ["LoopThread"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Seconds a call interrupted by a Ctrl-C is given to clean up once cancelled (close what it opened).
CANCEL_GRACE = 5.0
#: A call may wait by reading its sockets itself only if the loop ran within this many seconds.
DIRECT_WINDOW = 0.02
#: Seconds a call reads its sockets itself before it hands the wait back to the loop.
DIRECT_WAIT = 0.02
#: Whether this platform has what a direct wait needs (``select.poll``, file descriptors ``os.read`` can read).
_DIRECT_LOOPS = hasattr(select, "poll") and os.name == "posix"

#: Sockets a call may read itself: ``(file descriptor, protocol, transport)``, the protocol's ``data_received`` fed what is read.
Readers = tuple[tuple[int, asyncio.Protocol, asyncio.Transport], ...]


class _DeferredCtrlC:
    """Holds back a Ctrl-C that arrives while the main thread is in a call, as ``asyncio.Runner`` does.

    Python raises ``KeyboardInterrupt`` between any two bytecodes: inside the
    loop's callbacks, or in a pool's own bookkeeping, it would land anywhere
    (between counting a request and writing it, in a reply half filed). While
    armed, the first Ctrl-C is only counted. While the loop runs a call that
    :meth:`watch` es it, the Ctrl-C calls the call's ``cancel`` on the loop,
    between two callbacks, and the call raises ``KeyboardInterrupt`` once the
    loop lets go of it; otherwise the caller raises it at its next safe point
    (:meth:`LoopThread.check_interrupt`). A second Ctrl-C raises at once.

    Armed only on the main thread (the only one signals reach), and only over
    Python's default handler: a handler the program installed is left alone.
    Arming and disarming cost ~1 us: ``_signal``'s functions, not ``signal``'s
    wrappers, which convert handlers to enums through a raised ``ValueError``
    (12 us a pair here, and ~50 us of a pool's step in context).
    """

    __slots__ = ("_loop", "_cancel", "interrupts", "settled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cancel: Callable[[], Any] | None = None
        self.interrupts = 0
        self.settled = False  # (held over a pool's call: its results are handed back, see LoopThread.settle)

    @classmethod
    def arm(cls, loop: asyncio.AbstractEventLoop) -> "_DeferredCtrlC | None":
        """Install the deferring handler for SIGINT; ``None`` where it cannot or must not be."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if c_signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        guard = cls(loop)
        try:
            c_signal.signal(signal.SIGINT, guard._handle)
        except ValueError:  # (not the main interpreter)
            return None
        return guard

    def disarm(self) -> None:
        """Put Python's default handler back."""
        c_signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch(self, cancel: Callable[[], Any]) -> None:
        """While the loop runs a call: a Ctrl-C calls ``cancel`` on the loop (at once, for one that came already)."""
        self._cancel = cancel
        if self.interrupts:
            self._loop.call_soon_threadsafe(cancel)  # (after what is queued already: a started call's start)

    def unwatch(self) -> None:
        self._cancel = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            cancel = self._cancel
            if cancel is None:
                return  # (the caller's own work: it raises at its next safe point)
            try:
                self._loop.call_soon_threadsafe(cancel)  # (wakes the loop's select, too)
                return
            except RuntimeError:  # the loop is closed
                pass
        raise KeyboardInterrupt


class LoopThread:
    """An asyncio event loop shared by the sync faces of one process.

    Use :meth:`shared` for the process-wide instance.

    Args:
        idle_after: seconds without a sync call after which the daemon thread
            drives the loop.
    """

    _shared: "LoopThread | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "openenv-gym-io", idle_after: float = 0.25) -> None:
        self.loop = asyncio.new_event_loop()
        self.idle_after = idle_after
        self._pid = os.getpid()
        self._drive = threading.Lock()  # held by the thread driving the loop
        self._state = threading.Condition()
        self._callers = 0  # sync calls driving or waiting to drive the loop
        self._hops = 0  # calls handed to the daemon thread
        self._kicked = False  # work was scheduled with nobody driving: the daemon drives now
        self._last_call = time.monotonic()
        self._handoff: asyncio.Future[None] | None = None
        self._daemon_holds = False  # the daemon thread holds the drive lock (a caller asks it to let go)
        self._held: _DeferredCtrlC | None = None  # the main thread's call holds Ctrl-C (holding_ctrl_c)
        self._owed = False  # a held Ctrl-C came after its call handed its results back: the next call raises it
        self._closed = False
        self._loop_ran = 0.0  # (time.monotonic()) when a run of the loop last ended
        self._poller: tuple[tuple[int, ...], Any] = ((), None)  # the file descriptors last waited on directly, and their poll object
        self.direct_waits = 0  # calls that waited without running the loop (see run_started)
        self._background: set[Future[Any]] = set()  # submitted, not yet done (see stop)
        self._thread = threading.Thread(target=self._daemon, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> "LoopThread":
        """The process-wide loop, made on first use (and anew in a forked child)."""
        with cls._shared_lock:
            current = cls._shared
            if current is None or current._pid != os.getpid() or current._closed:
                current = cls._shared = cls()
                atexit.register(current.stop)
            return current

    # ------------------------------------------------------------ the daemon

    def _daemon(self) -> None:
        while True:
            with self._state:
                while True:
                    if self._closed:
                        return
                    quiet = time.monotonic() - self._last_call
                    # A sync caller waiting for the loop drives it (hopped calls run then too).
                    if self._callers == 0 and (self._hops or self._kicked or quiet >= self.idle_after):
                        self._kicked = False
                        break
                    # A timed wait, never an endless one: a call that ends need not wake this thread
                    # (a wake-up per step would cost a context switch and the GIL).
                    self._state.wait(self.idle_after if self._callers else max(self.idle_after - quiet, 0.001))
                handoff = self._handoff = self.loop.create_future()
            with self._drive:
                self._daemon_holds = True
                try:
                    if not self._callers:
                        self._run_until(handoff)
                finally:
                    self._daemon_holds = False
                    self._handoff = None

    def _release_daemon(self) -> None:
        """Ask the daemon thread to stop driving the loop (thread-safe)."""
        handoff = self._handoff
        if handoff is not None:
            try:
                self.loop.call_soon_threadsafe(_finish, handoff)
            except RuntimeError:  # the loop is closed
                pass

    # ------------------------------------------------------------ calls

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, finish: bool = False) -> T:
        """Run ``coro`` on the loop and return its result.

        ``timeout`` (seconds) bounds the wait; on timeout the coroutine is
        cancelled and ``TimeoutError`` raised. A Ctrl-C cancels the call
        between two of the loop's callbacks (:class:`_DeferredCtrlC`), and
        ``KeyboardInterrupt`` is raised once it has cleaned up; with
        ``finish`` (closing), the call runs to its end first. A second
        Ctrl-C cancels it.
        """
        if self._closed:
            coro.close()
            raise RuntimeError("the I/O loop is stopped")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("cannot wait for the I/O loop from inside it")
        try:
            self._check_process()
        except RuntimeError:
            coro.close()
            raise
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        if running_loop() is None:
            with self._driving() as driving:
                if driving:
                    task = self.loop.create_task(coro)
                    ctrl_c, own = self._guard()
                    if ctrl_c is not None and not finish:  # (finishing: a Ctrl-C is only counted)
                        ctrl_c.watch(task.cancel)
                    try:
                        try:
                            result = self._run_until(task)
                        finally:
                            interrupted = ctrl_c is not None and self._unguard(ctrl_c, own)
                        if interrupted and finish and own:
                            raise KeyboardInterrupt  # (finished: nothing of the call is lost)
                        return result
                    except asyncio.CancelledError:
                        if interrupted:  # cancelled by a Ctrl-C, and cleaned up (a call done first returns)
                            raise KeyboardInterrupt from None
                        raise
                    except BaseException:
                        if not task.done():  # interrupted (a second Ctrl-C): cancel the call, let it clean up
                            self._cancel(task)
                        raise
        return self._hop(coro, timeout)  # (bounded from now too: the loop may not run the call at once)

    def _held_here(self) -> "_DeferredCtrlC | None":
        """The guard of a call on this thread that holds Ctrl-C (:meth:`holding_ctrl_c`), if any."""
        held = self._held
        if held is not None and threading.current_thread() is threading.main_thread():
            return held
        return None

    def _guard(self) -> "tuple[_DeferredCtrlC | None, bool]":
        """The Ctrl-C guard for a run on this thread: the held one (:meth:`holding_ctrl_c`), or a new one (``own``)."""
        held = self._held_here()
        if held is not None:
            return held, False
        return _DeferredCtrlC.arm(self.loop), True

    @staticmethod
    def _unguard(ctrl_c: _DeferredCtrlC, own: bool) -> bool:
        """End a run's watch (and its own guard); whether a Ctrl-C came (before the run or in it)."""
        ctrl_c.unwatch()
        if own:
            ctrl_c.disarm()
        return ctrl_c.interrupts > 0

    @contextlib.contextmanager
    def holding_ctrl_c(self) -> Iterator[None]:
        """Hold a Ctrl-C over a whole sync call on the main thread, its own work included, not only its runs.

        A Ctrl-C in a run cancels it there (:meth:`run`, :meth:`run_started`).
        One in the call's own work waits for its next run (which starts, then
        raises), or for :meth:`check_interrupt`; if none comes, it is raised
        as the call ends, unless the call handed its results back first
        (:meth:`settle`): the call then returns them, and the next call that
        holds Ctrl-C raises it as it begins, before it does anything. Nested:
        the outermost holds.
        """
        if self._held is not None or threading.current_thread() is not threading.main_thread():
            yield
            return
        if self._owed:
            self._owed = False
            raise KeyboardInterrupt  # (it came as the last call ended, after it had handed its results back)
        guard = _DeferredCtrlC.arm(self.loop)
        if guard is None:
            yield
            return
        self._held = guard
        try:
            yield
        finally:
            self._held = None
            guard.disarm()
        if guard.interrupts:
            if not guard.settled:
                raise KeyboardInterrupt
            self._owed = True  # (raised now, it would lose the results the call hands back)

    def check_interrupt(self) -> None:
        """Raise ``KeyboardInterrupt`` if a held Ctrl-C came (a safe point of the holding call)."""
        held = self._held
        if held is not None and held.interrupts and threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt

    def settle(self) -> None:
        """The holding call has handed its results over: a Ctrl-C from now on is not raised (they would be lost)."""
        held = self._held
        if held is not None and threading.current_thread() is threading.main_thread():
            if held.interrupts:
                raise KeyboardInterrupt  # (it came before: raised, the results not handed over)
            held.settled = True

    def _run_until(self, future: "asyncio.Future[T]") -> T:
        """``loop.run_until_complete(future)``, run past a stop that an interrupted earlier run left queued.

        An interrupt (``KeyboardInterrupt``) that lands as a run's future is
        done leaves asyncio's stop callback queued: the next run would stop at
        once ("Event loop stopped before Future completed"), and the daemon
        thread would die of it.
        """
        while True:
            try:
                return self.loop.run_until_complete(future)
            except RuntimeError as exc:
                if future.done() or str(exc) != "Event loop stopped before Future completed.":
                    raise
                # (the stale stop is spent: run again)
            finally:
                self._loop_ran = time.monotonic()

    def _cancel(self, task: "asyncio.Task[Any]") -> None:
        """Cancel ``task`` and drive the loop until it ends (at most :data:`CANCEL_GRACE` s).

        A call cut short by a Ctrl-C would else run on under the daemon and
        keep what it made (sessions it opened, say) with nobody to close it;
        cancelled, it closes them itself.
        """
        task.cancel()
        try:
            self._run_until(asyncio.ensure_future(asyncio.wait([task], timeout=CANCEL_GRACE), loop=self.loop))
        except BaseException:  # (a second Ctrl-C: the first one is raised)
            logger.debug("cancelling an interrupted call did not finish", exc_info=True)
        if task.done() and not task.cancelled():
            task.exception()  # (the interrupt itself, raised in it: the caller raises it; not "never retrieved")

    def run_started(
        self,
        start: Callable[["asyncio.Future[T]"], None],
        abandon: Callable[[T], None] | None = None,
        readers: Callable[[], Readers | None] | None = None,
    ) -> T:
        """Call ``start(future)`` on the loop and drive the loop until ``future`` is done; its result.

        The cheap form of :meth:`run` for the hot path: no task, no coroutine.
        ``start`` must see to it that ``future`` gets done (and bound the wait).
        ``abandon`` gets the result of a future that was done when an
        interrupt (``KeyboardInterrupt``) cut the wait short, so that it is not lost.

        ``readers``: returns the plain sockets (no TLS) whose replies
        ``future`` waits for, with their protocols and transports, or
        ``None``; asked while this thread holds the loop. When the loop ran a moment ago
        (:data:`DIRECT_WINDOW`) and has no callback queued, ``start`` runs
        on this thread with the loop set as the running one, and the wait
        reads these sockets itself (:meth:`_wait_directly`); the loop
        finishes what that leaves. (This reads two private attributes of
        asyncio's own loops, its ready queue and its self-pipe; a loop
        without them never waits directly.)
        """
        if self._closed:
            raise RuntimeError("the I/O loop is stopped")
        if threading.current_thread() is self._thread:
            raise RuntimeError("cannot wait for the I/O loop from inside it")
        self._check_process()
        if running_loop() is None:
            with self._driving() as driving:
                if driving:
                    future: asyncio.Future[T] = self.loop.create_future()
                    ctrl_c, own = self._guard()
                    direct = (
                        readers is not None
                        and _DIRECT_LOOPS
                        and time.monotonic() - self._loop_ran < DIRECT_WINDOW
                        and isinstance(self.loop, asyncio.SelectorEventLoop)
                        and (ready := ready_queue(self.loop)) is not None
                        and not ready  # (nothing queued to run before `start`)
                        and wake_fd(self.loop) is not None
                        and (ctrl_c is None or not ctrl_c.interrupts)
                        and (sockets := readers()) is not None
                    )
                    if not direct:
                        self.loop.call_soon(start, future)  # we drive the loop: no other thread touches it
                    # A Ctrl-C lets go of the future after `start` has run (the loop runs callbacks in order).
                    if ctrl_c is not None:
                        ctrl_c.watch(future.cancel)
                    try:
                        try:
                            if direct:
                                self._start_directly(start, future, sockets, ctrl_c)  # type: ignore[arg-type]  # (direct: sockets is set)
                            result = future.result() if future.done() else self._run_until(future)
                        finally:
                            interrupted = ctrl_c is not None and self._unguard(ctrl_c, own)
                    except asyncio.CancelledError:
                        if interrupted:
                            raise KeyboardInterrupt from None
                        raise
                    except BaseException:
                        if abandon is not None and future.done() and not future.cancelled() and future.exception() is None:
                            abandon(future.result())  # (interrupted as it ended: its result is not lost)
                        raise
                    finally:
                        if not future.done():  # interrupted (KeyboardInterrupt): whoever waits on it lets go
                            future.cancel()
                    if interrupted and abandon is not None:
                        abandon(result)  # (the Ctrl-C came as it ended: its result is not lost)
                        raise KeyboardInterrupt
                    return result

        return self._hop_started(start)

    def _start_directly(
        self, start: Callable[["asyncio.Future[T]"], None], future: "asyncio.Future[T]", readers: Readers, ctrl_c: "_DeferredCtrlC | None"
    ) -> None:
        """``start(future)`` on this thread, then :meth:`_wait_directly`, the loop set as this thread's running loop meanwhile."""
        loop = self.loop
        set_running_loop(loop)  # (what the loop's own run sets: the callbacks may ask for the running loop)
        try:
            try:
                start(future)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # (as the loop treats a callback that raises)
                loop.call_exception_handler({"message": "exception in a started call", "exception": exc})
            self._wait_directly(future, readers, ctrl_c)
        finally:
            set_running_loop(None)

    def _wait_directly(self, future: "asyncio.Future[Any]", readers: Readers, ctrl_c: "_DeferredCtrlC | None") -> None:
        """Read ``readers`` on this thread, their bytes to their protocols, until ``future`` is done.

        Leaves the rest to the loop after :data:`DIRECT_WAIT` seconds; at
        once when the loop has work of its own: a callback queued (an error
        answered by ``call_soon``, a transport closing), bytes a transport
        still has to write, or anything handed to the loop from elsewhere
        (``call_soon_threadsafe``: a Ctrl-C's cancel, another thread's call),
        which wakes the loop's self-pipe, watched here too and left unread
        for the loop; and at a socket's end or read error, left for its
        transport to find.
        """
        loop = self.loop
        ready = ready_queue(loop)
        wake = wake_fd(loop)
        if ready is None or wake is None:
            return
        if future.done() or ready or any(transport.get_write_buffer_size() for _, _, transport in readers):
            return
        fds = (wake, *(fd for fd, _, _ in readers))
        if self._poller[0] != fds:
            poller = select.poll()
            try:
                for fd in fds:
                    poller.register(fd, select.POLLIN)
            except (ValueError, OSError):  # (a socket closed meanwhile: the loop sees to it)
                return
            self._poller = (fds, poller)
        poll = self._poller[1]
        sockets = {fd: (protocol, transport) for fd, protocol, transport in readers}
        deadline = time.monotonic() + DIRECT_WAIT
        while not future.done():
            left = deadline - time.monotonic()
            if left <= 0 or ready or (ctrl_c is not None and ctrl_c.interrupts):
                return
            for fd, _ in poll.poll(math.ceil(left * 1e3)):
                if fd == wake:
                    return
                protocol, transport = sockets[fd]
                if transport.is_closing():
                    return
                try:
                    data = os.read(fd, READ_SIZE)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    protocol.data_received(data)
                except (KeyboardInterrupt, SystemExit):
                    transport.abort()  # (bytes read and perhaps not parsed: the stream cannot go on)
                    raise
                except BaseException as exc:  # (as the loop's transport treats it: the connection is done for)
                    loop.call_exception_handler(
                        {"message": "protocol.data_received() call failed", "exception": exc, "transport": transport, "protocol": protocol}
                    )
                    transport.abort()
                    return
        self.direct_waits += 1

    def _hop_started(self, start: Callable[["asyncio.Future[T]"], None]) -> T:
        """:meth:`run_started` for a call that cannot drive the loop: the loop's driver runs ``start``, this thread waits.

        An interrupted wait (``KeyboardInterrupt``) lets go of the future after
        ``start`` has run (the loop runs callbacks in order): what ``start`` set
        going (requests sent, arrivals queued) is there for the next call.
        """
        waited: "Future[T]" = Future()
        started: list[asyncio.Future[T]] = []

        def settle(future: asyncio.Future[T]) -> None:
            if future.cancelled():
                waited.cancel()
            elif future.exception() is not None:
                waited.set_exception(future.exception())
            else:
                waited.set_result(future.result())

        def begin() -> None:
            future: asyncio.Future[T] = self.loop.create_future()
            started.append(future)
            future.add_done_callback(settle)
            start(future)

        def let_go() -> None:
            if started and not started[0].done():
                started[0].cancel()

        ctrl_c = self._held_here()  # (a Ctrl-C held over the call must still end this wait)
        with self._hopping():
            self.loop.call_soon_threadsafe(begin)
            if ctrl_c is not None:
                # (queued after `begin`: it lets go of a future not done, and `settle` cancels the wait;
                # a future done already hands its result on, and the caller raises at its safe point)
                ctrl_c.watch(let_go)
            return _wait(waited, None, ctrl_c, lambda: self.loop.call_soon_threadsafe(let_go))

    @contextlib.contextmanager
    def _driving(self) -> Iterator[bool]:
        """Hold the loop for the calling thread (the daemon lets go of it); ``False`` if another call drives it.

        A call made while another thread's call drives the loop (pools stepped
        in several threads) does not wait for that call to end, which may be a
        whole step timeout away: the caller hands it to the loop being driven
        instead (:meth:`_hop`).
        """
        self._check_process()
        with self._state:
            self._callers += 1
        try:
            if not self._drive.acquire(blocking=False):
                while True:
                    if self._drive.locked() and not self._daemon_holds:  # another call drives the loop
                        yield False
                        return
                    # Ask the daemon to let go, and again until it does (it may have taken the loop back).
                    self._release_daemon()
                    if self._drive.acquire(timeout=0.05):
                        break
            try:
                yield True
            finally:
                self._drive.release()
        finally:
            with self._state:
                self._callers -= 1
                self._last_call = time.monotonic()
                if self._hops:  # calls handed to the daemon still wait: it drives again
                    self._state.notify_all()

    def _hop(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Hand ``coro`` to the daemon thread, which drives the loop meanwhile (or a sync caller does)."""
        self._check_process()
        ctrl_c = self._held_here()  # (a Ctrl-C held over the call must still end this wait)
        with self._hopping():
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            if ctrl_c is not None:
                ctrl_c.watch(future.cancel)
            # Timed out or interrupted: the coroutine is cancelled.
            return _wait(future, timeout, ctrl_c, future.cancel)

    @contextlib.contextmanager
    def _hopping(self) -> Iterator[None]:
        """Count a call handed to the loop's driver while it waits (the daemon drives if no caller does)."""
        with self._state:
            self._hops += 1
            self._state.notify_all()
        try:
            yield
        finally:
            with self._state:
                self._hops -= 1
                self._last_call = time.monotonic()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "Future[T]":
        """Schedule ``coro`` without waiting; it starts at once (the daemon drives if nobody does)."""
        try:
            self._check_process()
        except RuntimeError:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        self.kick()
        return future

    def call_soon(self, callback: Any, *args: Any) -> None:
        """Schedule ``callback(*args)`` on the loop from any thread; it runs at once."""
        self.loop.call_soon_threadsafe(callback, *args)
        self.kick()

    def kick(self) -> None:
        """Make sure someone drives the loop now: the daemon, if no call does."""
        with self._state:
            if not self._callers:
                self._kicked = True
                self._state.notify_all()

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            raise RuntimeError("this env's I/O loop belongs to the process it was made in (before a fork): make a new env in this process")

    def stop(self, drain: float = 5.0) -> None:
        """Stop the daemon thread (bounded wait). The loop is left for the interpreter to collect.

        Coroutines handed to :meth:`submit` and still running (the session
        closes of envs collected without ``close()``, just before the
        interpreter exits) get up to ``drain`` seconds to end first: else they
        would be dropped half-done, their sessions left to the server's
        disconnect handling and asyncio's complaints printed at exit. Then
        the tasks still pending (a pool's repair of a server that is gone,
        say) are cancelled, with a second to unwind.
        """
        if not self._closed and self._pid == os.getpid() and threading.current_thread() is not self._thread:
            try:
                unfinished = list(self._background)
                if unfinished:
                    self.kick()
                    futures.wait(unfinished, timeout=drain)
                cancelled: Future[None] = Future()
                self.loop.call_soon_threadsafe(_cancel_all, self.loop, cancelled)
                self.kick()
                futures.wait([cancelled], timeout=1.0)
            except KeyboardInterrupt:  # (a Ctrl-C at exit: stop waiting, and stop the thread all the same)
                pass
            except RuntimeError:  # the loop is closed
                pass
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.notify_all()
        self._release_daemon()
        self._thread.join(timeout=5)


def _wait(waited: "Future[T]", timeout: float | None, ctrl_c: _DeferredCtrlC | None, let_go: Callable[[], object]) -> T:
    """``waited.result(timeout)`` in a thread that does not drive the loop (``timeout`` in seconds).

    A wait that a held Ctrl-C (``ctrl_c``, which watches the wait) cancelled raises
    ``KeyboardInterrupt``; another way out (timed out, interrupted) calls ``let_go()``
    first, so that the loop lets go of the work. The watch ends however the wait does.
    """
    try:
        return waited.result(timeout)
    except CancelledError:
        if ctrl_c is not None and ctrl_c.interrupts:
            raise KeyboardInterrupt from None
        raise
    except BaseException:
        let_go()
        raise
    finally:
        if ctrl_c is not None:
            ctrl_c.unwatch()


def _cancel_all(loop: asyncio.AbstractEventLoop, cancelled: "Future[None]") -> None:
    """Cancel the loop's pending tasks (a loop callback); ``cancelled`` is done once they have all ended."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if not tasks:
        cancelled.set_result(None)
        return
    ended = asyncio.gather(*tasks, return_exceptions=True)
    ended.add_done_callback(lambda _: cancelled.set_result(None))


def _finish(future: "asyncio.Future[None]") -> None:
    """Complete ``future`` unless it is done already (a loop callback)."""
    if not future.done():
        future.set_result(None)
