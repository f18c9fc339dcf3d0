"""A bounded HTTP/1.1 request reader for the POST endpoints on the WebSocket port (no I/O).

websockets answers ``GET`` only. OpenEnv's MCP clients also ``POST`` JSON-RPC
to ``/mcp``; :class:`RequestReader` turns the bytes of such a connection into
:class:`HttpRequest` objects, one after another (keep-alive), and
:func:`encode_response` writes the answers. Every size is bounded: the request
line and headers by ``max_head`` bytes, a body by ``max_body`` bytes, which
needs a ``Content-Length`` (no chunked bodies). A request that breaks a rule
sets :attr:`RequestReader.error` (an :class:`HttpError`, with the status to
answer once the requests before it are answered) and ends the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

__all__ = ["HttpError", "HttpRequest", "RequestReader", "encode_response", "parse_request_line", "MAX_HEAD_BYTES"]

#: The longest request line and headers accepted, in bytes.
MAX_HEAD_BYTES = 16 * 1024

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    """A request that cannot be served; answer ``status`` and close the connection."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request.

    Attributes:
        method: ``"POST"``, ...
        target: the request target as sent (``/mcp``, ``/mcp?x=1``).
        headers: header names in lower case; a repeated header's values joined by ``", "``.
        body: the body (``Content-Length`` bytes).
        keep_alive: whether the connection stays open after the answer.
    """

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class RequestReader:
    """Bytes in, requests out.

    Args:
        max_body: the largest body accepted, in bytes.
        max_head: the longest request line and headers, in bytes.
    """

    def __init__(self, max_body: int, max_head: int = MAX_HEAD_BYTES) -> None:
        self.max_body = max_body
        self.max_head = max_head
        self._buffer = bytearray()
        self._head: tuple[str, str, dict[str, str], bool] | None = None
        self._length = 0
        #: A request asked for ``100 Continue`` before its body (the caller answers, then clears this).
        self.expects_continue = False
        #: The refusal that ended the stream, if one did.
        self.error: HttpError | None = None

    @property
    def idle(self) -> bool:
        """Whether no part of a request has been received."""
        return not self._buffer and self._head is None

    def feed(self, data: bytes) -> list[HttpRequest]:
        """The requests completed by ``data``.

        A malformed or oversized request sets :attr:`error` (an :class:`HttpError`)
        and ends the stream: the requests before it are still returned, and
        nothing after it is read.
        """
        if self.error is not None:
            return []
        self._buffer += data
        out: list[HttpRequest] = []
        try:
            while True:
                if self._head is None:
                    end = self._buffer.find(b"\r\n\r\n")
                    # (the head is what precedes the blank line: up to 3 bytes of it may be here already)
                    if end > self.max_head or (end < 0 and len(self._buffer) > self.max_head + 3):
                        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {self.max_head} bytes")
                    if end < 0:
                        return out
                    head = bytes(self._buffer[:end])
                    del self._buffer[: end + 4]
                    self._head, self._length = self._parse_head(head)
                    if self._length and self._head[2].get("expect", "").lower() == "100-continue":
                        self.expects_continue = len(self._buffer) < self._length
                if len(self._buffer) < self._length:
                    return out
                method, target, headers, keep_alive = self._head
                body = bytes(self._buffer[: self._length])
                del self._buffer[: self._length]
                self._head = None
                self.expects_continue = False
                out.append(HttpRequest(method, target, headers, body, keep_alive))
        except HttpError as exc:
            self.error = exc
            self._buffer.clear()
            self._head = None
            return out

    def _parse_head(self, head: bytes) -> tuple[tuple[str, str, dict[str, str], bool], int]:
        lines = head.split(b"\r\n")
        method, target, version = parse_request_line(lines[0])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or not set(name) <= _TOKEN:
                raise HttpError(HTTPStatus.BAD_REQUEST, "malformed header line")
            key = name.decode("ascii").lower()
            text = value.strip(b" \t").decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if "transfer-encoding" in headers:
            raise HttpError(HTTPStatus.NOT_IMPLEMENTED, "chunked bodies are not accepted; send a Content-Length")
        raw = headers.get("content-length", "0")
        if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
            raise HttpError(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        length = int(raw)
        if length > self.max_body:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes, limit is {self.max_body}")
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == b"HTTP/1.1" else "keep-alive" in connection
        return (method.decode("ascii"), target.decode("ascii"), headers, keep_alive), length


def parse_request_line(line: bytes) -> tuple[bytes, bytes, bytes]:
    """``(method, target, version)`` of an HTTP/1.x request line (without its CRLF).

    Raises:
        HttpError: 400 for a malformed line (not three parts; a method that
            is not a token; a target that is empty or not ASCII, as URIs
            are), 505 for a version other than HTTP/1.1 and HTTP/1.0.
    """
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN or not parts[1] or not parts[1].isascii():
        raise HttpError(HTTPStatus.BAD_REQUEST, "malformed request line")
    if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.1 and HTTP/1.0 are served")
    return parts[0], parts[1], parts[2]


def encode_response(
    status: HTTPStatus, body: bytes, *, keep_alive: bool, content_type: str = "application/json", extra: tuple[tuple[str, str], ...] = ()
) -> bytes:
    """An HTTP/1.1 response with ``body``."""
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        "Server: openenv-gym",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: keep-alive" if keep_alive else "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
