"""The asyncio client: one session (:class:`Session`) or many on one connection (:class:`FastConnection`)."""

from .fast_connection import FastConnection
from .session import Session
from .transport import Transport, open_transport

__all__ = ["Session", "FastConnection", "Transport", "open_transport"]
