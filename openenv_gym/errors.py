"""Exceptions raised by openenv_gym.

Every failure a caller may want to handle has its own type. All of them derive
from :class:`OpenEnvGymError`, so ``except OpenEnvGymError`` catches anything the
library raises on purpose.

Hierarchy::

    OpenEnvGymError
    ├── ProtocolError            a peer sent something that breaks the protocol
    │   └── LimitExceeded        ... or something larger or deeper than a limit allows
    ├── ConnectError             no session could be opened (refused, DNS, TLS, handshake)
    ├── ConnectionLost           an open session's connection went away
    ├── SessionTimeout           no reply within the timeout (also a ``TimeoutError``)
    ├── ServerError              the server answered with an error message
    │   └── CapacityError        the server is full (``CAPACITY_REACHED``)
    └── PoolUnavailable          no server could host the pool's sessions for the grace period
"""

from __future__ import annotations

import multiprocessing
from typing import Any

__all__ = [
    "OpenEnvGymError",
    "ProtocolError",
    "LimitExceeded",
    "ConnectError",
    "ConnectionLost",
    "SessionTimeout",
    "ServerError",
    "CapacityError",
    "PoolUnavailable",
]


class OpenEnvGymError(Exception):
    """Base class of every error openenv_gym raises on purpose."""


class ProtocolError(OpenEnvGymError):
    """A frame or message that does not follow the protocol.

    Raised by the decoders for malformed input and by the session client for a
    malformed reply. A session that received a malformed reply is closed: what
    the peer meant cannot be known, so the connection is not reused.
    """


class LimitExceeded(ProtocolError):
    """A frame, array or nesting level larger than the configured :class:`Limits`."""


class ConnectError(OpenEnvGymError):
    """Opening a session failed: refused, unreachable, TLS or handshake error, or timeout.

    Attributes:
        url: the WebSocket URL that was tried.
    """

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


def refused_because(status: int) -> str:
    """What an HTTP status that refused us most likely asks of the caller, as a suffix for a message ("" if nothing)."""
    if status == 401:
        return ' (the server wants a bearer token: headers={"Authorization": "Bearer TOKEN"})'
    return ""


class ConnectionLost(OpenEnvGymError):
    """The connection of an open session closed or broke.

    The server-side session (and its episode) is gone; a new session must be
    opened and reset.

    Attributes:
        url: the WebSocket URL of the session.
        code: the WebSocket close code, if a close frame was received.
        reason: the close reason, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.code = code
        self.reason = reason


class SessionTimeout(OpenEnvGymError, TimeoutError, multiprocessing.TimeoutError):
    """No reply arrived within the timeout.

    A built-in ``TimeoutError``, and a ``multiprocessing.TimeoutError``,
    which is what Gymnasium's ``AsyncVectorEnv.step_wait(timeout=)`` raises:
    code written for it catches the pool's ``step_wait``/``recv`` timeouts too.

    The stock OpenEnv protocol has no request ids, so a late reply would be
    taken for the answer to the next request (OpenEnv issue #1143). A session
    that timed out is therefore closed and never reused.

    Attributes:
        url: the WebSocket URL of the session.
        timeout: the timeout that expired, in seconds.
    """

    def __init__(self, message: str, *, url: str | None = None, timeout: float | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.timeout = timeout


class ServerError(OpenEnvGymError):
    """The server replied with an error message.

    Attributes:
        code: the server's error code, for example ``"EXECUTION_ERROR"`` or
            ``"VALIDATION_ERROR"`` (stock OpenEnv ``WSErrorCode`` values).
        message: the server's message.
        data: the whole ``data`` object of the error reply (extra fields such as
            ``errors``, ``active_sessions``).
        url: the WebSocket URL of the session.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        data: dict[str, Any] | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = dict(data or {})
        self.url = url


class CapacityError(ServerError):
    """The server is at its session limit (``CAPACITY_REACHED``).

    Try another server, or retry after a backoff. The server closes the
    connection after sending this error.

    Attributes:
        active_sessions: sessions open on the server, when it said so.
        max_sessions: the server's session limit, when it said so.
    """

    @property
    def active_sessions(self) -> int | None:
        value = self.data.get("active_sessions")
        return value if isinstance(value, int) else None

    @property
    def max_sessions(self) -> int | None:
        value = self.data.get("max_sessions")
        return value if isinstance(value, int) else None


class PoolUnavailable(OpenEnvGymError):
    """No server could host the pool's sessions for longer than the grace period.

    The vector pool absorbs the loss of single sessions and servers (the
    affected envs report ``truncated`` with ``info["openenv_error"]``); it
    raises this only when it has had nowhere to put sessions for the whole
    grace period. The message names every server and its last error.
    """
