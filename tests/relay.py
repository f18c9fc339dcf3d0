"""A relay between a fast-path client and a real server that can rewrite the server's replies: a buggy or hostile middle.

The relay speaks WebSocket (``openenv.msgpack.v1``) to both sides on loopback:
each client connection gets its own upstream connection to the server, and
every message from the server goes through, decoded and encoded again, past
``rewrite``: a function of one decoded message and the type of the request it
answers (``"reset"``, ``"step"``, ...; ``None`` if unknown) that returns the
messages to send on in its place (none, one, or several: it may hold one back
and send it with a later one). Frames that are not msgpack (raw lane frames)
pass as they are. ``GET /schema`` and ``/health`` are fetched from the
server and answered as it answered them. The relay runs on an event loop of
its own, in a daemon thread; ``url`` is what the client connects to.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import httpx
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from openenv_gym.config import Limits
from openenv_gym.protocol.codec import MsgpackCodec
from openenv_gym.protocol.multiplex import SUBPROTOCOL

__all__ = ["Relay", "Rewrite"]

#: ``rewrite(message, kind) -> messages``: what to send to the client in place of ``message`` from the server.
Rewrite = Callable[[dict[str, Any], "str | None"], list[dict[str, Any]]]


class Relay:
    """``with Relay(server_url, rewrite) as relay:`` clients connect to ``relay.url``."""

    def __init__(self, server_url: str, rewrite: Rewrite) -> None:
        self.server_url = server_url.rstrip("/")
        self.rewrite = rewrite
        self.url = ""
        self._codec = MsgpackCodec(Limits())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._server: Any = None

    def __enter__(self) -> "Relay":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info: Any) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> Any:
        return await serve(
            self._relay,
            "127.0.0.1",
            0,
            subprotocols=[SUBPROTOCOL],
            process_request=self._http,
            compression=None,
            max_size=None,
            ping_interval=None,
        )

    def _decoded(self, message: Any) -> Any:
        """The msgpack message in a frame, or ``None`` for one that is not (a raw lane frame, text)."""
        if isinstance(message, str):
            return None
        try:
            return self._codec.decode(message)
        except Exception:
            return None

    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.rstrip("/") == "/ws":
            return None
        async with httpx.AsyncClient(trust_env=False) as client:
            answer = await client.get(self.server_url + request.path, timeout=10)
        headers = Headers([("Content-Type", answer.headers.get("content-type", "application/json"))])
        return Response(answer.status_code, answer.reason_phrase, headers, answer.content)

    async def _relay(self, down: ServerConnection) -> None:
        ws_url = self.server_url.replace("http://", "ws://") + "/ws"
        async with connect(ws_url, subprotocols=[SUBPROTOCOL], compression=None, max_size=None, ping_interval=None) as up:
            kinds: dict[int, str] = {}  # request id -> its type

            async def client_to_server() -> None:
                async for message in down:
                    request = self._decoded(message)
                    if isinstance(request, dict) and isinstance(request.get("id"), int):
                        kinds[request["id"]] = str(request.get("type"))
                    await up.send(message)

            async def server_to_client() -> None:
                async for message in up:
                    decoded = self._decoded(message)
                    if not isinstance(decoded, dict):
                        await down.send(message)
                        continue
                    for out in self.rewrite(decoded, kinds.get(decoded.get("id"))):  # type: ignore[arg-type]
                        await down.send(self._codec.encode(out))

            tasks = [asyncio.ensure_future(client_to_server()), asyncio.ensure_future(server_to_client())]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
