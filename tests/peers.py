"""Misbehaving peers for fault tests: real sockets on loopback, run in the test's event loop.

These are not stand-ins for OpenEnv servers (the tests use real stock servers
for that); they are the faults themselves: a peer that answers garbage, one
that accepts a connection and never answers, one that hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import queue
import threading
from typing import AsyncIterator, Callable, Iterable, Iterator

from websockets.asyncio.server import ServerConnection, serve

__all__ = ["rogue_ws_server", "rogue_fast_server", "rogue_http_server", "dripping_http_server", "silent_tcp_server", "OBSERVATION"]

OBSERVATION = {"type": "observation", "data": {"observation": {"state": [0.0, 0.0, 0.0, 0.0]}, "reward": None, "done": False}}


@contextlib.asynccontextmanager
async def rogue_ws_server(
    reply: Callable[[str, ServerConnection], object],
) -> AsyncIterator[tuple[str, list]]:
    """A WebSocket server on ``/ws`` that answers each frame with ``reply(frame, conn)``.

    ``reply`` returns a ``str`` to send, ``None`` to stay silent, or ``"CLOSE"``
    to hang up. Yields ``(base_url, handshake_headers)``, the second a list
    filled with each handshake's request headers.
    """
    seen_headers: list = []

    async def handler(conn: ServerConnection) -> None:
        seen_headers.append(conn.request.headers)
        async for frame in conn:
            answer = reply(frame, conn)
            if answer == "CLOSE":
                await conn.close(1011, "rogue peer hangs up")
                return
            if answer is not None:
                await conn.send(answer)

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", seen_headers


@contextlib.asynccontextmanager
async def silent_tcp_server() -> AsyncIterator[str]:
    """A TCP listener that accepts connections and never says a word (half-open peer)."""
    held: list[asyncio.StreamWriter] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def stock_echo(frame: str, conn: ServerConnection) -> str | None:
    """Answer like a stock CartPole server would, without any env behind it."""
    message = json.loads(frame)
    if message["type"] == "close":
        return "CLOSE"
    return json.dumps(OBSERVATION)


@contextlib.asynccontextmanager
async def rogue_fast_server(
    step: Callable[[dict], list[dict]],
    raw_step: Callable[[bytes], bytes] | None = None,
    grant_partial: bool = True,
) -> AsyncIterator[str]:
    """A fast-path (``openenv.msgpack.v1``) CartPole look-alike whose step replies are ``step(request)``.

    ``/health`` and ``/schema`` are a real CartPole server's; ``open`` and
    ``reset`` are answered correctly (zero observations); each ``step``
    request gets the replies ``step(request)`` returns, which may be wrong.
    With ``raw_step``, a ``bind`` gets lane 0 (CartPole's layout) and each
    raw frame the bytes ``raw_step(frame)`` returns; without, a ``bind`` is
    refused. ``grant_partial``: the ``bound`` reply grants ``partial`` where a
    ``bind`` asks for it (``False``: as a server that knows no such field).
    """
    import numpy as np

    from openenv_gym.protocol import lane as lanes
    from openenv_gym.protocol import multiplex as fastp
    from openenv_gym.protocol.codec import MsgpackCodec
    from openenv_gym.server.hosting.gym_host import GymHostFactory
    from openenv_gym.server.net.routes import Routes

    factory = GymHostFactory("CartPole-v1")
    routes = Routes(factory.schema(), factory.metadata(), lambda: (0, 64))
    codec = MsgpackCodec()
    ids = iter(range(1 << 30))

    async def handler(conn: ServerConnection) -> None:
        async for frame in conn:
            if raw_step is not None and frame[:1] == b"\xc1":
                await conn.send(raw_step(frame))
                continue
            request = codec.decode(frame)
            kind, rid = request["type"], request["id"]
            if kind == "bind":
                if raw_step is None:
                    replies = [fastp.fast_error_reply(rid, "UNKNOWN_TYPE", "Unknown message type: bind")]
                else:
                    layout = lanes.Layout(np.dtype("<f4"), (4,))
                    # (granted as asked, as an openenv_gym server grants it)
                    partial = grant_partial and request.get("partial", False)
                    replies = [lanes.bound_reply(rid, request["sessions"], 0, "observation", layout, partial=partial)]
            elif kind == "open":
                replies = [fastp.opened_reply(rid, [next(ids) for _ in range(request["count"])])]
            elif kind == "reset":
                replies = [zero_batch(rid, request["sessions"])]
            elif kind == "step":
                replies = step(request)
            else:
                replies = [fastp.closed_reply(rid, request["sessions"])]
            for reply in replies:
                await conn.send(codec.encode(reply))

    select = lambda conn, offered: fastp.SUBPROTOCOL if fastp.SUBPROTOCOL in offered else None
    async with serve(handler, "127.0.0.1", 0, compression=None, process_request=routes, select_subprotocol=select) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"


def zero_batch(rid: int, sessions: list) -> dict:
    """A ``batch`` reply of zero CartPole observations for ``sessions``."""
    import numpy as np

    from openenv_gym.protocol import multiplex as fastp

    n = len(sessions)
    observation = {"observation": np.zeros((n, 4), np.float32), "truncated": np.zeros(n, np.bool_)}
    return fastp.batch_reply(rid, sessions, observation, np.zeros(n), np.zeros(n, np.bool_))


@contextlib.contextmanager
def rogue_http_server(body: Callable[[str], Iterable[bytes]], *, chunked: bool = False) -> Iterator[tuple[str, queue.Queue]]:
    """An HTTP server whose every GET is answered 200 with the pieces of ``body(path)``, in a thread of its own.

    With ``chunked``, the pieces go out in chunked transfer encoding (no
    length said in advance); otherwise the body is sent whole, after its
    Content-Length. Yields ``(base_url, sent)``, ``sent`` a queue that gets
    the number of body bytes written for each answer once it is over (a
    client that hangs up early makes the write fail: what was written so
    far is counted).
    """
    sent: queue.Queue[int] = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            written = 0
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in body(self.path):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        written += len(piece)
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    whole = b"".join(body(self.path))
                    self.send_header("Content-Length", str(len(whole)))
                    self.end_headers()
                    self.wfile.write(whole)
                    written = len(whole)
            except OSError:  # (the client hung up)
                self.close_connection = True
            finally:
                sent.put(written)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def dripping_http_server(answer: Callable[[str], bytes], interval: float) -> Iterator[str]:
    """An HTTP server that writes each whole answer (status line, head and body) one byte every ``interval`` seconds.

    ``answer(path)`` is the response's bytes. The peer's pacing is the fault:
    a client's per-read timeout never fires, as each read gets a byte.
    Connections are dropped when the server stops. Yields the base URL.
    """
    import socket

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)

    def drip(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and not stop.is_set():
                try:
                    piece = conn.recv(4096)
                except OSError:
                    return
                if not piece:
                    return
                head += piece
            path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
            for byte in answer(path):
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                stop.wait(interval)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()
