"""Every undocumented internal of asyncio, CPython and websockets this package reads, in one module.

The speed of the sync faces and the fast path's takeover of a socket rest on
a few names that their owners do not promise to keep:

- asyncio: ``asyncio._get_running_loop`` / ``_set_running_loop`` (what a
  loop's own run sets, for a thread that drives a loop by hand), a selector
  loop's ready queue ``loop._ready`` and self-pipe ``loop._ssock`` (a caller
  that reads its sockets directly must know whether the loop has work).
- CPython: the ``_signal`` module (``signal``'s handlers without the enum
  conversion: 1 us a pair instead of 12 us).
- websockets' asyncio connection: its keepalive task, the frames its message
  assembler has queued (``recv_messages.frames.queue``) and that assembler's
  flow-control callbacks (``pause``/``resume``/``paused``), its event hook
  ``process_event``, ``send_data``, ``connection_lost_waiter``, the server's
  handler and its set of handler tasks; of its Sans-I/O protocol,
  the parser generator (``parser``, whose frames tell whether it stands
  between two frames), the reader's unparsed bytes and ``current_size``.

Nothing else in the package names them (a test reads every module's syntax
tree to hold that). Each is checked here at import, against what the code
below expects; a release that moved one fails the import with
:class:`DependencyChanged` naming it, rather than misbehaving later. Tested
with websockets 17.0.1 and 17.4 (``pyproject.toml`` bounds it to 17.0.1 to 17.x:
17.0 started a connection's handler otherwise, 16.0 lacks ``Server.handler_tasks``,
15.x also ``Protocol.current_size``) on CPython 3.11.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.selector_events
import inspect
import signal
import sys
from collections.abc import Sized
from typing import Any, Callable, Iterable

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.connection import Connection
from websockets.asyncio.messages import Assembler, SimpleQueue
from websockets.asyncio.server import Server, ServerConnection
from websockets.frames import Frame
from websockets.protocol import Protocol
from websockets.streams import StreamReader

__all__ = [
    "DependencyChanged",
    "EventHook",
    "c_signal",
    "check",
    "connection_lost",
    "current_size",
    "feed_event",
    "opened",
    "send_data",
    "set_close_deadline",
    "parser_between_frames",
    "reading_paused",
    "ready_queue",
    "route_flow_control",
    "running_loop",
    "set_running_loop",
    "start_handler",
    "stop_keepalive",
    "take_read_frames",
    "unparsed_bytes",
    "wake_fd",
]


class DependencyChanged(ImportError):
    """The installed asyncio or websockets lacks an internal this package reads (a release that moved it).

    The message names the internal and the installed version; installing a
    websockets release in the range ``pyproject.toml`` allows fixes it.
    """


# ---------------------------------------------------------------- asyncio and CPython

try:  # the C functions that `signal` wraps (see _loop._DeferredCtrlC)
    import _signal as c_signal  # type: ignore[import-not-found]  # (no stubs: CPython's own)
except ImportError:  # pragma: no cover - an interpreter without them
    c_signal = signal

#: The running loop of this thread, or ``None`` (no error where there is none, unlike ``get_running_loop``).
running_loop: Callable[[], "asyncio.AbstractEventLoop | None"] = asyncio._get_running_loop
#: Mark ``loop`` (or ``None``) as this thread's running loop, as ``run_until_complete`` does.
set_running_loop: Callable[["asyncio.AbstractEventLoop | None"], None] = asyncio._set_running_loop


def ready_queue(loop: asyncio.AbstractEventLoop) -> Sized | None:
    """The callbacks ``loop`` will run next (live: it empties as they run); ``None`` for a loop without one."""
    return getattr(loop, "_ready", None)


def wake_fd(loop: asyncio.AbstractEventLoop) -> int | None:
    """The file descriptor that becomes readable when another thread hands ``loop`` work; ``None`` if unknown."""
    ssock = getattr(loop, "_ssock", None)
    return None if ssock is None else ssock.fileno()


# ---------------------------------------------------------------- websockets' asyncio connection


def stop_keepalive(ws: Connection) -> None:
    """Stop ``ws``'s keepalive pings (whoever takes its socket over answers and sends its own)."""
    task = ws.keepalive_task
    if task is not None:
        task.cancel()
        ws.keepalive_task = None


def take_read_frames(ws: Connection) -> list[Frame]:
    """The frames ``ws`` has read and not yet handed to a ``recv()``, taken out of it (in order)."""
    queued = ws.recv_messages.frames.queue
    frames = list(queued)
    queued.clear()
    return frames


def reading_paused(ws: Connection) -> bool:
    """Whether ``ws`` paused its transport's reading because its queue of received messages was full."""
    return bool(ws.recv_messages.paused)


def route_flow_control(ws: Connection, pause: Callable[[], None], resume: Callable[[], None]) -> None:
    """Have ``ws``'s message queue call ``pause()``/``resume()`` when it fills and drains, not its transport's."""
    ws.recv_messages.pause = pause
    ws.recv_messages.resume = resume


def connection_lost(ws: Connection) -> bool:
    """Whether ``ws``'s transport has already told it the connection is gone."""
    return ws.connection_lost_waiter.done()


def send_data(ws: Connection) -> None:
    """Write to ``ws``'s transport what its Sans-I/O protocol has queued (pongs, a close echo, the end of the stream)."""
    ws.send_data()


def feed_event(ws: Connection, event: Any) -> None:
    """Hand ``ws`` one event its protocol parsed (a control frame read by whoever took its socket over)."""
    ws.process_event(event)


def set_close_deadline(ws: Connection, when: float) -> None:
    """Tell ``ws`` when (``loop.time()``) its closing handshake must be over."""
    ws.close_deadline = when


def opened(ws: ClientConnection, request: Any, response: Any, events: Iterable[Any]) -> None:
    """Finish ``ws``, made over a transport whose opening handshake was done elsewhere, as its own handshake would.

    ``request`` and ``response`` are that handshake's; ``events`` what the
    protocol parsed after it. Keepalive starts.
    """
    ws.request = request
    ws.response = response
    ws.response_rcvd.set_result(None)
    for event in events:
        ws.process_event(event)
    ws.start_keepalive()


def start_handler(ws: ServerConnection) -> None:
    """Start the server's handler task for ``ws``, as its ``connection_made`` would (for a connection that delayed it)."""
    task = ws.loop.create_task(ws.server.handler(ws))
    ws.server.handler_tasks.add(task)  # (at once: a server closing meanwhile waits for it)


class EventHook:
    """Mix in before a websockets asyncio ``Connection``: :meth:`on_event` sees each parsed event first."""

    def on_event(self, event: Any) -> None:
        """One event (a ``Frame``, or the handshake's ``Request``/``Response``), before websockets handles it."""

    def process_event(self, event: Any) -> None:
        self.on_event(event)
        super().process_event(event)  # type: ignore[misc]


# ---------------------------------------------------------------- websockets' Sans-I/O protocol


def unparsed_bytes(protocol: Protocol) -> int:
    """How many received bytes ``protocol`` holds that its parser has not yet made into events."""
    return len(protocol.reader.buffer)


def current_size(protocol: Protocol) -> int | None:
    """The size so far of the fragmented message ``protocol`` is assembling; ``None`` between messages."""
    return protocol.current_size


def parser_between_frames(protocol: Protocol) -> bool:
    """Whether ``protocol`` holds no part of a frame (false when it cannot be told).

    Its parser is a generator; between frames it waits for data in
    ``StreamReader.at_eof``, within a frame in ``read_exact``.
    """
    if protocol.reader.buffer:
        return False
    waiting: Any = protocol.parser  # where the parser waits: the innermost generator it delegates to
    depth = 0
    while getattr(waiting, "gi_yieldfrom", None) is not None and depth < 8:
        waiting, depth = waiting.gi_yieldfrom, depth + 1
    return getattr(waiting, "gi_code", None) is _AT_EOF_CODE


_AT_EOF_CODE = StreamReader.at_eof.__code__


# ---------------------------------------------------------------- the check at import


def _sets(function: Any, names: Iterable[str]) -> list[str]:
    """Of ``names``, those ``function`` neither sets nor reads as attributes (from its code object)."""
    code = getattr(function, "__code__", None)
    used = set(code.co_names) if code is not None else set()
    return [name for name in names if name not in used]


def _expectations() -> list[tuple[str, Callable[[], bool]]]:
    """Each internal above, with a check that the installed release still has it."""
    return [
        ("asyncio._get_running_loop", lambda: callable(getattr(asyncio, "_get_running_loop", None))),
        ("asyncio._set_running_loop", lambda: callable(getattr(asyncio, "_set_running_loop", None))),
        ("BaseEventLoop._ready", lambda: not _sets(asyncio.base_events.BaseEventLoop.__init__, ["_ready"])),
        (
            "BaseSelectorEventLoop._ssock",
            lambda: not _sets(getattr(asyncio.selector_events.BaseSelectorEventLoop, "_make_self_pipe", None), ["_ssock"]),
        ),
        ("Connection.keepalive_task", lambda: not _sets(Connection.__init__, ["keepalive_task"])),
        ("Connection.recv_messages", lambda: not _sets(Connection.connection_made, ["recv_messages"])),
        ("Connection.connection_lost_waiter", lambda: not _sets(Connection.__init__, ["connection_lost_waiter"])),
        (
            "Connection.process_event/send_data/start_keepalive",
            lambda: all(callable(getattr(Connection, name, None)) for name in ("process_event", "send_data", "start_keepalive")),
        ),
        ("Connection.close_deadline", lambda: not _sets(Connection.__init__, ["close_deadline"])),
        ("ClientConnection.response_rcvd", lambda: not _sets(ClientConnection.__init__, ["response_rcvd"])),
        ("Assembler.frames/pause/resume/paused", lambda: not _sets(Assembler.__init__, ["frames", "pause", "resume", "paused"])),
        ("SimpleQueue.queue", lambda: not _sets(SimpleQueue.__init__, ["queue"])),
        ("Protocol.parser/reader/current_size", lambda: not _sets(Protocol.__init__, ["parser", "reader", "current_size"])),
        ("Server.handler/handler_tasks", lambda: not _sets(Server.__init__, ["handler", "handler_tasks"])),
        # (start_handler does what ServerConnection.connection_made does, later: in this form; 17.0 had another)
        (
            "ServerConnection.connection_made starting server.handler",
            lambda: not _sets(ServerConnection.connection_made, ["handler", "handler_tasks"]),
        ),
        ("StreamReader.buffer", lambda: not _sets(StreamReader.__init__, ["buffer"])),
        ("StreamReader.at_eof (a generator)", lambda: inspect.isgeneratorfunction(StreamReader.at_eof)),
    ]


def check(expectations: list[tuple[str, Callable[[], bool]]] | None = None) -> None:
    """Raise :class:`DependencyChanged` naming every internal the installed releases no longer have."""
    missing = [name for name, holds in (expectations if expectations is not None else _expectations()) if not holds()]
    if missing:
        raise DependencyChanged(
            f"openenv_gym reads internals of asyncio and websockets that the installed releases lack: "
            f"{', '.join(missing)} (websockets {websockets.__version__}, Python {sys.version.split()[0]}); install a "
            f"websockets release that openenv_gym's requirements allow (pip install 'websockets>=17.0.1,<18')"
        )


check()
