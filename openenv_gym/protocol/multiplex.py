"""The fast path: many sessions per connection, msgpack frames, request ids.

No I/O here. A client offers the WebSocket subprotocol :data:`SUBPROTOCOL`;
a server that selects it speaks this protocol on the connection instead of the
stock one. ``docs/PROTOCOL.md`` is the normative description; this module is
its implementation, shared by the server, the session client and the pool.

Every client request carries an ``id`` (an int chosen by the client, unique
among its requests in flight on the connection) and every reply names it, so
several requests may be in flight at once. Requests address server-side
sessions by the ints the server handed out in ``opened``.

Values for several sessions travel as *columns*: a column is either a numpy
array whose leading axis runs over the request's sessions, or a list with one
entry per session. A *batch* is a dict from field name to column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ProtocolError
from .kinds import FAST_KINDS, RequestKind
from .lane import MAX_ID, MAX_LANE_BYTES, Layout, parse_bind
from .messages import MAX_ECHO, UNKNOWN_TYPE, VALIDATION_ERROR, ErrorReply, bounded_message

__all__ = [
    "SUBPROTOCOL",
    "MAX_ID",
    "Column",
    "stack_column",
    "column_length",
    "column_item",
    "open_request",
    "reset_batch_request",
    "step_batch_request",
    "state_batch_request",
    "close_batch_request",
    "OpenedReply",
    "BatchReply",
    "AfterReset",
    "after_reset",
    "StatesReply",
    "ClosedReply",
    "BoundReply",
    "FastErrorReply",
    "FastReply",
    "parse_fast_reply",
    "FastRequest",
    "parse_fast_request",
    "opened_reply",
    "batch_reply",
    "part_reply",
    "states_reply",
    "closed_reply",
    "fast_error_reply",
    "FastRequestError",
]

#: The WebSocket subprotocol name of this protocol, version 1.
SUBPROTOCOL = "openenv.msgpack.v1"


Column = np.ndarray | list

_SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64}


def stack_column(values: Sequence[Any]) -> Column:
    """Stack one value per session into a column.

    numpy arrays of one shape and dtype become one array with a leading axis;
    Python bools, ints (within int64) or floats of one type become a 1-D
    array; anything else stays a list.
    """
    if not values:
        return []
    first = values[0]
    kind = type(first)
    if kind is np.ndarray:
        shape, dtype = first.shape, first.dtype
        for v in values:
            if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
                return list(values)
        return np.array(values, dtype=dtype)  # (same shapes, checked: cheaper than np.stack)
    if isinstance(first, np.generic):
        dtype = first.dtype
        for v in values:
            if not isinstance(v, np.generic) or v.dtype != dtype:
                return list(values)
        return np.array(values, dtype=dtype)
    dtype = _SCALAR_DTYPES.get(kind)
    if dtype is not None:
        for v in values:
            if type(v) is not kind:
                return list(values)
        try:
            return np.array(values, dtype=dtype)
        except OverflowError:  # (ints beyond int64: msgpack carries those up to 2**64 - 1 one by one)
            return list(values)
    return list(values)


def column_length(column: Any) -> int:
    """Entries in a column; ``ProtocolError`` if it is not a column."""
    if type(column) is list:
        return len(column)
    if isinstance(column, np.ndarray) and column.ndim >= 1:
        return column.shape[0]
    raise ProtocolError(f"a column must be a list or an array with a leading axis, got {type(column).__name__}")


def column_item(column: Column, index: int) -> Any:
    """The entry of session ``index`` in a column (an array row is a view)."""
    return column[index]


def _check_batch(batch: Any, n: int, what: str) -> dict[str, Column]:
    if type(batch) is not dict:
        raise ProtocolError(f"{what} must be a map of columns")
    for name, column in batch.items():
        if column_length(column) != n:
            raise ProtocolError(f"{what} column {name!r:.60} has {column_length(column)} entries for {n} sessions")
    return batch


def _check_id(value: Any, what: str = "id") -> int:
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise ProtocolError(f"{what} must be an int in [0, 2**63), got {value!r:.60}")
    return value


def _check_sessions(value: Any) -> list[int]:
    if type(value) is not list:
        raise ProtocolError("'sessions' must be a list of session ids")
    if value and not (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_ID):
        for sid in value:
            _check_id(sid, "session id")  # names the first bad one
    return value


# ---------------------------------------------------------------- client side


def open_request(request_id: int, count: int) -> dict[str, Any]:
    """Open ``count`` new sessions on this connection."""
    return {"type": "open", "id": request_id, "count": count}


def reset_batch_request(
    request_id: int,
    sessions: Sequence[int],
    seeds: Sequence[int | None] | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    partial: bool = False,
) -> dict[str, Any]:
    """Reset ``sessions``; ``seeds`` has one entry per session (or is ``None``).

    ``options`` are extra reset keyword arguments given to every session.
    ``partial``: the results may come in several ``batch`` replies, as sessions finish.
    """
    message: dict[str, Any] = {"type": "reset", "id": request_id, "sessions": list(sessions)}
    if seeds is not None:
        # msgpack's ints end at 2**64 - 1; a larger seed (NumPy's SeedSequence entropy is 128 bits) goes as decimal text.
        # (a bool is a seed to Gymnasium, True as 1: sent as the int it is)
        message["seeds"] = [str(s) if s is not None and s >= _MSGPACK_INT_END else None if s is None else int(s) for s in seeds]
    if options:
        message["options"] = dict(options)
    if partial:
        message["partial"] = True
    return message


def step_batch_request(
    request_id: int,
    sessions: Sequence[int],
    actions: Mapping[str, Column],
    resets: np.ndarray | None = None,
    *,
    partial: bool = False,
    autoreset: bool = False,
) -> dict[str, Any]:
    """Step ``sessions``; ``actions`` is a batch of action fields, one entry per session.

    ``resets`` (bool ``(n,)``, optional) marks sessions to reset (no seed, no
    options) instead of stepping; their actions are ignored. This is how a
    pool's next-step autoreset shares one frame with the steps of the others.
    ``partial``: the results may come in several ``batch`` replies, as sessions finish.
    ``autoreset``: a session whose step ends its episode (``done``) is reset
    right after it (no seed, no options), and the reply carries that reset's
    results too (:class:`AfterReset`): same-step autoreset in one round trip.
    A server that does not know the flag ignores it, and resets nothing.
    """
    message: dict[str, Any] = {"type": "step", "id": request_id, "sessions": list(sessions), "actions": dict(actions)}
    if resets is not None and resets.any():
        message["resets"] = np.asarray(resets, dtype=np.bool_)
    if partial:
        message["partial"] = True
    if autoreset:
        message["autoreset"] = True
    return message


def state_batch_request(request_id: int, sessions: Sequence[int]) -> dict[str, Any]:
    """Ask for the state of ``sessions``."""
    return {"type": "state", "id": request_id, "sessions": list(sessions)}


def close_batch_request(request_id: int, sessions: Sequence[int]) -> dict[str, Any]:
    """Close ``sessions``; the connection stays open."""
    return {"type": "close", "id": request_id, "sessions": list(sessions)}


@dataclass(frozen=True, slots=True)
class OpenedReply:
    """Sessions opened: their ids, in the server's numbering for this connection."""

    id: int
    sessions: list[int]


@dataclass(frozen=True, slots=True)
class AfterReset:
    """The resets an ``autoreset`` step made after the steps that ended their episodes.

    Attributes:
        rows: int64 ``(k,)``, the positions (in the reply's ``sessions``) of the sessions reset.
        observation: batch of the resets' observation fields (``k`` entries a column).
        metadata: ``k`` dicts (the reset infos), or ``None`` when all are empty.
        errors: ``None``, or ``k`` entries: ``None`` or the :class:`ErrorReply` of a reset that failed.
    """

    rows: np.ndarray
    observation: dict[str, Column]
    metadata: list[dict[str, Any]] | None
    errors: list[ErrorReply | None] | None


@dataclass(frozen=True, slots=True)
class BatchReply:
    """Results of a reset or step of several sessions.

    Attributes:
        id: the request id.
        sessions: the sessions, in the request's order.
        observation: batch of observation fields (each column has ``len(sessions)`` entries).
        reward: float64 array of shape ``(n,)``; NaN where the env gave no reward.
        done: bool array of shape ``(n,)``.
        metadata: one dict per session, or ``None`` when all are empty.
        errors: ``None``, or one entry per session: ``None`` or an :class:`ErrorReply`
            for a session whose reset/step failed (its other entries are filler).
        part: for one part of a ``partial`` request's results, int64 ``(n,)``:
            the positions of ``sessions`` in the request; ``None`` for the whole.
        last: whether this reply is the request's last (always, without ``part``).
        after: for an ``autoreset`` step, the resets that followed episode ends; else ``None``.
    """

    id: int
    sessions: list[int]
    observation: dict[str, Column]
    reward: np.ndarray
    done: np.ndarray
    metadata: list[dict[str, Any]] | None
    errors: list[ErrorReply | None] | None
    part: np.ndarray | None = None
    last: bool = True
    after: AfterReset | None = None


@dataclass(frozen=True, slots=True)
class BoundReply:
    """Sessions bound into a lane; ``message`` is the reply's map, read by :func:`~openenv_gym.protocol.lane.parse_bound`."""

    id: int
    sessions: list[int]
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StatesReply:
    """States of several sessions, one dict each."""

    id: int
    sessions: list[int]
    states: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ClosedReply:
    """Sessions closed."""

    id: int
    sessions: list[int]


@dataclass(frozen=True, slots=True)
class FastErrorReply:
    """A request failed as a whole. ``id`` is ``None`` if the request could not be read."""

    id: int | None
    error: ErrorReply


FastReply = OpenedReply | BatchReply | StatesReply | ClosedReply | BoundReply | FastErrorReply


def _error(data: Any) -> ErrorReply:
    if type(data) is not dict or type(data.get("code")) is not str:
        raise ProtocolError("error entry must be a map with a string 'code'")
    return ErrorReply(data["code"], str(data.get("message", "")), data)


_LIST_ITEMS = {np.bool_: ((bool, int), "booleans"), np.float64: ((bool, int, float, type(None)), "numbers")}


def _flag_array(value: Any, n: int, dtype: Any, what: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    elif type(value) is list:
        # Only the types of the array form: numpy would also read "false" as True and b"1" as 1.0.
        allowed, kind = _LIST_ITEMS[dtype]
        if not all(type(v) in allowed for v in value):
            raise ProtocolError(f"'{what}' must hold {kind}")
        if dtype is np.bool_ and not all(v is True or v is False or v == 0 or v == 1 for v in value):
            raise ProtocolError(f"'{what}' must hold booleans (or 1 and 0)")
        try:
            array = np.array([math.nan if v is None else v for v in value], dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            raise ProtocolError(f"'{what}' must hold {kind} (one is out of range)") from None
    else:
        raise ProtocolError(f"'{what}' must be an array or a list")
    if array.shape != (n,):
        raise ProtocolError(f"'{what}' has shape {array.shape} for {n} sessions")
    if array.dtype != dtype:
        if dtype is np.bool_ and (array.dtype.kind not in "bui" or np.count_nonzero((array != 0) & (array != 1))):
            raise ProtocolError(f"'{what}' must be booleans (or 1 and 0)")
        if dtype is np.float64 and array.dtype.kind not in "buif":
            raise ProtocolError(f"'{what}' must be numbers")
        array = array.astype(dtype)
    return array


def _env_values(value: dict[str, Any]) -> dict[str, Any]:
    """Make the arrays that are values of ``value`` or of its dicts what an env's info holds, in place.

    In metadata, a numpy scalar that is a value of a map travels as a 0-d
    array (``docs/PROTOCOL.md``, 3.1): each 0-d array becomes the numpy
    scalar it carries, so that an ``info`` arrives with the types the env
    gave it (``np.float32(0.5)``, not ``0.5``). Other arrays are decoded as
    read-only views of the frame: they are copied, writeable as an env's own,
    in lists too (whose items, and their dicts' values, are never scalars
    carried as arrays). The decoder has bounded the depth; the maps and lists
    are the decoder's own, so they are changed in place.
    """
    for k, v in value.items():
        t = type(v)
        if t is dict:
            _env_values(v)
        elif t is list:
            _writeable_arrays(v)
        elif t is np.ndarray:  # (a value replaced, no key added: safe while iterating)
            if v.ndim == 0:
                value[k] = v[()]
            elif not v.flags.writeable:
                value[k] = v.copy()
    return value


_CONTAINERS = frozenset({dict, list, np.ndarray})


def _writeable_arrays(container: list[Any] | dict[str, Any]) -> None:
    """Copy each read-only array in ``container`` (a list, or a dict in one) and in its lists and dicts, in place."""
    if type(container) is dict:
        entries: Any = container.items()
    elif _CONTAINERS.isdisjoint(map(type, container)):  # (a list of numbers: looked at in C, not item by item)
        return
    else:
        entries = enumerate(container)
    for k, v in entries:  # (a value replaced, no key added: safe while iterating)
        t = type(v)
        if t is list or t is dict:
            _writeable_arrays(v)
        elif t is np.ndarray and not v.flags.writeable:
            container[k] = v.copy()


def _metadata(metadata: Any, n: int) -> list[dict[str, Any]] | None:
    if metadata is None:
        return None
    if type(metadata) is not list or len(metadata) != n or any(type(m) is not dict for m in metadata):
        raise ProtocolError("'metadata' must be a list of maps, one per session")
    return [_env_values(m) if m else m for m in metadata]


def _errors(errors: Any, n: int) -> list[ErrorReply | None] | None:
    if errors is None:
        return None
    if type(errors) is not list or len(errors) != n:
        raise ProtocolError("'errors' must be a list with one entry per session")
    return [None if e is None else _error(e) for e in errors]


def _after_reset(after: Any, done: np.ndarray, errors: list[ErrorReply | None] | None) -> AfterReset:
    """Check a reply's ``after``: resets of sessions whose step in this reply is ``done`` (or failed), each once."""
    if type(after) is not dict:
        raise ProtocolError("'after' must be a map")
    rows = after.get("rows")
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ProtocolError("'after' needs 'rows', an int array")
    k = rows.shape[0]
    if k:
        rows = rows.astype(np.int64)
        if rows.min() < 0 or rows.max() >= done.shape[0] or len(set(rows.tolist())) != k:
            raise ProtocolError("'after' rows must name sessions of the reply whose step is done, each once")
        ended = done[rows]
        if not ended.all() and (errors is None or any(errors[r] is None for r in rows[~ended].tolist())):
            raise ProtocolError("'after' rows must name sessions of the reply whose step is done, each once")
    observation = _check_batch(after.get("observation"), k, "after observation")
    return AfterReset(rows.astype(np.int64), observation, _metadata(after.get("metadata"), k), _errors(after.get("errors"), k))


def parse_fast_reply(message: Any) -> FastReply:
    """Check a decoded fast-path server message and turn it into a :data:`FastReply`.

    Raises:
        ProtocolError: anything that does not match the protocol.
    """
    if type(message) is not dict:
        raise ProtocolError(f"reply must be a map, got {type(message).__name__}")
    kind = message.get("type")
    if type(kind) is not str:  # an array would not even compare with ==
        raise ProtocolError(f"reply 'type' must be a string, got {type(kind).__name__}")
    if kind == "error":
        rid = message.get("id")
        if rid is not None:
            _check_id(rid)
        return FastErrorReply(rid, _error(message.get("data")))
    rid = _check_id(message.get("id"))
    sessions = _check_sessions(message.get("sessions"))
    n = len(sessions)
    if kind == "batch":
        observation = _check_batch(message.get("observation"), n, "observation")
        reward = _flag_array(message.get("reward"), n, np.float64, "reward")
        done = _flag_array(message.get("done"), n, np.bool_, "done")
        metadata = _metadata(message.get("metadata"), n)
        errors = _errors(message.get("errors"), n)
        after = message.get("after")
        if after is not None:
            after = _after_reset(after, done, errors)
        part = message.get("part")
        if part is None:
            return BatchReply(rid, sessions, observation, reward, done, metadata, errors, after=after)
        if not isinstance(part, np.ndarray) or part.shape != (n,) or part.dtype.kind not in "iu":
            raise ProtocolError("'part' must be an int array with one entry per session")
        last = message.get("last")
        if type(last) is not bool:
            raise ProtocolError("a reply with 'part' needs a bool 'last'")
        return BatchReply(rid, sessions, observation, reward, done, metadata, errors, part.astype(np.int64), last, after)
    if kind == "opened":
        return OpenedReply(rid, sessions)
    if kind == "states":
        states = message.get("states")
        if type(states) is not list or len(states) != n or any(type(s) is not dict for s in states):
            raise ProtocolError("'states' must be a list of maps, one per session")
        return StatesReply(rid, sessions, states)
    if kind == "closed":
        return ClosedReply(rid, sessions)
    if kind == "bound":
        return BoundReply(rid, sessions, message)
    raise ProtocolError(f"unknown reply type {kind!r:.60}")


# ---------------------------------------------------------------- server side


#: the longest ``episode_id`` reset option a server accepts, in characters.
MAX_EPISODE_ID = 256

#: The longest seed, in decimal digits, sent as text (a seed of 2**64 or more; 1,000 digits is ~3,300 bits).
MAX_SEED_DIGITS = 1000
_MSGPACK_INT_END = 2**64


class FastRequestError(Exception):
    """A request the server answers with an error reply; the connection stays usable.

    Attributes:
        id: the request id, if it could be read.
        code: a stock error code (``VALIDATION_ERROR``, ``UNKNOWN_TYPE``, ...).
    """

    def __init__(self, request_id: int | None, code: str, message: str) -> None:
        super().__init__(message)
        self.id = request_id
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class FastRequest:
    """A checked fast-path request.

    Attributes:
        type: what the request asks for (``OPEN``, ``RESET``, ``STEP``, ``STATE``, ``CLOSE`` or ``BIND``).
        id: the request id.
        sessions: the addressed sessions (``[]`` for ``open``).
        count: sessions to open (``open`` only).
        seeds: one seed or ``None`` per session (``reset`` only), or ``None``.
        options: extra reset keyword arguments (``reset`` only).
        actions: batch of action fields (``step`` only).
        resets: bool ``(n,)``: sessions to reset instead of step (``step`` only), or ``None``.
        partial: the client takes the results in parts (``reset`` and ``step``; for ``bind``, the lane's raw steps).
        autoreset: reset each session whose step is done right after it (``step``; for ``bind``, the lane's raw steps).
        bind: the action field and layout of a lane (``bind`` only; see :mod:`.lane`).
    """

    type: RequestKind
    id: int
    sessions: list[int]
    count: int = 0
    seeds: list[int | None] | None = None
    options: dict[str, Any] | None = None
    actions: dict[str, Column] | None = None
    resets: np.ndarray | None = None
    partial: bool = False
    bind: tuple[str, Layout] | None = None
    autoreset: bool = False


def parse_fast_request(message: Any, *, max_count: int) -> FastRequest:
    """Check a decoded client message.

    Raises:
        FastRequestError: ``UNKNOWN_TYPE`` or ``VALIDATION_ERROR``, naming the request id when known.
    """
    if type(message) is not dict:
        raise FastRequestError(None, VALIDATION_ERROR, "request must be a map")
    rid = message.get("id")
    if type(rid) is not int or not 0 <= rid <= MAX_ID:
        raise FastRequestError(None, VALIDATION_ERROR, "request needs an int 'id' in [0, 2**63)")
    kind = message.get("type")
    if type(kind) is not str:  # an array would not even compare with ==
        raise FastRequestError(rid, UNKNOWN_TYPE, f"Unknown message type: {kind!r:.40}")
    try:
        if kind == RequestKind.OPEN:
            count = message.get("count")
            if type(count) is not int or not 1 <= count <= max_count:
                raise ProtocolError(f"'count' must be an int in [1, {max_count}]")
            return FastRequest(RequestKind.OPEN, rid, [], count=count)
        if kind not in FAST_KINDS:
            # (the stock path's bound on what an error echoes: a 1 MB type must not make a 1 MB reply)
            raise FastRequestError(
                rid, UNKNOWN_TYPE, f"Unknown message type: {kind if len(kind) <= MAX_ECHO else kind[: MAX_ECHO - 3] + '...'}"
            )
        sessions = _check_sessions(message.get("sessions"))
        if len(set(sessions)) != len(sessions):
            raise ProtocolError("'sessions' lists a session twice")
        n = len(sessions)
        kind = RequestKind(kind)
        if kind == RequestKind.RESET:
            seeds = message.get("seeds")
            if seeds is not None:
                if type(seeds) is not list or len(seeds) != n:
                    raise ProtocolError("'seeds' must be a list with one entry per session")
                for i, s in enumerate(seeds):
                    if type(s) is str and 0 < len(s) <= MAX_SEED_DIGITS and s.isascii() and s.isdigit():
                        seeds[i] = s = int(s)
                    if s is not None and (type(s) is not int or s < 0):
                        raise ProtocolError(
                            f"a seed must be a non-negative int, its decimal digits (at most {MAX_SEED_DIGITS}) or nil, got {s!r:.60}"
                        )
            options = message.get("options")
            if options is not None and type(options) is not dict:
                raise ProtocolError("'options' must be a map")
            episode_id = None if options is None else options.get("episode_id")
            if episode_id is not None and not (type(episode_id) is str and len(episode_id) <= MAX_EPISODE_ID):
                # Every session's state echoes it: bounded, so that one request cannot make n huge replies.
                raise ProtocolError(f"'episode_id' must be a string of at most {MAX_EPISODE_ID} characters")
            return FastRequest(RequestKind.RESET, rid, sessions, seeds=seeds, options=options, partial=_partial(message))
        if kind == RequestKind.STEP:
            actions = _check_batch(message.get("actions"), n, "actions")
            resets = message.get("resets")
            if resets is not None:
                resets = _flag_array(resets, n, np.bool_, "resets")
            return FastRequest(
                RequestKind.STEP, rid, sessions, actions=actions, resets=resets, partial=_partial(message), autoreset=_autoreset(message)
            )
        if kind == RequestKind.BIND:
            if not sessions:
                raise ProtocolError("a lane needs at least one session")
            return FastRequest(
                RequestKind.BIND,
                rid,
                sessions,
                bind=parse_bind(message, MAX_LANE_BYTES),
                autoreset=_autoreset(message),
                partial=_partial(message),
            )
        return FastRequest(kind, rid, sessions)
    except ProtocolError as exc:
        raise FastRequestError(rid, VALIDATION_ERROR, str(exc)) from None


def _autoreset(message: dict[str, Any]) -> bool:
    autoreset = message.get("autoreset", False)
    if type(autoreset) is not bool:
        raise ProtocolError("'autoreset' must be a bool")
    return autoreset


def _partial(message: dict[str, Any]) -> bool:
    partial = message.get("partial", False)
    if type(partial) is not bool:
        raise ProtocolError("'partial' must be a bool")
    return partial


def opened_reply(request_id: int, sessions: Sequence[int]) -> dict[str, Any]:
    return {"type": "opened", "id": request_id, "sessions": list(sessions)}


def batch_reply(
    request_id: int,
    sessions: Sequence[int],
    observation: Mapping[str, Column],
    reward: np.ndarray,
    done: np.ndarray,
    metadata: Sequence[Mapping[str, Any]] | None = None,
    errors: Sequence[Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """A ``batch`` reply. ``reward`` is float64 ``(n,)`` (NaN for none), ``done`` bool ``(n,)``.

    ``metadata`` is dropped when every entry is empty; ``errors`` entries are
    ``{"code", "message"}`` maps or ``None``.
    """
    message: dict[str, Any] = {
        "type": "batch",
        "id": request_id,
        "sessions": list(sessions),
        "observation": dict(observation),
        "reward": np.asarray(reward, dtype=np.float64),
        "done": np.asarray(done, dtype=np.bool_),
    }
    if metadata is not None and any(metadata):
        message["metadata"] = [dict(m) for m in metadata]
    if errors is not None and any(e is not None for e in errors):
        message["errors"] = list(errors)
    return message


def after_reset(
    rows: Sequence[int],
    observation: Mapping[str, Column],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    errors: Sequence[Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """A ``batch`` reply's ``after`` map: the resets that followed the steps at positions ``rows``."""
    message: dict[str, Any] = {"rows": np.asarray(rows, dtype=np.int64), "observation": dict(observation)}
    if metadata is not None and any(metadata):
        message["metadata"] = [dict(m) for m in metadata]
    if errors is not None and any(e is not None for e in errors):
        message["errors"] = list(errors)
    return message


def part_reply(batch: dict[str, Any], positions: Sequence[int], last: bool) -> dict[str, Any]:
    """``batch`` (a :func:`batch_reply` for some of a request's sessions) as one part of a ``partial`` request.

    ``positions``: where those sessions stand in the request's ``sessions``.
    """
    batch["part"] = np.asarray(positions, dtype=np.int64)
    batch["last"] = bool(last)
    return batch


def states_reply(request_id: int, sessions: Sequence[int], states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"type": "states", "id": request_id, "sessions": list(sessions), "states": [dict(s) for s in states]}


def closed_reply(request_id: int, sessions: Sequence[int]) -> dict[str, Any]:
    return {"type": "closed", "id": request_id, "sessions": list(sessions)}


def fast_error_reply(request_id: int | None, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """An ``error`` reply for request ``request_id`` (``None`` if unreadable); its message at most ``MAX_ERROR_MESSAGE`` characters."""
    return {"type": "error", "id": request_id, "data": {"message": bounded_message(message), "code": code, **extra}}
