"""A loopback TCP relay that counts the bytes it forwards: what really went over the wire.

The client connects to the relay instead of the server; the relay copies
bytes both ways and adds them to ``bytes_up`` (client to server) and
``bytes_down`` (server to client). Counts are TCP payload: HTTP, WebSocket
framing and messages, not TCP/IP headers. The relay runs its own event loop
on a daemon thread, so it works under any client, sync or async.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit, urlunsplit

from .._urls import is_loopback

__all__ = ["CountingRelay"]

_CHUNK = 256 * 1024


class CountingRelay:
    """Forward ``127.0.0.1:<port>`` to the server of ``target_url``, counting bytes.

    Use as a context manager; :attr:`url` is the relay's base URL, in the
    target's scheme. Loopback targets only.

    Attributes:
        bytes_up: bytes forwarded from clients to the server.
        bytes_down: bytes forwarded from the server to clients.
        connections: connections accepted.
    """

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        if not is_loopback(target_url) or parts.port is None:
            raise ValueError(f"the relay forwards to a loopback host:port only, got {target_url!r}")
        self._parts = parts
        self._target = (parts.hostname or "127.0.0.1", parts.port)
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def reset_counts(self) -> None:
        """Set the byte counters to zero."""
        self.bytes_up = self.bytes_down = 0

    def start(self) -> CountingRelay:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="openenv-gym-relay", daemon=True)
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._listen(), loop).result(10)
        host = "127.0.0.1"
        self.url = urlunsplit((self._parts.scheme, f"{host}:{port}", self._parts.path, "", ""))
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.close()
            return
        self._writers.update((client_writer, server_writer))
        try:
            await asyncio.gather(
                self._pump(client_reader, server_writer, up=True),
                self._pump(server_reader, client_writer, up=False),
            )
        finally:
            for writer in (client_writer, server_writer):
                self._writers.discard(writer)
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        try:
            while data := await reader.read(_CHUNK):
                # Counted before it is passed on: a reader of the counts who has the bytes sees them counted.
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def close(self) -> None:
        """Stop relaying and close every connection (bounded: a few seconds)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        if not loop.is_running():
            loop.close()

    def __enter__(self) -> CountingRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
