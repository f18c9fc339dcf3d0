"""Tests of the fault proxy itself (tests/faultproxy.py), over real loopback sockets.

Upstreams are a tiny asyncio echo server, a websockets echo server, and (for
the threaded proxy) a ``socketserver`` echo server on its own threads. Every
async test runs in ``asyncio.run`` under an ``asyncio.timeout`` bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import socketserver
import threading
import time
from typing import AsyncIterator, Awaitable, Iterator, Tuple

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests import faultproxy
from tests.faultproxy import FaultProxy, ThreadedFaultProxy

pytestmark = pytest.mark.timeout(30)

LIMIT = 5.0  # upper bound for any single async test body


def run(coro: Awaitable[None], limit: float = LIMIT) -> None:
    """Run ``coro`` in a fresh event loop, failing if it takes longer than ``limit`` seconds."""

    async def bounded() -> None:
        async with asyncio.timeout(limit):
            await coro

    asyncio.run(bounded())


# -- upstream servers -------------------------------------------------------------


class EchoStats:
    """What the asyncio echo server saw."""

    def __init__(self) -> None:
        self.port = 0
        self.accepted = 0
        self.received = 0
        self.finished = 0
        self.changed = asyncio.Event()

    async def wait_finished(self, count: int) -> None:
        """Wait until ``count`` upstream connections have ended."""
        while self.finished < count:
            self.changed.clear()
            await self.changed.wait()


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[EchoStats]:
    """Asyncio TCP echo server on 127.0.0.1, port 0, in the running loop."""
    stats = EchoStats()
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats.accepted += 1
        writers.append(writer)
        try:
            while data := await reader.read(65536):
                stats.received += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.transport.abort()
            stats.finished += 1
            stats.changed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    stats.port = server.sockets[0].getsockname()[1]
    try:
        yield stats
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def ws_echo_server() -> AsyncIterator[int]:
    """websockets echo server on 127.0.0.1, port 0; yields its port."""

    async def handler(conn: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):  # the faults under test break connections
            async for message in conn:
                await conn.send(message)

    async with serve(handler, "127.0.0.1", 0, compression=None, close_timeout=1) as server:
        yield server.sockets[0].getsockname()[1]


def ws_connect(proxy: FaultProxy) -> connect:
    """A websockets client connection to the upstream through ``proxy``."""
    return connect(f"ws://127.0.0.1:{proxy.port}/", compression=None, close_timeout=1, open_timeout=3)


async def open_client(proxy: FaultProxy) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TCP client connection to ``proxy``."""
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def read_until_closed(reader: asyncio.StreamReader, timeout: float = 2.0) -> str:
    """Read until the connection ends; return ``"eof"`` or ``"reset"``."""
    async with asyncio.timeout(timeout):
        try:
            while await reader.read(65536):
                pass
        except ConnectionResetError:
            return "reset"
    return "eof"


def assert_no_proxy_tasks() -> None:
    """No task running proxy code is left in the current loop."""
    leftovers = [
        task
        for task in asyncio.all_tasks()
        if task.get_coro().cr_code.co_filename == faultproxy.__file__  # type: ignore[union-attr]
    ]
    assert leftovers == []


# -- pass-through ------------------------------------------------------------------


def test_bytes_pass_through_unchanged() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            assert proxy.url == f"http://127.0.0.1:{proxy.port}"
            reader, writer = await open_client(proxy)
            payload = os.urandom(300_000)
            writer.write(payload)
            await writer.drain()
            assert await reader.readexactly(len(payload)) == payload
            assert proxy.bytes_up == len(payload) == echo.received
            assert proxy.bytes_down == len(payload)
            assert proxy.connections_accepted == 1 == echo.accepted
            assert proxy.live_connections == 1

            writer.close()
            await writer.wait_closed()
            await proxy.wait_for_live(0)
            await echo.wait_finished(1)
        assert proxy.live_connections == 0
        assert_no_proxy_tasks()

    run(body())


def test_websocket_messages_pass_through() -> None:
    async def body() -> None:
        async with ws_echo_server() as ws_port, FaultProxy("127.0.0.1", ws_port) as proxy:
            async with ws_connect(proxy) as ws:
                for message in ("hello", b"\x00\x01" * 5000, "x" * 70_000):
                    await ws.send(message)
                    assert await ws.recv() == message
            await proxy.wait_for_live(0)
            assert proxy.connections_accepted == 1
            assert proxy.bytes_up > 75_000 and proxy.bytes_down > 75_000

    run(body())


def test_upstream_down_closes_client() -> None:
    async def body() -> None:
        with socket.socket() as probe:  # a port with nothing listening
            probe.bind(("127.0.0.1", 0))
            dead_port = probe.getsockname()[1]
        async with FaultProxy("127.0.0.1", dead_port) as proxy:
            reader, writer = await open_client(proxy)
            assert await read_until_closed(reader) in ("eof", "reset")
            writer.close()
            await proxy.wait_for_live(0)

    run(body())


# -- drop_all -----------------------------------------------------------------------


def test_drop_all_resets_raw_connection() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            reader, writer = await open_client(proxy)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"

            assert proxy.drop_all() == 1
            assert proxy.live_connections == 0
            assert await read_until_closed(reader) in ("eof", "reset")
            await echo.wait_finished(1)  # upstream side was reset too
            writer.close()

            # The proxy keeps serving new connections.
            reader, writer = await open_client(proxy)
            writer.write(b"again")
            assert await reader.readexactly(5) == b"again"
            writer.close()
            assert proxy.drop_all() <= 1

    run(body())


def test_drop_all_closes_websocket() -> None:
    async def body() -> None:
        async with ws_echo_server() as ws_port, FaultProxy("127.0.0.1", ws_port) as proxy:
            async with ws_connect(proxy) as ws:
                await ws.send("before")
                assert await ws.recv() == "before"
                assert proxy.drop_all() == 1
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
            assert proxy.live_connections == 0

    run(body())


# -- delay --------------------------------------------------------------------------


def test_delay_slows_round_trip_both_directions() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            reader, writer = await open_client(proxy)
            writer.write(b"warm")
            assert await reader.readexactly(4) == b"warm"

            proxy.set_delay(0.3)
            started = time.monotonic()
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            elapsed = time.monotonic() - started
            assert 0.6 <= elapsed < 1.5, elapsed

            proxy.set_delay(0)
            started = time.monotonic()
            writer.write(b"fast")
            assert await reader.readexactly(4) == b"fast"
            assert time.monotonic() - started < 0.3
            writer.close()

    run(body())


def test_delay_preserves_order_even_when_lowered() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            reader, writer = await open_client(proxy)
            chunks = [b"%05d," % i for i in range(400)]
            proxy.set_delay(0.3)
            for i, chunk in enumerate(chunks):
                if i == 200:
                    proxy.set_delay(0)  # later chunks must still wait behind earlier ones
                writer.write(chunk)
                await writer.drain()
                if i % 20 == 0:
                    await asyncio.sleep(0)  # let the proxy read in many separate chunks
            expected = b"".join(chunks)
            assert await reader.readexactly(len(expected)) == expected
            assert proxy.bytes_up == proxy.bytes_down == len(expected)
            writer.close()

    run(body())


# -- blackhole ----------------------------------------------------------------------


def test_blackhole_swallows_raw_traffic_until_heal() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            live_reader, live_writer = await open_client(proxy)
            live_writer.write(b"one")
            assert await live_reader.readexactly(3) == b"one"

            proxy.blackhole()
            # A new connection is accepted (connect succeeds) but never answered.
            new_reader, new_writer = await open_client(proxy)
            new_writer.write(b"hello?")
            await new_writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(new_reader.read(1), 0.5)
            # The live connection stays open but nothing gets through.
            live_writer.write(b"two")
            await live_writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(live_reader.read(1), 0.2)
            assert echo.accepted == 1  # the new connection never reached upstream
            assert proxy.connections_accepted == 2
            assert proxy.live_connections == 2
            assert proxy.bytes_swallowed == len(b"hello?") + len(b"two")
            assert not new_reader.at_eof() and not live_reader.at_eof()

            proxy.heal()
            reader, writer = await open_client(proxy)
            writer.write(b"healed")
            assert await reader.readexactly(6) == b"healed"
            assert echo.accepted == 2
            for w in (live_writer, new_writer, writer):
                w.close()
            await proxy.wait_for_live(0)

    run(body())


def test_blackhole_stalls_live_websocket_until_heal() -> None:
    async def body() -> None:
        async with ws_echo_server() as ws_port, FaultProxy("127.0.0.1", ws_port) as proxy:
            async with ws_connect(proxy) as ws:
                await ws.send("before")
                assert await ws.recv() == "before"

                proxy.blackhole()
                await ws.send("lost")
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(ws.recv(), 0.5)
                with pytest.raises(TimeoutError):  # a new handshake gets no answer either
                    async with connect(f"ws://127.0.0.1:{proxy.port}/", open_timeout=0.3):
                        pass

                proxy.heal()
                async with ws_connect(proxy) as fresh:
                    await fresh.send("fresh")
                    assert await fresh.recv() == "fresh"
                # The swallowed frame is gone, but the old connection resumes.
                await ws.send("after")
                assert await ws.recv() == "after"

    run(body())


# -- cut_next_frame -----------------------------------------------------------------


def test_cut_next_frame_down_breaks_websocket_message() -> None:
    async def body() -> None:
        async with ws_echo_server() as ws_port, FaultProxy("127.0.0.1", ws_port) as proxy:
            async with ws_connect(proxy) as ws:
                await ws.send("intact")
                assert await ws.recv() == "intact"
                down_before = proxy.bytes_down

                proxy.cut_next_frame("down")
                await ws.send(os.urandom(10_240))
                with pytest.raises(ConnectionClosed):
                    message = await ws.recv()
                    pytest.fail(f"received a {len(message)}-byte message through a cut frame")
                assert 0 < proxy.bytes_down - down_before < 10_240
            assert proxy.live_connections == 0

    run(body())


def test_cut_next_frame_up_forwards_first_half_only() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            reader, writer = await open_client(proxy)
            writer.write(b"ok")
            assert await reader.readexactly(2) == b"ok"

            proxy.cut_next_frame("up")
            writer.write(b"a" * 1000)
            await writer.drain()
            assert await read_until_closed(reader) in ("eof", "reset")
            await echo.wait_finished(1)
            assert echo.received == 2 + 500
            assert proxy.bytes_up == 2 + 500
            writer.close()

            with pytest.raises(ValueError):
                proxy.cut_next_frame("sideways")

    run(body())


# -- refuse -------------------------------------------------------------------------


def test_refuse_closes_new_connections_immediately() -> None:
    async def body() -> None:
        async with echo_server() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
            proxy.refuse()
            reader, writer = await open_client(proxy)  # the connect itself succeeds
            assert await read_until_closed(reader, timeout=1.0) == "eof"
            writer.close()
            assert proxy.connections_accepted == 1
            assert proxy.live_connections == 0
            assert echo.accepted == 0

            proxy.refuse(False)
            reader, writer = await open_client(proxy)
            writer.write(b"back")
            assert await reader.readexactly(4) == b"back"
            writer.close()

    run(body())


# -- stop ----------------------------------------------------------------------------


def test_stop_closes_everything_quickly_and_leaks_nothing() -> None:
    async def body() -> None:
        async with echo_server() as echo:
            proxy = FaultProxy("127.0.0.1", echo.port)
            await proxy.start()
            port = proxy.port
            plain = await open_client(proxy)
            plain[1].write(b"x")
            assert await plain[0].readexactly(1) == b"x"

            proxy.set_delay(10)  # bytes stuck in the delay queue
            delayed = await open_client(proxy)
            delayed[1].write(b"stuck")
            proxy.blackhole()  # a half-open connection
            held = await open_client(proxy)
            await proxy.wait_for_live(3)

            started = time.monotonic()
            await proxy.stop()
            assert time.monotonic() - started < 1.0
            assert proxy.live_connections == 0
            for reader, writer in (plain, delayed, held):
                assert await read_until_closed(reader) in ("eof", "reset")
                writer.close()
            assert_no_proxy_tasks()
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", port)

            # Restartable on the same port.
            again = FaultProxy("127.0.0.1", echo.port, listen_port=port)
            async with again:
                reader, writer = await open_client(again)
                writer.write(b"y")
                assert await reader.readexactly(1) == b"y"
                writer.close()
            assert_no_proxy_tasks()

    run(body())


# -- threaded proxy, sync callers -------------------------------------------------------


class _SyncEcho(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


@contextlib.contextmanager
def sync_echo_server() -> Iterator[int]:
    """``socketserver`` echo server on 127.0.0.1 in its own threads; yields its port."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SyncEcho)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Blocking read of exactly ``size`` bytes (the socket has a timeout)."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def sync_closed(sock: socket.socket) -> bool:
    """True once the peer closed or reset (the socket has a timeout)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_threaded_proxy_from_sync_code() -> None:
    with sync_echo_server() as echo_port:
        proxy = ThreadedFaultProxy("127.0.0.1", echo_port)
        with proxy:
            assert proxy.url == f"http://127.0.0.1:{proxy.port}"
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
                sock.sendall(b"hello")
                assert recv_exactly(sock, 5) == b"hello"
                assert proxy.bytes_up == proxy.bytes_down == 5

                proxy.set_delay(0.2)
                started = time.monotonic()
                sock.sendall(b"slow")
                assert recv_exactly(sock, 4) == b"slow"
                assert 0.4 <= time.monotonic() - started < 1.5
                proxy.heal()

                assert proxy.drop_all() == 1
                assert sync_closed(sock)
            assert proxy.live_connections == 0

            with pytest.raises(RuntimeError):  # the async proxy refuses calls from a foreign thread
                proxy.proxy.drop_all()

            proxy.refuse()
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
                assert sock.recv(1) == b""
            proxy.refuse(False)

            # stop() with a live connection resets it and leaves nothing behind.
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=3)
            sock.sendall(b"live")
            assert recv_exactly(sock, 4) == b"live"
            proxy.wait_for_live(1)
            thread = proxy._thread
            assert thread is not None
        try:
            assert proxy.live_connections == 0
            assert not thread.is_alive()
            assert sync_closed(sock)
        finally:
            sock.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
        proxy.stop()  # idempotent
