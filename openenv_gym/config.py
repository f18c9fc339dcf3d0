"""Small value objects for the options that travel together.

:class:`Timeouts` and :class:`Limits` are shared by the session client, the
single-env adapter, the vector pool and the server, so that a limit means the
same thing on both ends of a connection.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Timeouts", "Limits"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Timeouts of one session, in seconds.

    Attributes:
        connect: opening the TCP connection, TLS and the WebSocket handshake,
            plus (on the fast path) opening the server-side session.
        step: waiting for the reply to one request (reset, step, state).
        close: waiting for the closing handshake before the socket is dropped.
    """

    connect: float = 10.0
    step: float = 60.0
    close: float = 2.0

    def __post_init__(self) -> None:
        for name in ("connect", "step", "close"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"Timeouts.{name} must be > 0 seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a peer may send. Anything larger is refused with a clear error.

    Attributes:
        max_frame_bytes: largest WebSocket message accepted, in bytes; a
            client reads ``/schema`` and ``/health`` answers up to this size too.
        max_array_bytes: largest single numpy array in a msgpack frame, in bytes
            (checked against the declared shape before anything is allocated).
        max_depth: deepest nesting of lists and maps in a decoded message.
        max_ndim: most dimensions of an array in a msgpack frame.
        max_sequence_length: most items of Gymnasium ``Sequence`` values in
            one action a server reads, all levels counted (each item is read
            and checked in Python: 16,384 take ~60 ms). Clients do not use it.
        max_containers: most lists and maps in one decoded msgpack message,
            all levels counted. Each costs ~60-90 bytes once decoded, so
            this, not the frame size, bounds what a message of tiny
            containers takes (16 MiB of one-byte empty lists would take
            ~1.3 GB). JSON has its own, ``max_json_containers``.
        max_json_containers: most lists and objects in one JSON message (a
            stock reply, ``/schema``, a stock client's request), counted
            before it is parsed. Higher than ``max_containers``: JSON arrays
            are nested lists, and a 1920x1080 RGB image sent as lists of
            pixels has 2 million of them.
        max_fragments: most frames one fragmented WebSocket message may
            come in (each costs ~130 bytes on top of its payload), as
            websockets' own connections allow by default.
    """

    max_frame_bytes: int = 64 * MiB
    max_array_bytes: int = 64 * MiB
    max_depth: int = 32
    max_ndim: int = 32
    max_sequence_length: int = 16 * 1024
    max_containers: int = 1 << 20
    max_json_containers: int = 1 << 22
    max_fragments: int = 4096

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_array_bytes",
            "max_depth",
            "max_ndim",
            "max_sequence_length",
            "max_containers",
            "max_json_containers",
            "max_fragments",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
