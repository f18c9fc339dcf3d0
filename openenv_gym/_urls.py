"""Base URLs: the WebSocket URL of ``/ws`` and the HTTP URL of the other endpoints.

A base URL is ``http://``, ``https://``, ``ws://`` or ``wss://`` a host and
port, or ``unix:/path/to/socket`` for a server listening on a Unix socket on
this machine (``openenv-gym serve --unix PATH``). A Unix socket has no host:
its requests name ``localhost``.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["ws_url", "http_url", "is_loopback", "unix_path", "socket_of", "UNIX_SCHEME"]

#: Scheme of a base URL that names a Unix socket: ``unix:/run/env.sock`` (or ``unix:///run/env.sock``).
UNIX_SCHEME = "unix"

_TO_WS = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss", UNIX_SCHEME: "ws"}
_TO_HTTP = {"http": "http", "https": "https", "ws": "http", "wss": "https", UNIX_SCHEME: "http"}


def unix_path(base_url: str) -> str | None:
    """The socket path of a ``unix:`` base URL, else ``None``.

    The path is taken as written, with no percent-decoding: ``unix:/tmp/a%41#1``
    is the file ``/tmp/a%41#1``.

    Raises:
        ValueError: a ``unix:`` URL with a host, or without an absolute path.
    """
    text = base_url.strip()
    if text[:5].lower() != UNIX_SCHEME + ":":
        return None
    path = text[5:]
    if path.startswith("//"):  # unix:///run/env.sock; unix://host/... has no absolute path left
        path = path[2:]
    if not path.startswith("/"):
        raise ValueError(f"a Unix socket URL is unix:/absolute/path, got {base_url!r}")
    return path


def socket_of(base_url: str, *, tls: bool = False) -> tuple[str | None, str]:
    """``(socket path, name)``: the Unix socket of a ``unix:`` URL (else ``None``), and how errors name
    the WebSocket endpoint: the socket, not the ``ws://localhost/ws`` its handshake asks for.

    Raises:
        ValueError: a malformed base URL, or ``tls`` for a Unix socket (TLS does not apply to one)
            or for an ``http://``/``ws://`` one.
    """
    path = unix_path(base_url)
    if path is None:
        url = ws_url(base_url)
        if tls and not url.startswith("wss://"):
            raise ValueError(f"TLS (ssl=) needs an https:// or wss:// base URL, got {base_url!r}")
        return None, url
    if tls:
        raise ValueError(f"TLS (ssl=) does not apply to a Unix socket ({UNIX_SCHEME}:{path})")
    return path, f"{UNIX_SCHEME}:{path}"


def _split(base_url: str):
    if unix_path(base_url) is not None:  # (which checks it)
        return UNIX_SCHEME, "localhost", "", ""
    parts = urlsplit(base_url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _TO_WS or scheme == UNIX_SCHEME:
        raise ValueError(f"base URL must start with http://, https://, ws://, wss:// or unix:, got {base_url!r}")
    if not parts.netloc:
        raise ValueError(f"base URL has no host: {base_url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[: -len("/ws")]
    return scheme, parts.netloc, path, parts.query


def ws_url(base_url: str) -> str:
    """``http://h:p/x`` or ``ws://h:p/x[/ws]`` -> ``ws://h:p/x/ws`` (``https``/``wss`` -> ``wss``).

    For ``unix:PATH``: ``ws://localhost/ws``, the URL of the handshake sent over that socket.
    """
    scheme, netloc, path, query = _split(base_url)
    return urlunsplit((_TO_WS[scheme], netloc, path + "/ws", query, ""))


def http_url(base_url: str, endpoint: str = "") -> str:
    """The HTTP(S) URL of ``endpoint`` (for example ``"/schema"``) on the server of ``base_url``.

    For ``unix:PATH``: ``http://localhost/<endpoint>``, requested over that socket.
    """
    scheme, netloc, path, _ = _split(base_url)
    return urlunsplit((_TO_HTTP[scheme], netloc, path + endpoint, "", ""))


def is_loopback(base_url: str) -> bool:
    """Whether the URL's host is a loopback name or address, or the URL is a Unix socket's."""
    if base_url.strip()[:5].lower() == UNIX_SCHEME + ":":
        return True
    host = (urlsplit(base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")
