"""Opening a WebSocket to an OpenEnv server and negotiating the codec.

The client offers the fast-path subprotocol (``openenv.msgpack.v1``) in the
handshake. A server that selects it speaks the fast protocol; a server that
selects none (every stock OpenEnv server) speaks stock JSON.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from dataclasses import dataclass
from typing import Mapping

from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from .._urls import is_loopback, socket_of, ws_url
from ..config import Limits, Timeouts
from ..errors import ConnectError, refused_because
from ..protocol.multiplex import SUBPROTOCOL

#: websockets' own logger for our connections. Its debug lines print the handshake's headers, bearer
#: token included, so it stays at INFO even when the root logger is at DEBUG (set its level lower to
#: see frames, knowing that).
PROTOCOL_LOGGER = logging.getLogger("openenv_gym.client.protocol")
PROTOCOL_LOGGER.setLevel(logging.INFO)

__all__ = ["OpenSocket", "open_socket"]


@dataclass(slots=True)
class OpenSocket:
    """An open WebSocket and what was negotiated on it.

    Attributes:
        ws: the ``websockets`` connection.
        url: the WebSocket URL.
        codec: ``"msgpack"`` when the server selected the fast path, else ``"json"``.
    """

    ws: ClientConnection
    url: str
    codec: str


async def open_socket(
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeouts: Timeouts,
    limits: Limits,
    offer_msgpack: bool = True,
    ssl: ssl_module.SSLContext | None = None,
) -> OpenSocket:
    """Connect to ``base_url``'s ``/ws`` within ``timeouts.connect`` seconds.

    Raises:
        ConnectError: refused, unreachable, TLS or handshake failure, or timeout.
    """
    try:
        socket_path, url = socket_of(base_url, tls=ssl is not None)
    except ValueError as exc:
        raise ConnectError(f"cannot connect to {base_url}: {exc}", url=base_url) from None
    options: dict = dict(
        subprotocols=[SUBPROTOCOL] if offer_msgpack else None,
        additional_headers=dict(headers or {}),
        max_size=limits.max_frame_bytes,
        compression=None,
        open_timeout=None,
        close_timeout=timeouts.close,
        ping_interval=20.0,
        ping_timeout=20.0,
        user_agent_header="openenv-gym",
        logger=PROTOCOL_LOGGER,  # (not websockets.client: its debug lines show the token)
    )
    if socket_path is not None:
        opening = unix_connect(socket_path, ws_url(base_url), **options)
    else:
        if is_loopback(url):
            options["proxy"] = None
        if ssl is not None:
            options["ssl"] = ssl
        opening = connect(url, **options)
    try:
        async with asyncio.timeout(timeouts.connect):
            ws = await opening
    except TimeoutError:
        raise ConnectError(f"connecting to {url} timed out after {timeouts.connect} s", url=url) from None
    except InvalidStatus as exc:
        status = exc.response.status_code
        raise ConnectError(f"{url} refused the WebSocket handshake with HTTP {status}{refused_because(status)}", url=url) from None
    except (OSError, InvalidHandshake, InvalidURI) as exc:
        raise ConnectError(f"cannot connect to {url}: {exc}", url=url) from None
    codec = "msgpack" if ws.subprotocol == SUBPROTOCOL else "json"
    return OpenSocket(ws, url, codec)
