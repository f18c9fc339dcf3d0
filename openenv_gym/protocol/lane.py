"""Lanes: the fast path's lockstep steps as raw frames of fixed layout.

No I/O here. A client that steps the same sessions again and again with
actions of one dtype and shape *binds* them once (a msgpack ``bind``
request); the server answers ``bound`` with a lane id and the layout of the
observations. From then on a step of every session of the lane can go as a
*raw frame*: a binary WebSocket message whose first byte is ``0xC1`` (a
byte msgpack never uses, so that a frame is raw or msgpack by its first
byte), a fixed header and the actions' bytes. The server answers a clean
step (no error, no ``info``, observations of the lane's layout) with a raw
frame too, and anything else with the ordinary msgpack ``batch`` reply for
the same request id, which says everything. ``docs/PROTOCOL.md`` (section
5.5) is the normative description.

"Lane" means only this in the package: sessions of one connection bound for
raw steps. The pool's lockstep path (:mod:`openenv_gym.vector.lockstep`)
steps on a lane where one is bound, and in msgpack where none is.

Raw step request::

    0   u8      0xC1
    1   u8      1 (step)
    2   2 bytes zero
    4   u32     lane id
    8   u64     request id
    16  n bytes resets: 1 to reset the session instead of stepping it, else 0
    pad to a multiple of 8 (zero bytes)
        n * A   the actions, in the lane's action dtype and shape (C order)

Raw batch reply::

    0   u8      0xC1
    1   u8      2 (batch)
    2   2 bytes zero
    4   u32     lane id
    8   u64     request id
    16  n * 8   reward, float64 (NaN: none)
        3n bytes done, truncated and terminated: n bytes each, 1 or 0
    pad to a multiple of 8 (zero bytes)
        n * O   the observations, in the lane's observation dtype and shape

All integers and floats are little-endian; sessions are in the lane's order.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ProtocolError
from .codec import WIRE_DTYPES

__all__ = [
    "RAW_MARK",
    "Layout",
    "Lane",
    "bind_request",
    "bound_reply",
    "parse_bind",
    "parse_bound",
    "pack_step",
    "unpack_step",
    "pack_batch",
    "pack_batch_rows",
    "RawBatch",
    "BATCH_AFTER",
    "raw_header",
]

#: The first byte of every raw frame (msgpack never uses it).
RAW_MARK = 0xC1
STEP = 1
BATCH = 2
#: A raw batch of a lane that resets (``autoreset``), followed by the reset observations of the sessions it ended.
BATCH_AFTER = 3

_HEADER = struct.Struct("<BBHIQ")  # mark, kind, 2 zero bytes, lane, request id
HEADER_SIZE = _HEADER.size  # 16

#: Request ids and session ids are ints in ``[0, MAX_ID]`` (the protocol's section 4).
MAX_ID = 2**63 - 1
_FLOAT64 = np.dtype("<f8")

#: The most dimensions of an action or observation in a lane.
MAX_LANE_NDIM = 8
#: The most bytes of one session's action or observation in a lane (a frame is bounded by the frame size limit too).
MAX_LANE_BYTES = 1 << 30


def _padded(n: int) -> int:
    return n + (-n % 8)


@dataclass(frozen=True, slots=True)
class Layout:
    """The dtype and shape of one session's value (an action or an observation) in a lane."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of one session's value."""
        return math.prod(self.shape) * self.dtype.itemsize

    def wire(self) -> dict[str, Any]:
        return {"dtype": self.dtype.str, "shape": list(self.shape)}

    @classmethod
    def read(cls, value: Any, what: str, max_bytes: int) -> "Layout":
        """A layout from its wire form ``{"dtype", "shape"}``; ``ProtocolError`` if it is not one (or over ``max_bytes`` a session)."""
        if type(value) is not dict:
            raise ProtocolError(f"{what} layout must be a map with 'dtype' and 'shape'")
        name = value.get("dtype")
        dtype = WIRE_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ProtocolError(f"{what} dtype must be one of {', '.join(WIRE_DTYPES)}")
        shape = value.get("shape")
        if type(shape) is not list or len(shape) > MAX_LANE_NDIM or any(type(d) is not int or not 0 <= d < 2**31 for d in shape):
            raise ProtocolError(f"{what} shape must be a list of at most {MAX_LANE_NDIM} ints in [0, 2**31)")
        layout = cls(dtype, tuple(shape))
        if layout.nbytes > max_bytes:
            raise ProtocolError(f"{what} of {layout.nbytes} bytes a session, limit is {max_bytes}")
        return layout


@dataclass(frozen=True, slots=True)
class Lane:
    """A bound lane: its id, sessions (in order) and layouts.

    Attributes:
        id: the lane id the server gave.
        sessions: the sessions, in the order of every raw frame's entries.
        action_field: the action field the raw actions are values of.
        action: the layout of one session's action.
        observation_field: the observation field the raw observations are values of.
        observation: the layout of one session's observation.
        autoreset: its raw steps reset each session whose step is done, as a
            step's ``autoreset`` (the reply, then a msgpack batch with ``after``).
        partial: its raw steps are ``partial`` requests: a step whose calls
            the server runs in threads is answered in msgpack parts as sessions
            finish, so that a session past the client's timeout costs only itself.
    """

    id: int
    sessions: tuple[int, ...]
    action_field: str
    action: Layout
    observation_field: str
    observation: Layout
    autoreset: bool = False
    partial: bool = False

    @property
    def step_size(self) -> int:
        """Bytes of a raw step request."""
        n = len(self.sessions)
        return _padded(HEADER_SIZE + n) + n * self.action.nbytes

    @property
    def batch_size(self) -> int:
        """Bytes of a raw batch reply."""
        n = len(self.sessions)
        return _padded(HEADER_SIZE + 11 * n) + n * self.observation.nbytes


# ---------------------------------------------------------------- bind (msgpack)


def bind_request(
    request_id: int, sessions: Sequence[int], action_field: str, action: Layout, *, autoreset: bool = False, partial: bool = False
) -> dict[str, Any]:
    """Bind ``sessions`` into a lane whose steps carry ``action_field`` values of layout ``action``.

    ``autoreset``: ask that the lane's raw steps reset the sessions they end,
    as a step's ``autoreset`` does; ``partial``: that they be ``partial``
    requests (a server grants each in its ``bound`` reply).
    """
    message = {"type": "bind", "id": request_id, "sessions": list(sessions), "action": {"field": action_field, **action.wire()}}
    if autoreset:
        message["autoreset"] = True
    if partial:
        message["partial"] = True
    return message


def parse_bind(message: dict[str, Any], max_bytes: int) -> tuple[str, Layout]:
    """The action field and layout of a checked ``bind`` request's map (its id and sessions checked already)."""
    action = message.get("action")
    if type(action) is not dict or type(action.get("field")) is not str:
        raise ProtocolError("'action' must be a map with a string 'field', a 'dtype' and a 'shape'")
    return action["field"], Layout.read(action, "action", max_bytes)


def bound_reply(
    request_id: int,
    sessions: Sequence[int],
    lane: int,
    observation_field: str,
    observation: Layout,
    *,
    autoreset: bool = False,
    partial: bool = False,
) -> dict[str, Any]:
    message = {
        "type": "bound",
        "id": request_id,
        "sessions": list(sessions),
        "lane": lane,
        "observation": {"field": observation_field, **observation.wire()},
    }
    if autoreset:
        message["autoreset"] = True
    if partial:
        message["partial"] = True
    return message


def parse_bound(message: Any, sessions: Sequence[int], action_field: str, action: Layout, max_bytes: int) -> Lane:
    """The lane a ``bound`` reply (a decoded map) grants for a ``bind`` of ``sessions``.

    Raises:
        ProtocolError: not a ``bound`` reply for these sessions.
    """
    if type(message) is not dict or message.get("type") != "bound":
        raise ProtocolError(f"expected a 'bound' reply, got {message!r:.80}")
    lane = message.get("lane")
    if type(lane) is not int or not 0 <= lane < 2**32:
        raise ProtocolError("'lane' must be an int in [0, 2**32)")
    if message.get("sessions") != list(sessions):
        raise ProtocolError("a 'bound' reply must name the sessions of its request, in order")
    observation = message.get("observation")
    if type(observation) is not dict or type(observation.get("field")) is not str:
        raise ProtocolError("'observation' must be a map with a string 'field', a 'dtype' and a 'shape'")
    layout = Layout.read(observation, "observation", max_bytes)
    autoreset, partial = message.get("autoreset", False), message.get("partial", False)
    if type(autoreset) is not bool:
        raise ProtocolError("'autoreset' must be a bool")
    if type(partial) is not bool:
        raise ProtocolError("'partial' must be a bool")
    return Lane(lane, tuple(sessions), action_field, action, observation["field"], layout, autoreset, partial)


# ---------------------------------------------------------------- raw frames


def _flag_bytes(frame: bytes | memoryview, at: int, n: int) -> bytes | None:
    """The ``n`` flag bytes of ``frame`` at ``at``; ``None`` if one is not 0 or 1.

    (Counted as bytes: numpy's reductions cost ~10x more at these sizes.)
    """
    flags = bytes(memoryview(frame)[at : at + n])
    return flags if flags.count(0) + flags.count(1) == n else None


def raw_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """``(kind, lane id, request id)`` of a raw frame; ``ProtocolError`` if it has no whole header."""
    if len(frame) < HEADER_SIZE or frame[0] != RAW_MARK:
        raise ProtocolError("a raw frame needs its 16-byte header")
    _, kind, zero, lane, request_id = _HEADER.unpack_from(frame)
    if zero or request_id > MAX_ID:
        raise ProtocolError("a raw frame's bytes 2-3 must be zero and its request id at most 2**63 - 1")
    return kind, lane, request_id


def pack_step(lane: Lane, request_id: int, actions: np.ndarray, resets: np.ndarray | None) -> bytes:
    """A raw step request: ``actions`` ``(n, *action shape)`` of the lane's action dtype, ``resets`` bool ``(n,)`` or ``None``."""
    n = len(lane.sessions)
    head = _HEADER.pack(RAW_MARK, STEP, 0, lane.id, request_id)
    flags = bytes(n) if resets is None else resets.astype(np.uint8).tobytes()
    return b"".join((head, flags, bytes(-(HEADER_SIZE + n) % 8), np.ascontiguousarray(actions, dtype=lane.action.dtype).tobytes()))


def unpack_step(lane: Lane, frame: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    """The actions ``(n, *shape)`` (a read-only view of ``frame``) and resets (bool ``(n,)``, or ``None`` if none) of a raw step for ``lane``.

    Raises:
        ProtocolError: the frame is not the size the lane's layout makes, or a reset byte is not 0 or 1.
    """
    if len(frame) != lane.step_size:
        raise ProtocolError(f"a raw step of lane {lane.id} has {lane.step_size} bytes, got {len(frame)}")
    n = len(lane.sessions)
    flags = _flag_bytes(frame, HEADER_SIZE, n)
    if flags is None:
        raise ProtocolError("a raw step's reset bytes must be 0 or 1")
    if frame[HEADER_SIZE + n : _padded(HEADER_SIZE + n)].count(0) != -(HEADER_SIZE + n) % 8:
        raise ProtocolError("a raw step's padding must be zero bytes")
    resets = None if flags.count(0) == n else np.frombuffer(flags, np.uint8).astype(np.bool_)
    action = lane.action
    values = np.frombuffer(frame, action.dtype, n * math.prod(action.shape), _padded(HEADER_SIZE + n))
    return values.reshape((n, *action.shape)), resets


def pack_batch(
    lane: Lane,
    request_id: int,
    reward: np.ndarray,
    done: np.ndarray,
    truncated: np.ndarray,
    terminated: np.ndarray,
    observation: np.ndarray,
) -> bytes:
    """A raw batch reply; ``observation`` is ``(n, *shape)`` of the lane's observation dtype."""
    n = len(lane.sessions)
    return b"".join(
        (
            _HEADER.pack(RAW_MARK, BATCH, 0, lane.id, request_id),
            np.asarray(reward, dtype=_FLOAT64).tobytes(),
            np.asarray(done, dtype=np.bool_).tobytes(),  # (a bool array's bytes are 1 and 0)
            np.asarray(truncated, dtype=np.bool_).tobytes(),
            np.asarray(terminated, dtype=np.bool_).tobytes(),
            bytes(-(HEADER_SIZE + 11 * n) % 8),
            np.ascontiguousarray(observation).tobytes(),
        )
    )


def pack_batch_rows(
    lane: Lane,
    request_id: int,
    reward: Sequence[float],
    done: bytes | bytearray,
    truncated: bytes | bytearray,
    terminated: bytes | bytearray,
    observations: Sequence[np.ndarray],
    after: Sequence[np.ndarray] | None = None,
) -> bytes:
    """A raw batch reply from one entry per session: the same bytes as :func:`pack_batch`, without stacking the columns first.

    ``done``, ``truncated`` and ``terminated`` hold one byte (1 or 0) per
    session; each of ``observations`` is an array of the lane's observation
    dtype and shape (the caller has checked). ``after`` (a lane that resets):
    the reset observations of the sessions whose ``done`` is 1, in order, of
    the same layout; the frame is then of kind :data:`BATCH_AFTER`.
    """
    n = len(lane.sessions)
    return b"".join(
        (
            _HEADER.pack(RAW_MARK, BATCH if after is None else BATCH_AFTER, 0, lane.id, request_id),
            struct.pack(f"<{n}d", *reward),
            done,
            truncated,
            terminated,
            bytes(-(HEADER_SIZE + 11 * n) % 8),
            *[o.tobytes() for o in observations],
            *[o.tobytes() for o in after or ()],
        )
    )


@dataclass(frozen=True, slots=True)
class RawBatch:
    """A raw batch reply, as received: ``id`` its request id, ``lane`` its lane id, ``frame`` its bytes (read by :meth:`columns`)."""

    id: int
    lane: int
    frame: bytes
    kind: int = BATCH

    def columns(self, lane: Lane) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """``(observation batch, reward, done)`` as a ``batch`` reply has them, read-only views of the frame.

        The observation batch has the lane's observation field and the
        ``truncated`` and ``terminated`` columns (bool ``(n,)``).

        Raises:
            ProtocolError: the frame is not of ``lane``, not the size its layout
                makes, or has a flag byte other than 1 or 0.
        """
        frame, n = self.frame, len(lane.sessions)
        size = lane.batch_size
        if self.lane != lane.id or len(frame) < size:
            raise ProtocolError(f"a raw batch of lane {lane.id} has {size} bytes, got {len(frame)} for lane {self.lane}")
        flags_at = HEADER_SIZE + 8 * n
        if _flag_bytes(frame, flags_at, 3 * n) is None:
            raise ProtocolError("a raw batch's flag bytes must be 1 or 0")
        flags = np.frombuffer(frame, np.bool_, 3 * n, flags_at)
        done, truncated, terminated = flags[:n], flags[n : 2 * n], flags[2 * n :]
        if self.kind == BATCH_AFTER:  # (the reset observations of the ended sessions follow)
            if not lane.autoreset:
                raise ProtocolError(f"a raw batch with resets for lane {lane.id}, which does not reset")
            size += (n - bytes(done).count(0)) * lane.observation.nbytes
        if len(frame) != size:
            raise ProtocolError(f"a raw batch of lane {lane.id} has {size} bytes, got {len(frame)}")
        reward = np.frombuffer(frame, _FLOAT64, n, HEADER_SIZE)
        layout = lane.observation
        observation = np.frombuffer(frame, layout.dtype, n * math.prod(layout.shape), _padded(HEADER_SIZE + 11 * n))
        fields = {lane.observation_field: observation.reshape((n, *layout.shape)), "truncated": truncated, "terminated": terminated}
        return fields, reward, done

    def after(self, lane: Lane, done: np.ndarray) -> np.ndarray | None:
        """The reset observations ``(k, *shape)`` of the ``k`` sessions ``done`` (from :meth:`columns`), or ``None`` for a plain batch."""
        if self.kind != BATCH_AFTER:
            return None
        layout, k = lane.observation, int(np.count_nonzero(done))
        return np.frombuffer(self.frame, layout.dtype, k * math.prod(layout.shape), lane.batch_size).reshape((k, *layout.shape))
