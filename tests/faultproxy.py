"""A loopback TCP fault proxy: sits between a client and a server and breaks live connections.

Tests of the WebSocket client pool point the pool at the proxy instead of the
server, then inject faults while traffic flows: reset every connection, add
latency, swallow bytes (a network blackhole), cut a frame in half, or refuse
new connections. Everything stays on ``127.0.0.1``.

Two front ends share one implementation:

* :class:`FaultProxy` runs in the caller's event loop (``async with``). Its
  fault methods are plain functions and must be called from that loop.
* :class:`ThreadedFaultProxy` runs a :class:`FaultProxy` on its own event loop
  in a daemon thread and exposes a synchronous API, for sync test bodies whose
  code under test runs its own background loop.

Semantics worth knowing when writing assertions:

* A connection is forwarded only after the upstream connection succeeds; if
  upstream is down, the client connection is closed (EOF).
* There is no TCP half-close: when either side closes (or resets), the proxy
  closes (or resets) the other side too, after any delayed bytes are flushed.
* ``blackhole()`` swallows bytes *and* closures: while it is on, an end that
  closes its socket is not reported to the other end until ``heal()`` (which
  then closes such connections), or the other end closes too. Connections
  accepted during a blackhole never get an upstream connection; they stay
  half-open (accepted, silent) until the client closes them, ``drop_all()`` or
  ``stop()``; ``heal()`` does not revive them.
* ``bytes_up`` / ``bytes_down`` count bytes actually forwarded (written to the
  other side), so swallowed or cut-off bytes are not counted.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from types import TracebackType
from typing import Any, Callable, Coroutine, Deque, Dict, List, Optional, Set, Tuple, Type, TypeVar

__all__ = ["FaultProxy", "ThreadedFaultProxy", "inject"]

_HOST = "127.0.0.1"
_CHUNK = 65536
_TIMEOUT = 5.0
_DIRECTIONS = ("up", "down")

# What to do after writing a queued chunk.
_CLOSE = "close"  # the source reached EOF: close the whole link gracefully
_CUT = "cut"  # cut_next_frame: the chunk was halved, now abort the link

_T = TypeVar("_T")

# (release time on the loop clock, bytes, follow-up action or None)
_Item = Tuple[float, bytes, Optional[str]]


class _Pipe:
    """One direction of a link: reads from ``reader`` and forwards to ``dest``.

    Delayed chunks wait in ``pending`` (FIFO, non-decreasing release times) and
    are written by a loop timer, so a slow release never blocks reading and
    byte order is preserved even when the delay is lowered mid-stream.
    """

    def __init__(self, name: str, reader: asyncio.StreamReader, dest: Optional[asyncio.StreamWriter]) -> None:
        self.name = name
        self.reader = reader
        self.dest = dest
        self.pending: Deque[_Item] = collections.deque()
        self.last_release = 0.0
        self.timer: Optional[asyncio.TimerHandle] = None
        self.done = False
        self.eof_swallowed = False

    def discard_pending(self) -> None:
        """Drop queued chunks and their timer (the link is going away)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pending.clear()


class _Link:
    """One proxied connection: the accepted client socket and, once open, the upstream socket."""

    def __init__(self, proxy: "FaultProxy", reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client_reader = reader
        self.client_writer = writer
        self.upstream_writer: Optional[asyncio.StreamWriter] = None
        self.pipes: Dict[str, _Pipe] = {}
        self.tasks: Set["asyncio.Task[None]"] = set()
        self.closed = False

    # -- wiring ---------------------------------------------------------

    def start_sink(self) -> None:
        """Blackholed at accept time: read and discard the client's bytes, never answer."""
        pipe = _Pipe("up", self.client_reader, None)
        self.pipes["up"] = pipe
        self._spawn(pipe)

    def attach_upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Upstream is connected: start one pump per direction."""
        self.upstream_writer = writer
        self.proxy._track_writer(writer)
        self.pipes["up"] = _Pipe("up", self.client_reader, writer)
        self.pipes["down"] = _Pipe("down", reader, self.client_writer)
        for pipe in self.pipes.values():
            self._spawn(pipe)

    def _spawn(self, pipe: _Pipe) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(pipe), name=f"faultproxy-{pipe.name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.proxy._track_task(task)

    # -- teardown -------------------------------------------------------

    def writers(self) -> List[asyncio.StreamWriter]:
        """Both ends' writers (the upstream one only once connected)."""
        found = [self.client_writer]
        if self.upstream_writer is not None:
            found.append(self.upstream_writer)
        return found

    def close(self, *, abort: bool, flush: Optional[asyncio.StreamWriter] = None) -> None:
        """Tear the link down: ``abort`` resets both sockets, otherwise they are closed gracefully.

        ``flush``, if given, is closed gracefully (its buffered bytes still go
        out) even when the rest is aborted. Idempotent.
        """
        if self.closed:
            return
        self.closed = True
        for pipe in self.pipes.values():
            pipe.discard_pending()
        for writer in self.writers():
            if abort and writer is not flush:
                writer.transport.abort()
            else:
                writer.close()
        current = _current_task()
        for task in list(self.tasks):
            if task is not current:
                task.cancel()
        self.proxy._forget(self)

    def has_swallowed_eof(self) -> bool:
        """True if an end closed while the blackhole hid it from the other end."""
        return any(pipe.eof_swallowed for pipe in self.pipes.values())

    # -- data path ------------------------------------------------------

    async def _pump(self, pipe: _Pipe) -> None:
        proxy = self.proxy
        while not self.closed:
            try:
                data = await pipe.reader.read(_CHUNK)
            except (ConnectionError, OSError):
                # The source reset: reset the other side too.
                pipe.done = True
                self.close(abort=True)
                return
            if not data:
                self._on_eof(pipe)
                return
            if self.closed:
                return
            if pipe.dest is None or proxy._blackhole:
                proxy.bytes_swallowed += len(data)
                continue
            action: Optional[str] = None
            if pipe.name in proxy._cut:
                proxy._cut.discard(pipe.name)
                data = data[: len(data) // 2]
                action = _CUT
            await self._forward(pipe, data, action)

    async def _forward(self, pipe: _Pipe, data: bytes, action: Optional[str]) -> None:
        loop = asyncio.get_running_loop()
        delay = self.proxy._delay
        if delay <= 0 and not pipe.pending:
            self._write(pipe, data, action)
            if self.closed or pipe.dest is None:
                return
            try:
                await pipe.dest.drain()
            except (ConnectionError, OSError):
                self.close(abort=True)
            return
        self._enqueue(pipe, loop.time() + max(delay, 0.0), data, action)

    def _enqueue(self, pipe: _Pipe, when: float, data: bytes, action: Optional[str]) -> None:
        release = max(when, pipe.last_release)
        pipe.last_release = release
        pipe.pending.append((release, data, action))
        if pipe.timer is None:
            self._schedule(pipe)

    def _schedule(self, pipe: _Pipe) -> None:
        loop = asyncio.get_running_loop()
        pipe.timer = loop.call_at(pipe.pending[0][0], self._flush, pipe)

    def _flush(self, pipe: _Pipe) -> None:
        """Timer callback: write every queued chunk that is due, in order."""
        pipe.timer = None
        if self.closed:
            return
        now = asyncio.get_running_loop().time()
        while pipe.pending and pipe.pending[0][0] <= now and not self.closed:
            _, data, action = pipe.pending.popleft()
            self._write(pipe, data, action)
        if pipe.pending and not self.closed:
            self._schedule(pipe)

    def _write(self, pipe: _Pipe, data: bytes, action: Optional[str]) -> None:
        """Write one chunk to the destination now, then carry out its follow-up action."""
        if self.closed:
            return
        proxy = self.proxy
        dest = pipe.dest
        assert dest is not None
        if proxy._blackhole:
            # A blackhole that started after this chunk was queued still eats it.
            if action == _CLOSE:
                self._swallow_eof(pipe)
            else:
                proxy.bytes_swallowed += len(data)
            return
        if dest.transport.is_closing():
            self.close(abort=True)
            return
        if data:
            # Count first, so a peer that has the bytes always sees them counted.
            if pipe.name == "up":
                proxy.bytes_up += len(data)
            else:
                proxy.bytes_down += len(data)
            dest.write(data)
        if action == _CLOSE:
            self.close(abort=False)
        elif action == _CUT:
            if dest.transport.get_write_buffer_size() == 0:
                self.close(abort=True)
            else:
                # Let the half chunk reach the peer before the FIN; reset the other side.
                self.close(abort=True, flush=dest)

    def _on_eof(self, pipe: _Pipe) -> None:
        """The pipe's source closed its end."""
        pipe.done = True
        if self.closed:
            return
        if pipe.dest is None:
            # Blackholed at accept time: nothing to tell anyone.
            self.close(abort=False)
            return
        if self.proxy._blackhole:
            self._swallow_eof(pipe)
            return
        if pipe.pending:
            self._enqueue(pipe, asyncio.get_running_loop().time(), b"", _CLOSE)
        else:
            self.close(abort=False)

    def _swallow_eof(self, pipe: _Pipe) -> None:
        pipe.eof_swallowed = True
        if all(p.done for p in self.pipes.values()):
            self.close(abort=False)


def _current_task() -> Optional["asyncio.Task[Any]"]:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class FaultProxy:
    """Listens on 127.0.0.1:<port> and forwards every accepted connection to upstream (host, port).

    Use ``async with FaultProxy(host, port) as proxy:`` (or ``start()`` /
    ``stop()``) inside a running event loop; point clients at ``proxy.url``.
    The fault methods (``drop_all``, ``set_delay``, ``blackhole``,
    ``cut_next_frame``, ``refuse``, ``heal``) take effect immediately and must
    be called from the proxy's own loop; from another thread use
    :class:`ThreadedFaultProxy`.

    Counters for assertions: ``connections_accepted`` (including refused and
    blackholed ones), ``live_connections`` (proxied connections not yet torn
    down), ``bytes_up`` / ``bytes_down`` (bytes forwarded client->server and
    server->client) and ``bytes_swallowed`` (eaten by a blackhole).
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, listen_port: int = 0) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_port = listen_port
        self.connections_accepted = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.bytes_swallowed = 0
        self._delay = 0.0
        self._blackhole = False
        self._refuse = False
        self._cut: Set[str] = set()
        self._links: Set[_Link] = set()
        self._writers: Set[asyncio.StreamWriter] = set()
        self._tasks: Set["asyncio.Task[Any]"] = set()
        self._waiters: List["asyncio.Future[None]"] = []
        self._server: Optional[asyncio.base_events.Server] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._port: Optional[int] = None
        self._stopping = False

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Start listening on 127.0.0.1 (``listen_port``, or a free port if 0)."""
        if self._server is not None:
            raise RuntimeError("FaultProxy already started")
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._server = await asyncio.start_server(self._on_accept, _HOST, self.listen_port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, reset every connection, and wait (bounded) for all proxy tasks to end."""
        self._check_loop()
        self._stopping = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.close(abort=True)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        current = _current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_TIMEOUT)
        if server is not None:
            try:
                async with asyncio.timeout(_TIMEOUT):
                    await server.wait_closed()
            except TimeoutError:
                pass
        # Let the aborted transports' connection_lost callbacks run, so their sockets close now.
        for _ in range(2):
            await asyncio.sleep(0)
        self._wake_waiters()

    async def __aenter__(self) -> "FaultProxy":
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (available after ``start()``)."""
        if self._port is None:
            raise RuntimeError("FaultProxy not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the base URL to give the client instead of the server's."""
        return f"http://{_HOST}:{self.port}"

    @property
    def live_connections(self) -> int:
        """Accepted connections that are still being proxied (or held half-open)."""
        return len(self._links)

    async def wait_for_live(self, count: int, timeout: float = _TIMEOUT) -> None:
        """Wait until ``live_connections == count`` (raises ``TimeoutError`` after ``timeout``)."""
        async with asyncio.timeout(timeout):
            while len(self._links) != count:
                waiter: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    # -- faults -----------------------------------------------------------

    def drop_all(self) -> int:
        """Reset (abort) both sides of every live connection now; return how many there were."""
        self._check_loop()
        links = list(self._links)
        for link in links:
            link.close(abort=True)
        return len(links)

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk read from now on for ``seconds`` before forwarding it (0 = off).

        Applies to both directions; byte order per direction is preserved
        (a chunk is never released before one read earlier).
        """
        self._check_loop()
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._delay = float(seconds)

    def blackhole(self, on: bool = True) -> None:
        """Swallow traffic: new connections are accepted but never forwarded or answered,
        live connections stop forwarding in both directions; all sockets stay open."""
        self._check_loop()
        self._blackhole = on
        if not on:
            self._release_swallowed_eofs()

    def cut_next_frame(self, direction: str = "down") -> None:
        """Cut the next chunk in ``direction`` ("down": server->client, "up": client->server):
        forward only its first half, then abort that connection."""
        self._check_loop()
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
        self._cut.add(direction)

    def refuse(self, on: bool = True) -> None:
        """Close new connections right after accepting them (a dead server behind a live balancer)."""
        self._check_loop()
        self._refuse = on

    def heal(self) -> None:
        """Turn every fault off: no delay, no blackhole, no refusing, no pending cut."""
        self._check_loop()
        self._delay = 0.0
        self._blackhole = False
        self._refuse = False
        self._cut.clear()
        self._release_swallowed_eofs()

    # -- internals ----------------------------------------------------------

    def _check_loop(self) -> None:
        if self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            raise RuntimeError("FaultProxy methods must run on the proxy's event loop; use ThreadedFaultProxy")

    def _release_swallowed_eofs(self) -> None:
        # A closure hidden by the blackhole reaches the other side once it lifts.
        for link in list(self._links):
            if link.upstream_writer is not None and link.has_swallowed_eof():
                link.close(abort=False)

    def _track_task(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _track_writer(self, writer: asyncio.StreamWriter) -> None:
        # Kept until stop() so a socket closed gracefully but stuck flushing is still reset.
        for old in [w for w in self._writers if w.transport.is_closing() and w.transport.get_write_buffer_size() == 0]:
            self._writers.discard(old)
        self._writers.add(writer)

    def _forget(self, link: _Link) -> None:
        self._links.discard(link)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = _current_task()
        if task is not None:
            self._track_task(task)
        self.connections_accepted += 1
        self._track_writer(writer)
        if self._stopping:
            writer.transport.abort()
            return
        if self._refuse:
            writer.close()
            return
        link = _Link(self, reader, writer)
        self._links.add(link)
        self._wake_waiters()
        if self._blackhole:
            link.start_sink()
            return
        try:
            async with asyncio.timeout(_TIMEOUT):
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except (OSError, TimeoutError):
            link.close(abort=False)
            return
        if link.closed or self._stopping:
            up_writer.transport.abort()
            link.close(abort=True)
            return
        link.attach_upstream(up_reader, up_writer)


class ThreadedFaultProxy:
    """The same proxy, run on its own event loop in a daemon thread, with a sync API for sync tests.

    ``start()`` / ``stop()`` or ``with ThreadedFaultProxy(host, port) as proxy:``;
    ``.url``, ``.port``, the counters, and the fault methods of
    :class:`FaultProxy`, each executed on the proxy's loop and waited for (up to
    ``timeout`` seconds, 5 by default). The wrapped proxy is ``.proxy``.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, listen_port: int = 0, timeout: float = _TIMEOUT) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port, listen_port=listen_port)
        self.timeout = timeout
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread and the proxy; returns once it is listening."""
        if self._loop is not None:
            raise RuntimeError("ThreadedFaultProxy already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._run_loop, args=(loop,), name="faultproxy-loop", daemon=True)
        self._loop, self._thread = loop, thread
        thread.start()
        try:
            self._run(self.proxy.start())
        except BaseException:
            self._shutdown_loop()
            raise

    def stop(self) -> None:
        """Stop the proxy (every connection reset), then the loop and its thread. Idempotent."""
        if self._loop is None:
            return
        try:
            self._run(self.proxy.stop())
        finally:
            self._shutdown_loop()

    def __enter__(self) -> "ThreadedFaultProxy":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        return self.proxy.port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self.proxy.url

    # -- counters (plain int reads; safe from any thread) -------------------

    @property
    def connections_accepted(self) -> int:
        """Connections accepted so far, refused and blackholed ones included."""
        return self.proxy.connections_accepted

    @property
    def live_connections(self) -> int:
        """Connections currently proxied or held half-open."""
        return self.proxy.live_connections

    @property
    def bytes_up(self) -> int:
        """Bytes forwarded client->server."""
        return self.proxy.bytes_up

    @property
    def bytes_down(self) -> int:
        """Bytes forwarded server->client."""
        return self.proxy.bytes_down

    @property
    def bytes_swallowed(self) -> int:
        """Bytes eaten by a blackhole."""
        return self.proxy.bytes_swallowed

    def wait_for_live(self, count: int, timeout: Optional[float] = None) -> None:
        """Block until ``live_connections == count`` (``TimeoutError`` after ``timeout``)."""
        limit = self.timeout if timeout is None else timeout
        self._run(self.proxy.wait_for_live(count, limit), timeout=limit + 1.0)

    # -- faults --------------------------------------------------------------

    def drop_all(self) -> int:
        """See :meth:`FaultProxy.drop_all`."""
        return self._call(self.proxy.drop_all)

    def set_delay(self, seconds: float) -> None:
        """See :meth:`FaultProxy.set_delay`."""
        self._call(self.proxy.set_delay, seconds)

    def blackhole(self, on: bool = True) -> None:
        """See :meth:`FaultProxy.blackhole`."""
        self._call(self.proxy.blackhole, on)

    def cut_next_frame(self, direction: str = "down") -> None:
        """See :meth:`FaultProxy.cut_next_frame`."""
        self._call(self.proxy.cut_next_frame, direction)

    def refuse(self, on: bool = True) -> None:
        """See :meth:`FaultProxy.refuse`."""
        self._call(self.proxy.refuse, on)

    def heal(self) -> None:
        """See :meth:`FaultProxy.heal`."""
        self._call(self.proxy.heal)

    # -- internals ------------------------------------------------------------

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            asyncio.set_event_loop(None)

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("ThreadedFaultProxy not started")
        return self._loop

    def _run(self, coro: Coroutine[Any, Any, _T], timeout: Optional[float] = None) -> _T:
        """Run ``coro`` on the proxy loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coro, self._require_loop())
        try:
            return future.result(self.timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError("fault proxy operation timed out") from None

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Call ``fn(*args)`` on the proxy loop and wait for its result."""
        loop = self._require_loop()
        result: "concurrent.futures.Future[_T]" = concurrent.futures.Future()

        def invoke() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as exc:  # handed to the calling thread
                result.set_exception(exc)

        loop.call_soon_threadsafe(invoke)
        try:
            return result.result(self.timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError("fault proxy operation timed out") from None

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(self.timeout)
        if not thread.is_alive():
            loop.close()


def inject(proxy: ThreadedFaultProxy, fault: str, *, delay: float) -> None:
    """Start ``fault`` on ``proxy`` (``heal()`` ends the lasting ones).

    ``"drop"``: reset every live connection; ``"delay"``: hold every chunk
    ``delay`` seconds; ``"blackhole"``; ``"cut"`` or ``"cut_down"``, ``"cut_up"``:
    cut the next frame that way; ``"refuse"``: refuse new connections and drop
    the live ones (a dead server behind a live balancer).
    """
    if fault == "drop":
        proxy.drop_all()
    elif fault == "delay":
        proxy.set_delay(delay)
    elif fault == "blackhole":
        proxy.blackhole()
    elif fault in ("cut", "cut_down", "cut_up"):
        proxy.cut_next_frame("up" if fault == "cut_up" else "down")
    elif fault == "refuse":
        proxy.refuse()
        proxy.drop_all()
    else:
        raise ValueError(f"unknown fault {fault!r}")
