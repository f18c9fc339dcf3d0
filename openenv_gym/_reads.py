"""How many bytes a socket read asks for at once.

asyncio's socket transports read with ``sock.recv(256 KiB)``: CPython allocates
a bytes object of that size and shrinks it to what arrived. Above glibc's mmap
threshold (128 KiB by default) that costs a map and an unmap, ~10 us a read
whatever arrived: 12.7 us to read a 900-byte message, against 1.2 us asking
for 64 KiB (2-core Intel Xeon VM, Python 3.11.7). A lockstep step's frames are
~1 KiB; a large frame just takes more reads.
"""

from __future__ import annotations

import asyncio

__all__ = ["READ_SIZE", "read_in_chunks"]

#: Bytes asked for by one read of a socket.
READ_SIZE = 64 * 1024


def read_in_chunks(transport: asyncio.BaseTransport) -> None:
    """Make ``transport`` read :data:`READ_SIZE` bytes at a time (asyncio's socket transports; others are left as they are)."""
    if isinstance(getattr(type(transport), "max_size", None), int):  # (the class attribute asyncio's transports read by)
        transport.max_size = READ_SIZE  # type: ignore[attr-defined]
