"""Splitting a client's byte stream into WebSocket frames, without I/O.

The fast-path server reads whole binary messages straight from the stream:
one frame that is final, binary, masked and has no extension bits is unmasked
and handed over as is. Every other frame (control frames, text, fragments,
compressed frames, anything malformed) is handed over as raw bytes, whole,
for websockets' own protocol to parse, so that the protocol is only ever fed
complete frames and its parser always stands at a frame boundary.

A frame longer than ``max_size`` is not buffered: the rest of the stream is
handed to the protocol, which fails the connection with close code 1009.
"""

from __future__ import annotations

from dataclasses import dataclass

from websockets.frames import apply_mask

__all__ = ["FrameSplitter", "Message", "Raw"]

_PING_PONG = (0x89, 0x8A)  # FIN, no RSV bits, ping / pong


@dataclass(slots=True)
class Message:
    """A whole binary message read on the fast path (payload unmasked)."""

    payload: bytes


@dataclass(slots=True)
class Raw:
    """Bytes for websockets' protocol: one or more whole frames, or the failing rest of the stream.

    ``control``: one ping or pong frame, which may be processed ahead of the
    messages before it (it changes nothing about them).
    """

    data: bytes
    control: bool = False


class FrameSplitter:
    """Splits what a client sends into :class:`Message` and :class:`Raw` pieces.

    Args:
        max_size: the largest payload accepted, in bytes.
    """

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._chunks: list[bytes] = []  # a partial frame
        self._size = 0  # bytes in _chunks
        self._need = 0  # bytes the partial frame needs in all, when its header is known
        self._failed = False  # past an oversized frame: everything goes to the protocol

    def feed(self, data: bytes, fast: bool) -> list[Message | Raw]:
        """Split ``data`` (appended to what is buffered) into whole pieces; keep the partial rest.

        ``fast`` says whether binary frames may be read on the fast path now
        (the connection is open and no fragmented message is in progress).
        """
        if self._failed:
            return [Raw(data)]
        if self._chunks:  # joined once the frame is complete: linear in its size
            self._chunks.append(data)
            self._size += len(data)
            if self._size < self._need:
                return []
            buf = b"".join(self._chunks)
            self._chunks, self._size, self._need = [], 0, 0
        else:
            buf = data
        out: list[Message | Raw] = []
        at, end = 0, len(buf)
        raw_from: int | None = None  # where a run of frames for the protocol began
        while end - at >= 2:
            first, second = buf[at], buf[at + 1]
            length = second & 0x7F
            head = at + 2
            if length == 126:
                if end - at < 4:
                    break
                length = int.from_bytes(buf[at + 2 : at + 4], "big")
                head = at + 4
            elif length == 127:
                if end - at < 10:
                    break
                length = int.from_bytes(buf[at + 2 : at + 10], "big")
                head = at + 10
            if length > self.max_size or not second & 0x80:
                # Let the protocol fail the connection (1009 too big, 1002 unmasked).
                self._failed = True
                out.append(Raw(buf[at if raw_from is None else raw_from :]))
                return out
            stop = head + 4 + length
            if stop > end:
                self._need = stop - at
                break
            if raw_from is None:
                if fast and first == 0x82:  # FIN, no RSV bits, binary
                    out.append(Message(apply_mask(buf[head + 4 : stop], buf[head : head + 4])))
                elif first in _PING_PONG:
                    out.append(Raw(buf[at:stop], control=True))
                else:
                    # This frame, and every whole frame after it in this chunk, go to the
                    # protocol in one piece: it may start a fragmented message or a close.
                    raw_from = at
            at = stop
        if raw_from is not None:
            out.append(Raw(buf[raw_from:at]))
        if at < end:
            rest = buf[at:]
            self._chunks, self._size = [rest], len(rest)
        return out

    @property
    def buffered(self) -> int:
        """Bytes of a partial frame held back, waiting for the rest."""
        return self._size
