"""The asyncio client: one session (:class:`Session`) or many on one connection (:class:`FastConnection`)."""

from .fast_connection import FastConnection
from .open_socket import OpenSocket, open_socket
from .session import Session

__all__ = ["Session", "FastConnection", "OpenSocket", "open_socket"]
