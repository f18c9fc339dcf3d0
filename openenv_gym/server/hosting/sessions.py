"""The process's session count: capacity over both the stock and the fast path.

A stock ``/ws`` connection is one session; a fast-path connection holds as
many sessions as it opened. Slots are reserved before envs are built (all or
nothing), so the limit holds while factories run, and released when a
session closes or its connection goes away. Sessions are never reaped while
their connection is open; dead peers are found by WebSocket ping/pong.
"""

from __future__ import annotations

from ...protocol.messages import CAPACITY_REACHED, error_reply

__all__ = ["CapacityReached", "SessionTable"]


class CapacityReached(Exception):
    """No room for the requested sessions.

    Attributes:
        active: sessions open (or being opened) now.
        limit: the process's session limit.
        requested: sessions asked for.
    """

    def __init__(self, active: int, limit: int, requested: int = 1) -> None:
        self.active = active
        self.limit = limit
        self.requested = requested
        if requested == 1:
            text = f"Server at capacity: {active}/{limit} sessions active. Cannot accept new connections."
        else:
            text = f"Server at capacity: {active}/{limit} sessions active, cannot open {requested} more."
        super().__init__(text)

    def reply(self) -> dict:
        """The stock ``CAPACITY_REACHED`` error reply."""
        return error_reply(CAPACITY_REACHED, str(self), active_sessions=self.active, max_sessions=self.limit)


class SessionTable:
    """Counts the sessions of one server process against ``max_sessions``."""

    def __init__(self, max_sessions: int) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._active = 0

    @property
    def active(self) -> int:
        """Sessions open or being opened."""
        return self._active

    def reserve(self, count: int = 1) -> None:
        """Take ``count`` slots, or none.

        Raises:
            CapacityReached: fewer than ``count`` slots are free.
        """
        if self._active + count > self.max_sessions:
            raise CapacityReached(self._active, self.max_sessions, count)
        self._active += count

    def release(self, count: int = 1) -> None:
        """Give back ``count`` slots."""
        self._active -= count
        assert self._active >= 0, "released more sessions than reserved"
