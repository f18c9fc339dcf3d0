"""Request kinds: the ``type`` of a client's request, on the stock protocol and the fast path. No I/O.

A :class:`RequestKind` is a ``str``: it equals, hashes, prints and encodes as
its wire value (``RequestKind.RESET == "reset"``), so parsed requests carry
one and the code that answers them compares against names, not strings.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RequestKind", "STOCK_KINDS", "FAST_KINDS"]


class RequestKind(StrEnum):
    """What a request asks for; the value is the message's ``type`` on the wire."""

    OPEN = "open"  # fast path only: open sessions on the connection
    RESET = "reset"
    STEP = "step"
    STATE = "state"
    CLOSE = "close"
    BIND = "bind"  # fast path only: bind sessions into a lane (see .lane)


#: The kinds a stock OpenEnv ``/ws`` client sends (``docs/PROTOCOL.md``, the stock messages).
STOCK_KINDS = (RequestKind.RESET, RequestKind.STEP, RequestKind.STATE, RequestKind.CLOSE)

#: The kinds of the fast path (``openenv.msgpack.v1``).
FAST_KINDS = (RequestKind.OPEN, *STOCK_KINDS, RequestKind.BIND)
