"""Who may talk to the server: the bearer token and the TLS context.

The token check runs in ``process_request`` (:mod:`.routes`), before any
WebSocket handshake, so a refused client never reaches a session, a host or
the env. Every request but ``GET /health`` must carry
``Authorization: Bearer <token>``; ``/health`` stays open for load-balancer
probes and says only ``status``, ``active_sessions`` and ``max_sessions``.

The token is compared as SHA-256 digests with :func:`hmac.compare_digest`:
constant time, and the length of the token does not leak either. It never
appears in a ``repr``, a log line or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import ssl
from typing import NoReturn

from websockets.datastructures import Headers

__all__ = [
    "TOKEN_ENV",
    "UNAUTHORIZED_DETAIL",
    "BearerToken",
    "check_token",
    "server_ssl_context",
]

logger = logging.getLogger(__name__)

#: The environment variable ``openenv-gym serve`` reads the token from when
#: ``--token`` is not given. Unlike a command-line argument, the environment
#: of a process is not shown by ``ps`` to other users.
TOKEN_ENV = "OPENENV_GYM_TOKEN"

#: The ``detail`` of the 401 body.
UNAUTHORIZED_DETAIL = "missing or wrong bearer token"

_SHORT_TOKEN = 16


def check_token(token: str) -> None:
    """Raise ``ValueError`` unless ``token`` can travel in an ``Authorization`` header.

    A token is one or more printable ASCII characters without spaces
    (``secrets.token_urlsafe(32)`` makes a good one). The message never
    quotes the token.
    """
    if not isinstance(token, str):
        raise ValueError(f"the bearer token must be a str, got {type(token).__name__}")
    if not token:
        raise ValueError("the bearer token is empty (use None for no token)")
    if not all("\x21" <= c <= "\x7e" for c in token):
        raise ValueError("the bearer token must be printable ASCII without spaces")


class BearerToken:
    """The token a server requires, kept only as its SHA-256 digest.

    Args:
        token: the secret (see :func:`check_token`).

    Raises:
        ValueError: ``token`` cannot travel in a header.
    """

    __slots__ = ("_digest",)

    def __init__(self, token: str) -> None:
        check_token(token)
        if len(token) < _SHORT_TOKEN:
            logger.warning(
                "the bearer token has fewer than %d characters; make a longer one, for example with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                _SHORT_TOKEN,
            )
        self._digest = hashlib.sha256(token.encode("ascii")).digest()

    def admits(self, headers: Headers) -> bool:
        """Whether ``headers`` hold exactly one ``Authorization: Bearer <token>`` with this token.

        The scheme name is case-insensitive (RFC 7235); the token is not.
        """
        values = headers.get_all("Authorization")
        if len(values) != 1:
            return False
        scheme, _, credentials = values[0].strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        try:
            given = credentials.strip().encode("utf-8", "surrogateescape")
        except UnicodeError:
            return False
        return hmac.compare_digest(hashlib.sha256(given).digest(), self._digest)

    def __repr__(self) -> str:
        return "BearerToken(<hidden>)"


def _no_password() -> NoReturn:
    # Without a callback OpenSSL would prompt on the terminal and a server
    # started in the background would hang.
    raise ValueError("the key file is encrypted; give the server an unencrypted key file")


def server_ssl_context(certfile: str | os.PathLike[str], keyfile: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) presenting ``certfile``.

    Args:
        certfile: PEM file with the certificate, followed by any intermediate
            certificates (and the private key, if ``keyfile`` is not given).
        keyfile: PEM file with the unencrypted private key.

    Raises:
        OSError: a file cannot be read.
        ssl.SSLError: the files hold no certificate, no key, or a key that
            does not match the certificate.
        ValueError: the key is encrypted.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile, password=_no_password)
    return context
