"""Values between the wire and a hosted environment, both ways. No I/O.

- :func:`action_from_wire`: a decoded wire value (JSON value, or msgpack value
  with numpy arrays) becomes an action of a Gymnasium space, or
  :class:`ActionError` says why it cannot.
- :func:`plain_value`: an environment's output (observation, ``info``) becomes
  something a codec can encode: numpy arrays of a wire dtype are kept for
  msgpack and turned into lists for JSON; anything unknown becomes its ``str``.
"""

from __future__ import annotations

import itertools
import reprlib
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array

from ..._numbers import ARRAY_SPACES, becomes_infinite, cast_numbers, cast_problem, numbers_of
from ...protocol.codec import WIRE_DTYPES

__all__ = ["ActionError", "action_from_wire", "plain_value", "short_repr", "describe_error", "pydantic_errors"]


class ActionError(ValueError):
    """An action that does not fit the action space (answered with ``VALIDATION_ERROR``).

    Attributes:
        errors: optional details in pydantic's ``errors()`` shape (OpenEnv hosts).
    """

    def __init__(self, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors


def pydantic_errors(exc: BaseException) -> list[Any] | None:
    """A pydantic ``ValidationError``'s ``errors`` as the stock server sends them (``None`` for other errors)."""
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic comes with openenv
        return None
    if not isinstance(exc, ValidationError):
        return None
    import json

    try:
        return json.loads(exc.json())
    except ValueError:  # an input pydantic cannot write as JSON (bytes that are not UTF-8)
        return json.loads(exc.json(include_input=False))


def describe_error(exc: BaseException, limit: int = 1000) -> str:
    """An env's exception as a reply's message: its text (at most ``limit`` characters), else its type's name.

    Never raises, whatever the exception's ``__str__`` does.
    """
    try:
        text = str(exc)
    except Exception:
        text = ""
    if len(text) > limit:
        text = text[:limit] + "..."
    return text or type(exc).__name__


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` cut to ``limit`` characters (actions may be whole images).

    Containers are shown by their first few items only (:data:`_SHORT`), so
    that the cost does not grow with a peer's value (a repr of millions of
    items took seconds).
    """
    if isinstance(value, np.ndarray) and value.size > 16:
        return f"array(shape={value.shape}, dtype={value.dtype})"
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ShortRepr(reprlib.Repr):
    """reprlib's, with maps in their own order (reprlib sorts every key) and bytes cut before their repr."""

    def repr_dict(self, x: dict, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in itertools.islice(x.items(), self.maxdict)]
        if len(x) > self.maxdict:
            pieces.append("...")
        return "{" + ", ".join(pieces) + "}"

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x[: self.maxstring]) + ("..." if len(x) > self.maxstring else "")

    repr_bytearray = repr_bytes


_SHORT = _ShortRepr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 4, 8, 8, 8, 8
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 120, 120, 40


def _int_scalar(value: Any, what: str) -> int:
    if type(value) is bool or isinstance(value, np.bool_):
        raise ActionError(f"{what} must be an integer, got a boolean")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        return int(value)
    raise ActionError(f"{what} must be an integer, got {short_repr(value)}")


def _array(value: Any, dtype: np.dtype, shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    """A writable copy of ``value`` as an array of ``dtype`` (and ``shape``, if given).

    Integers that ``dtype`` cannot hold are refused, not wrapped (300 is no uint8 44).
    """
    try:
        raw = numbers_of(value, dtype)
    except (TypeError, ValueError) as exc:
        raise ActionError(f"{what} is not an array: {exc}") from None
    if raw.dtype.kind not in "biuf":
        raise ActionError(f"{what} must hold numbers, got {short_repr(value)}")
    if shape is not None and raw.shape != shape:
        raise ActionError(f"{what} must have shape {shape}, got {raw.shape}")
    problem = cast_problem(raw, dtype)
    if problem is not None:
        raise ActionError(f"{what} must hold {problem}, got {short_repr(value)}")
    try:
        out = cast_numbers(raw, dtype)
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - defensive
        raise ActionError(f"{what} cannot be read as {dtype}: {exc}") from None
    if becomes_infinite(raw, out):
        raise ActionError(f"{what} holds values too large for {dtype}, got {short_repr(value)}")
    return out


#: Items of ``Sequence`` actions a host reads by default, over a whole action (see ``Limits.max_sequence_length``).
DEFAULT_MAX_SEQUENCE_LENGTH = 16 * 1024


class _Budget:
    """How many more ``Sequence`` items one action may hold, over all its levels."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit

    def take(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise ActionError(f"{what}: the action holds more than {self.limit} sequence items (--max-sequence-length)")


def _stacked_array(feature: spaces.Space, value: Any, what: str) -> np.ndarray:
    """Stacked ``Sequence`` items of an array space as one array ``(n, *item_shape)``, checked against ``feature``."""
    n = len(value)
    shape = cast(tuple[int, ...], feature.shape)  # (an array space's: never None)
    dtype = cast(np.dtype, feature.dtype)
    if n == 0:
        return np.zeros((0, *shape), dtype=dtype)
    raw = np.asarray(value)
    if isinstance(feature, (spaces.Discrete, spaces.MultiDiscrete)) and raw.dtype.kind not in "iu":
        raise ActionError(f"{what} must hold integers, got {short_repr(value)}")
    items = _array(raw, dtype, (n, *shape), what)
    # Upper bounds as Python ints (or int64 arrays): start + n may not fit the space's own dtype.
    if isinstance(feature, spaces.Box):
        inside = bool(np.all(items >= feature.low) and np.all(items <= feature.high))
    elif isinstance(feature, spaces.Discrete):
        low = int(feature.start)
        inside = bool(np.all(items >= low) and np.all(items <= low + int(feature.n) - 1))
    elif isinstance(feature, spaces.MultiDiscrete):
        lows = feature.start.astype(np.int64)
        inside = bool(np.all(items >= lows) and np.all(items <= lows + feature.nvec.astype(np.int64) - 1))
    else:  # MultiBinary
        inside = bool(np.all((items == 0) | (items == 1)))
    if not inside:
        raise ActionError(f"{what} {short_repr(value)} is outside the item space {feature}")
    return items


def _convert(space: spaces.Space, value: Any, what: str, budget: _Budget) -> Any:
    # Values as Gymnasium's vector envs hand them to an env: numpy scalars of the space's dtype for
    # Discrete values and for shape-() Boxes (hashable, as an env's table[action] needs), else arrays.
    # (A shape-() MultiDiscrete or MultiBinary stays a 0-d array: their contains refuses a scalar.)
    if isinstance(space, spaces.Discrete):
        number = _int_scalar(value, what)
        try:
            return space.dtype.type(number)  # type: ignore[union-attr]
        except OverflowError:  # (out of the space anyway: its check says so)
            return number
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        array = _array(value, space.dtype, space.shape, what)
        return array[()] if array.ndim == 0 and type(space) is spaces.Box else array
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict):
            raise ActionError(f"{what} must be a map with keys {sorted(space.spaces)}")
        if set(value) != set(space.spaces):
            raise ActionError(f"{what} must have exactly the keys {sorted(space.spaces)}, got {sorted(map(str, value))}")
        return {key: _convert(sub, value[key], f"{what}[{key!r}]", budget) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(space.spaces):
            raise ActionError(f"{what} must be a list of {len(space.spaces)} entries")
        return tuple(_convert(sub, v, f"{what}[{i}]", budget) for i, (sub, v) in enumerate(zip(space.spaces, value)))
    if isinstance(space, spaces.Text):
        if type(value) is not str:
            raise ActionError(f"{what} must be a string")
        return value
    if isinstance(space, spaces.Sequence):
        if not isinstance(value, (list, tuple, np.ndarray)) or (isinstance(value, np.ndarray) and value.ndim == 0):
            raise ActionError(f"{what} must be a list")
        budget.take(len(value), what)
        feature = space.feature_space
        if space.stack and type(feature) in ARRAY_SPACES:  # (exact types: a subclass may have its own contains)
            return _stacked_array(feature, value, what)
        if isinstance(value, np.ndarray):
            value = list(value)
        items = tuple(_convert(feature, v, f"{what}[{i}]", budget) for i, v in enumerate(value))
        if not space.stack:
            return items
        if not items:
            return create_empty_array(feature, n=0)
        return concatenate(feature, items, create_empty_array(feature, n=len(items)))  # type: ignore[arg-type]
    return value


def action_from_wire(
    space: spaces.Space, value: Any, what: str = "action", *, max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH
) -> Any:
    """The action of ``space`` that the wire value ``value`` stands for.

    Discrete -> a numpy scalar of the space's dtype (``np.int64``); Box,
    MultiBinary, MultiDiscrete -> a writable ``np.ndarray`` of the space's
    dtype and exact shape, or for a ``Box`` of shape ``()`` a numpy scalar, as Gymnasium's
    vector envs hand actions to their envs (integral floats are
    accepted for integer dtypes; values the dtype cannot hold are refused;
    nothing is reshaped or clipped); Dict -> ``dict``; Tuple -> ``tuple``;
    Text -> ``str``; Sequence -> ``tuple`` of its items, or with ``stack=True``
    the items stacked into one array, as Gymnasium stacks them (at most
    ``max_sequence_length`` sequence items in the whole action, all levels
    counted); other spaces get the value as sent.

    Raises:
        ActionError: wrong type or shape, too many items, or outside the space
            (``space.contains``); also for any other failure to read it.
    """
    try:
        action = _convert(space, value, what, _Budget(max_sequence_length))
        if type(space) is spaces.Sequence and space.stack and type(space.feature_space) in ARRAY_SPACES:
            return action  # (checked whole by _stacked_array; contains would go item by item)
    except ActionError:
        raise
    except Exception as exc:  # (a value no check above foresaw): refused, as any bad action
        raise ActionError(f"cannot read {what} {short_repr(value)}: {describe_error(exc)}") from None
    if type(space) is spaces.Discrete:  # the hot path: range check without Discrete.contains
        start = int(space.start)
        if start <= action < start + int(space.n):
            return action
        raise ActionError(f"{what} {short_repr(value)} is outside the action space {space}")
    try:
        inside = space.contains(action)
    except Exception:  # some spaces raise on foreign values instead of answering False
        inside = False
    if not inside:
        raise ActionError(f"{what} {short_repr(value)} is outside the action space {space}")
    return action


def _big_int(value: int) -> float | str:
    """An integer msgpack cannot carry: as a float, or as its digits if no float holds it."""
    try:
        return float(value)
    except OverflowError:
        return str(value)


def plain_value(value: Any, *, keep_arrays: bool, numpy_scalars: bool = False) -> Any:
    """``value`` made of dicts (str keys), lists, scalars, and (if ``keep_arrays``) numpy arrays.

    Arrays of a wire dtype (see :data:`~openenv_gym.protocol.codec.WIRE_DTYPES`)
    stay arrays when ``keep_arrays`` (msgpack), else become nested lists (JSON);
    other arrays become lists. numpy scalars become Python scalars, except
    that with ``keep_arrays`` and ``numpy_scalars`` those of a wire dtype that
    are ``value`` or a value of its dicts (not items of its lists) become 0-d
    arrays (how the fast path carries a numpy scalar in metadata, so that its
    dtype arrives: ``docs/PROTOCOL.md``, 3.1); tuples and
    sets become lists; non-finite floats stay floats (the codecs handle them);
    with ``keep_arrays``, integers msgpack cannot carry (beyond
    ``[-2**63, 2**64)``) become floats; objects of any other type become their ``str``.
    """
    t = type(value)
    if t is np.ndarray:
        if keep_arrays and value.dtype.str in WIRE_DTYPES:
            return value
        if keep_arrays and not value.dtype.isnative and value.dtype.newbyteorder("=").str in WIRE_DTYPES:
            return value.astype(value.dtype.newbyteorder("="))  # (big-endian: the same values, in the wire's order)
        if value.dtype.kind in "biu" or value.dtype.str in WIRE_DTYPES:
            return value.tolist()
        if value.dtype.kind == "f":  # (longdouble: its tolist() holds numpy scalars, which no codec writes)
            return value.astype(np.float64).tolist()
        return [plain_value(v, keep_arrays=keep_arrays) for v in value.tolist()]
    if t is int:
        # msgpack carries integers in [-2**63, 2**64) only: a larger one would fail the whole reply.
        return value if not keep_arrays or -(2**63) <= value < 2**64 else _big_int(value)
    if value is None or t is bool or t is float or t is str:
        return value
    if isinstance(value, np.generic):
        if numpy_scalars and keep_arrays and value.dtype.str in WIRE_DTYPES:
            return np.asarray(value)
        if numpy_scalars and keep_arrays and not value.dtype.isnative and value.dtype.newbyteorder("=").str in WIRE_DTYPES:
            return np.asarray(value).astype(value.dtype.newbyteorder("="))
        if value.dtype.kind == "f":
            return float(value)
        item = value.item()
        return item if isinstance(item, (bool, int, float, str)) else str(item)
    if isinstance(value, dict):
        return {str(k): plain_value(v, keep_arrays=keep_arrays, numpy_scalars=numpy_scalars) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        # (items as Python scalars: a 0-d array each would make a long list of numpy scalars slow and big)
        return [plain_value(v, keep_arrays=keep_arrays) for v in value]
    if isinstance(value, int):  # subclasses such as IntEnum
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value if keep_arrays else value.decode("latin-1")
    return str(value)
