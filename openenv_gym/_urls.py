"""Base URLs: the WebSocket URL of ``/ws`` and the HTTP URL of the other endpoints."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["ws_url", "http_url", "is_loopback"]

_TO_WS = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_TO_HTTP = {"http": "http", "https": "https", "ws": "http", "wss": "https"}


def _split(base_url: str):
    parts = urlsplit(base_url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _TO_WS:
        raise ValueError(f"base URL must start with http://, https://, ws:// or wss://, got {base_url!r}")
    if not parts.netloc:
        raise ValueError(f"base URL has no host: {base_url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[: -len("/ws")]
    return scheme, parts.netloc, path, parts.query


def ws_url(base_url: str) -> str:
    """``http://h:p/x`` or ``ws://h:p/x[/ws]`` -> ``ws://h:p/x/ws`` (``https``/``wss`` -> ``wss``)."""
    scheme, netloc, path, query = _split(base_url)
    return urlunsplit((_TO_WS[scheme], netloc, path + "/ws", query, ""))


def http_url(base_url: str, endpoint: str = "") -> str:
    """The HTTP(S) URL of ``endpoint`` (for example ``"/schema"``) on the server of ``base_url``."""
    scheme, netloc, path, _ = _split(base_url)
    return urlunsplit((_TO_HTTP[scheme], netloc, path + endpoint, "", ""))


def is_loopback(base_url: str) -> bool:
    """Whether the URL's host is a loopback name or address."""
    host = (urlsplit(base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")
