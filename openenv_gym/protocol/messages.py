"""Messages of the stock OpenEnv ``/ws`` protocol (openenv 0.10.0), built and parsed.

No I/O here. One WebSocket connection is one server-side environment session;
one request is in flight at a time and replies carry no request id.

Client to server::

    {"type": "reset", "data": {"seed": 3, ...reset kwargs}}
    {"type": "step",  "data": {...action fields}}
    {"type": "state"}
    {"type": "close"}

Server to client::

    {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d, "metadata"?: {...}}}
    {"type": "state", "data": {...}}
    {"type": "error", "data": {"code": "...", "message": "...", ...}}

Error codes after which the server keeps the socket open: ``INVALID_JSON``,
``UNKNOWN_TYPE``, ``VALIDATION_ERROR``, ``EXECUTION_ERROR``. After
``CAPACITY_REACHED``, ``FACTORY_ERROR`` and ``SESSION_ERROR`` it closes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import CapacityError, ProtocolError, ServerError
from .kinds import STOCK_KINDS, RequestKind

__all__ = [
    "INVALID_JSON",
    "UNKNOWN_TYPE",
    "VALIDATION_ERROR",
    "EXECUTION_ERROR",
    "CAPACITY_REACHED",
    "FACTORY_ERROR",
    "SESSION_ERROR",
    "CLOSING_CODES",
    "StepReply",
    "StateReply",
    "ErrorReply",
    "Reply",
    "reset_request",
    "check_reset_options",
    "step_request",
    "state_request",
    "close_request",
    "parse_reply",
    "observation_reply",
    "state_reply",
    "error_reply",
    "Request",
    "parse_request",
    "reply_error",
]

INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
FACTORY_ERROR = "FACTORY_ERROR"
SESSION_ERROR = "SESSION_ERROR"

#: Error codes after which a stock server closes the connection.
CLOSING_CODES = frozenset({CAPACITY_REACHED, FACTORY_ERROR, SESSION_ERROR})


# ---------------------------------------------------------------- replies


@dataclass(frozen=True, slots=True)
class StepReply:
    """The server's answer to ``reset`` or ``step``.

    Attributes:
        observation: the observation's fields, as sent (stock servers include a
            ``metadata`` field here too).
        reward: the reward, ``None`` when the server sent none (typical after reset).
        done: whether the episode ended.
        metadata: the observation's metadata (``{}`` when absent).
    """

    observation: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StateReply:
    """The server's answer to ``state``: the environment's state fields."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error message from the server.

    Attributes:
        code: one of the codes above (servers may send others).
        message: human-readable text.
        data: the whole ``data`` object, including extras.
    """

    code: str
    message: str
    data: dict[str, Any]

    @property
    def closes_connection(self) -> bool:
        """Whether a stock server closes the socket after this error."""
        return self.code in CLOSING_CODES

    def exception(self, url: str | None = None) -> ServerError:
        """The exception that stands for this error."""
        cls = CapacityError if self.code == CAPACITY_REACHED else ServerError
        message = self.message
        errors = self.data.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            # Stock VALIDATION_ERROR replies carry pydantic's errors; show the first.
            first = errors[0]
            where = ".".join(str(p) for p in first.get("loc", ()) if p is not None)
            message = f"{message}: {where + ': ' if where else ''}{first.get('msg', '')}"
            if len(errors) > 1:
                message += f" (and {len(errors) - 1} more)"
        return cls(self.code, message, data=self.data, url=url)


Reply = StepReply | StateReply | ErrorReply


# ---------------------------------------------------------------- client side


def reset_request(seed: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """A ``reset`` request. ``seed`` (if given) and ``kwargs`` go in ``data``.

    Stock servers pass to the environment's ``reset`` only the keys its
    signature accepts, and drop the others silently.
    """
    data: dict[str, Any] = dict(kwargs)
    if seed is not None:
        data["seed"] = int(seed)  # (a bool is a seed to Gymnasium, True as 1: sent as the int it is)
    return {"type": "reset", "data": data}


#: Levels of the request around a reset's options: the message, and the map that holds them.
_OPTIONS_LEVEL = 2

#: msgpack's integers: int64 and uint64.
_MSGPACK_INTS = (-(2**63), 2**64)


def check_reset_options(options: Mapping[str, Any], max_depth: int, *, msgpack: bool) -> None:
    """Refuse reset ``options`` that a server would not read, before anything is sent.

    Rules, on both protocols, so that the same options work on either:
    string keys only, at every level (JSON would turn ``1`` into ``"1"``;
    msgpack peers refuse other keys); lists and maps nested no deeper than
    ``max_depth`` levels counting the request around them (a server refuses
    the whole frame, and the connection with it). With ``msgpack``, integers
    within int64/uint64 too. Tuples and sets count as lists; numpy arrays
    are leaves.

    Raises:
        ValueError: names the first offending key path.
    """
    stack: list[tuple[Any, str, int]] = [(options, "options", _OPTIONS_LEVEL)]
    low, end = _MSGPACK_INTS
    while stack:
        value, path, level = stack.pop()
        if isinstance(value, Mapping):
            items: Any = value.items()
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = enumerate(value)
        else:
            if msgpack and type(value) is int and not low <= value < end:
                raise ValueError(f"reset {path} is an integer beyond 64 bits, which msgpack cannot carry: {value}")
            continue
        if level > max_depth:
            raise ValueError(f"reset {path} nests deeper than the {max_depth} levels a server reads (Limits.max_depth)")
        for key, child in items:
            if isinstance(value, Mapping):
                if type(key) is not str:
                    raise ValueError(f"reset {path} has the key {key!r}: options take string keys only (JSON and msgpack carry only those)")
                where = f"{path}[{key!r}]"
            else:
                where = f"{path}[{key}]"
            stack.append((child, where, level + 1))


def step_request(action: Mapping[str, Any]) -> dict[str, Any]:
    """A ``step`` request carrying the action's fields."""
    return {"type": "step", "data": dict(action)}


def state_request() -> dict[str, Any]:
    """A ``state`` request."""
    return {"type": "state"}


def close_request() -> dict[str, Any]:
    """A ``close`` request. The server ends the session and closes; it sends no reply."""
    return {"type": "close"}


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) is bool:
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # a JSON integer of hundreds of digits
            raise ProtocolError("reward is out of the float range") from None
    raise ProtocolError(f"reward must be a number or null, got {type(value).__name__}")


def parse_reply(message: Any) -> Reply:
    """Check a decoded server message and turn it into a :data:`Reply`.

    Raises:
        ProtocolError: the message is not one of the three reply shapes.
    """
    if type(message) is not dict:
        raise ProtocolError(f"reply must be an object, got {type(message).__name__}")
    kind = message.get("type")
    data = message.get("data")
    if kind == "observation":
        if type(data) is not dict:
            raise ProtocolError("observation reply without a data object")
        observation = data.get("observation")
        if type(observation) is not dict:
            raise ProtocolError("observation reply: 'observation' must be an object")
        done = data.get("done", False)
        if type(done) is not bool:
            raise ProtocolError(f"observation reply: 'done' must be a boolean, got {done!r:.60}")
        metadata = data.get("metadata")
        if metadata is None:
            metadata = observation.get("metadata")
        if metadata is None:
            metadata = {}
        elif type(metadata) is not dict:
            raise ProtocolError("observation reply: 'metadata' must be an object")
        return StepReply(observation, _reward(data.get("reward")), done, metadata)
    if kind == "state":
        if type(data) is not dict:
            raise ProtocolError("state reply without a data object")
        return StateReply(data)
    if kind == "error":
        if type(data) is not dict:
            raise ProtocolError("error reply without a data object")
        code = data.get("code")
        text = data.get("message", "")
        if type(code) is not str:
            raise ProtocolError("error reply without a string 'code'")
        return ErrorReply(code, str(text), data)
    raise ProtocolError(f"unknown reply type {kind!r:.60}")


# ---------------------------------------------------------------- server side


def _json_number(value: float) -> float | None:
    # Stock servers serialise non-finite floats as null (pydantic's default).
    return value if math.isfinite(value) else None


def observation_reply(
    observation: Mapping[str, Any],
    reward: float | None,
    done: bool,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``observation`` reply in the stock shape.

    ``observation`` holds the observation's own fields; like stock servers,
    the metadata is repeated inside it and at top level when non-empty.
    """
    meta = dict(metadata or {})
    obs = dict(observation)
    obs["metadata"] = meta
    data: dict[str, Any] = {
        "observation": obs,
        "reward": None if reward is None else _json_number(float(reward)),
        "done": bool(done),
    }
    if meta:
        data["metadata"] = meta
    return {"type": "observation", "data": data}


def state_reply(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ``state`` reply."""
    return {"type": "state", "data": dict(state)}


#: Longest message of an error reply, in characters: what a peer sent is often in it (an env's exception,
#: a validation error quoting the action), and an error must not be a way to make a server send megabytes.
MAX_ERROR_MESSAGE = 4096


def bounded_message(message: str) -> str:
    """``message``, cut to :data:`MAX_ERROR_MESSAGE` characters (the cut marked with ``...``)."""
    return message if len(message) <= MAX_ERROR_MESSAGE else message[: MAX_ERROR_MESSAGE - 3] + "..."


def error_reply(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """An ``error`` reply (its message at most :data:`MAX_ERROR_MESSAGE` characters); ``extra`` fields go next to ``code`` and ``message``."""
    return {"type": "error", "data": {"message": bounded_message(message), "code": code, **extra}}


@dataclass(frozen=True, slots=True)
class Request:
    """A checked client request.

    Attributes:
        type: :data:`~.kinds.RequestKind.RESET`, ``STEP``, ``STATE`` or ``CLOSE``.
        data: the request's ``data`` (``{}`` for state and close).
    """

    type: RequestKind
    data: dict[str, Any]


class RequestError(Exception):
    """A request the server answers with an error reply (the connection stays usable)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: The most characters of a peer's value an error message repeats.
MAX_ECHO = 100


def parse_request(message: Any) -> Request:
    """Check a decoded client message, as a stock server would.

    Raises:
        RequestError: with ``UNKNOWN_TYPE`` or ``VALIDATION_ERROR``.
    """
    if type(message) is not dict:
        raise RequestError(VALIDATION_ERROR, "Invalid message: expected an object")
    kind = message.get("type", "")
    if kind not in STOCK_KINDS:
        # (not a container's str, which could be huge)
        shown = str(kind) if type(kind) in (str, int, float, bool, type(None)) else type(kind).__name__
        if len(shown) > MAX_ECHO:  # (echoed whole, a 16 MiB type would make a 16 MiB reply)
            shown = shown[: MAX_ECHO - 3] + "..."
        raise RequestError(UNKNOWN_TYPE, f"Unknown message type: {shown}")
    extra = set(message) - {"type", "data"}
    if extra:
        raise RequestError(VALIDATION_ERROR, f"Invalid message: unexpected fields {sorted(extra)}")
    data = message.get("data", {})
    kind = RequestKind(kind)
    if kind in (RequestKind.STATE, RequestKind.CLOSE):
        if "data" in message:
            raise RequestError(VALIDATION_ERROR, f"Invalid message: '{kind}' takes no data")
        data = {}
    elif kind == RequestKind.STEP and "data" not in message:  # (the stock server's message model requires it)
        raise RequestError(VALIDATION_ERROR, "Invalid message: 'step' needs 'data' (the action)")
    elif type(data) is not dict:
        raise RequestError(VALIDATION_ERROR, "Invalid message: 'data' must be an object")
    return Request(kind, data)


def reply_error(exc: RequestError) -> dict[str, Any]:
    """The error reply for a :class:`RequestError`."""
    return error_reply(exc.code, exc.message)
