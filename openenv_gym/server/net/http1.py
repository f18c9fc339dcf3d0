"""A bounded HTTP/1.1 request reader for the plain HTTP on the WebSocket port (no I/O).

websockets reads the ``GET`` of a handshake. OpenEnv's MCP clients also ``POST`` JSON-RPC
to ``/mcp``, and other clients send what websockets cannot read (another
method, HTTP/1.0, a body, bare LF line ends, which RFC 9112 lets a server
accept); :class:`RequestReader` turns the bytes of such a connection into
:class:`HttpRequest` objects, one after another (keep-alive), and
:func:`encode_response` writes the answers. Every size is bounded: the request
line and headers by ``max_head`` bytes, a body by ``max_body`` bytes, which
needs a ``Content-Length`` (no chunked bodies), and may be bounded lower per
target (``body_limit``). A request that breaks a rule
sets :attr:`RequestReader.error` (an :class:`HttpError`, with the status to
answer once the requests before it are answered) and ends the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Callable

__all__ = ["HttpError", "HttpRequest", "RequestReader", "encode_response", "find_head_end", "parse_request_line", "MAX_HEAD_BYTES"]

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
        body_limit: the largest body accepted for a request target, in
            bytes (at most ``max_body``), or ``None`` for ``max_body``;
            ``None`` in place of the function: ``max_body`` for all.
    """

    def __init__(self, max_body: int, max_head: int = MAX_HEAD_BYTES, body_limit: Callable[[str], int | None] | None = None) -> None:
        self.max_body = max_body
        self.max_head = max_head
        self.body_limit = body_limit
        self._scanned = 0  # (bytes of the buffer searched for the head's end in vain)
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
                    end, body = find_head_end(self._buffer, self._scanned)
                    # (the head is what precedes the blank line: up to 3 bytes of it may be here already)
                    if end > self.max_head or (end < 0 and len(self._buffer) > self.max_head + 3):
                        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {self.max_head} bytes")
                    if end < 0:
                        self._scanned = len(self._buffer)
                        return out
                    head = bytes(self._buffer[:end])
                    del self._buffer[:body]
                    self._scanned = 0
                    self._head, self._length = self._parse_head(head)
                    if self._length and self._head[2].get("expect", "").lower() == "100-continue":
                        self.expects_continue = len(self._buffer) < self._length
                if len(self._buffer) < self._length:
                    return out
                method, target, headers, keep_alive = self._head
                content = bytes(self._buffer[: self._length])
                del self._buffer[: self._length]
                self._head = None
                self.expects_continue = False
                out.append(HttpRequest(method, target, headers, content, keep_alive))
        except HttpError as exc:
            self.error = exc
            self._buffer.clear()
            self._head = None
            return out

    def _parse_head(self, head: bytes) -> tuple[tuple[str, str, dict[str, str], bool], int]:
        lines = [line.removesuffix(b"\r") for line in head.split(b"\n")]
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
        limit = self.max_body
        if self.body_limit is not None and (lower := self.body_limit(target.decode("ascii"))) is not None:
            limit = min(limit, lower)
        if length > limit:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes, limit is {limit}")
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == b"HTTP/1.1" else "keep-alive" in connection
        return (method.decode("ascii"), target.decode("ascii"), headers, keep_alive), length


def find_head_end(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int]:
    """``(end, body)``: where a request's head ends (before the blank line's line end) and its body begins; ``(-1, -1)`` if not yet.

    Lines end with CRLF or a bare LF. ``start``: how far ``buffer`` was
    searched before in vain (a search per read would otherwise cost the
    square of the head's length).
    """
    at = max(0, start - 2)
    lf_lf, lf_crlf = buffer.find(b"\n\n", at), buffer.find(b"\n\r\n", at)
    if lf_lf < 0 and lf_crlf < 0:
        return -1, -1
    if lf_crlf < 0 or 0 <= lf_lf < lf_crlf:
        at, body = lf_lf, lf_lf + 2
    else:
        at, body = lf_crlf, lf_crlf + 3
    return (at - 1 if at and buffer[at - 1] == 0x0D else at), body


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
    status: HTTPStatus,
    body: bytes | bytearray,
    *,
    keep_alive: bool,
    content_type: str = "application/json",
    extra: tuple[tuple[str, str], ...] = (),
    head: bool = False,
) -> bytes:
    """An HTTP/1.1 response with ``body``; for ``head`` (the answer to a ``HEAD``), its headers alone."""
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        "Server: openenv-gym",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: keep-alive" if keep_alive else "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)
