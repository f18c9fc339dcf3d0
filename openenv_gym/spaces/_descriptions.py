"""Exact space descriptions: a space written as a JSON-able dict and read back, strictly, from a peer."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gspaces
from gymnasium.spaces import Space

from openenv_gym._numbers import ARRAY_SPACES

from ._base import _MAX_ARRAY_BYTES, _MAX_DEPTH, _MAX_ELEMENTS, SpaceMappingError, _is_int, _number, _too_big
from ._classes import UnicodeText

_ALLOWED_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
)


def _desc_error(problem: str) -> SpaceMappingError:
    return SpaceMappingError(f"invalid space description: {problem}")


def _encode_float(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _unflatten(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """Nested lists of ``shape`` from a row-major flat list (a bare leaf for ``()``)."""
    if not shape:
        return flat[0]

    def build(offset: int, dims: tuple[int, ...]) -> list[Any]:
        if len(dims) == 1:
            return flat[offset : offset + dims[0]]
        stride = math.prod(dims[1:])
        return [build(offset + i * stride, dims[1:]) for i in range(dims[0])]

    return build(0, shape)


def _encode_bounds(arr: np.ndarray, bounded: np.ndarray, sign: str) -> Any:
    flat = arr.ravel().tolist()
    mask = bounded.ravel().tolist()
    if arr.dtype.kind == "f":
        leaves = [_encode_float(float(v)) for v in flat]
    elif arr.dtype.kind == "b":
        leaves = [bool(v) for v in flat]
    else:
        leaves = [int(v) if m else sign for v, m in zip(flat, mask)]
    return _unflatten(leaves, arr.shape)


def describe_space(space: Space) -> dict[str, Any]:
    """An exact JSON-able description of ``space`` (``{"type": "Box", ...}``).

    Formats: ``Box`` (``dtype`` name, ``shape`` list, ``low``/``high`` nested
    lists; non-finite floats as ``"inf"``, ``"-inf"``, ``"nan"``; unbounded
    integer elements as ``"-inf"``/``"inf"``), ``Discrete`` (``n``, ``start``,
    ``dtype``), ``MultiDiscrete`` (``nvec``, ``start`` nested lists, ``dtype``),
    ``MultiBinary`` (``n``: int or list), ``Text`` (``min_length``,
    ``max_length``, ``charset`` string in the space's order), ``Dict``
    (``keys`` list in order and ``spaces`` list), ``Tuple`` (``spaces`` list),
    ``Sequence`` (``feature_space``, ``stack`` bool).
    ``space_from_description(describe_space(s)) == s``.
    """
    return _describe(space, 0)


def _describe(space: Space, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise _desc_error(f"spaces nested deeper than {_MAX_DEPTH} levels")
    if isinstance(space, gspaces.Box):
        return {
            "type": "Box",
            "dtype": space.dtype.name,
            "shape": list(space.shape),
            "low": _encode_bounds(space.low, space.bounded_below, "-inf"),
            "high": _encode_bounds(space.high, space.bounded_above, "inf"),
        }
    if isinstance(space, gspaces.Discrete):
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gspaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gspaces.MultiBinary):
        n = space.n
        return {
            "type": "MultiBinary",
            "n": int(n) if isinstance(n, (int, np.integer)) else [int(x) for x in n],
        }
    if isinstance(space, gspaces.Text):
        return {
            "type": "UnicodeText" if isinstance(space, UnicodeText) else "Text",
            "min_length": int(space.min_length),
            "max_length": int(space.max_length),
            "charset": "".join(space.character_list),
        }
    if isinstance(space, gspaces.Dict):
        keys = list(space.spaces)
        if not all(isinstance(k, str) for k in keys):
            raise _desc_error("Dict keys must be strings")
        return {
            "type": "Dict",
            "keys": keys,
            "spaces": [_describe(space.spaces[k], depth + 1) for k in keys],
        }
    if isinstance(space, gspaces.Tuple):
        return {"type": "Tuple", "spaces": [_describe(s, depth + 1) for s in space.spaces]}
    if isinstance(space, gspaces.Sequence):
        if space.stack and not isinstance(space.feature_space, ARRAY_SPACES):
            raise _desc_error(
                f"a stacked Sequence of {type(space.feature_space).__name__} cannot be described (stack=True needs array items)"
            )
        return {"type": "Sequence", "feature_space": _describe(space.feature_space, depth + 1), "stack": bool(space.stack)}
    raise _desc_error(f"{type(space).__name__} spaces cannot be described")


_DESC_KEYS: dict[str, frozenset[str]] = {
    "Box": frozenset({"type", "dtype", "shape", "low", "high"}),
    "Discrete": frozenset({"type", "n", "start", "dtype"}),
    "MultiDiscrete": frozenset({"type", "nvec", "start", "dtype"}),
    "MultiBinary": frozenset({"type", "n"}),
    "Text": frozenset({"type", "min_length", "max_length", "charset"}),
    "UnicodeText": frozenset({"type", "min_length", "max_length", "charset"}),
    "Dict": frozenset({"type", "keys", "spaces"}),
    "Tuple": frozenset({"type", "spaces"}),
    "Sequence": frozenset({"type", "feature_space", "stack"}),
}


def _get_int(desc: Mapping[str, Any], key: str, minimum: int | None = None) -> int:
    v = desc.get(key)
    if not _is_int(v):
        raise _desc_error(f"{desc.get('type')}.{key} must be an integer, got {v!r:.40}")
    if minimum is not None and v < minimum:
        raise _desc_error(f"{desc.get('type')}.{key} must be >= {minimum}, got {v}")
    return int(v)


def _get_dtype(desc: Mapping[str, Any], integer_only: bool = False) -> np.dtype:
    name = desc.get("dtype")
    if not isinstance(name, str) or name not in _ALLOWED_DTYPES:
        raise _desc_error(f"{desc.get('type')}.dtype {name!r:.40} is not an allowed dtype")
    dtype = np.dtype(name)
    if integer_only and dtype.kind not in "iu":
        raise _desc_error(f"{desc.get('type')}.dtype must be an integer dtype, got {name}")
    return dtype


def _get_shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > _MAX_DEPTH:
        raise _desc_error(f"{what} must be a list of at most {_MAX_DEPTH} integers")
    if not all(_is_int(d) and d >= 0 for d in value):
        raise _desc_error(f"{what} must hold non-negative integers, got {value!r:.80}")
    if math.prod(value) > _MAX_ELEMENTS:
        raise _desc_error(f"{what} {value} has more than 2**31 elements")
    return tuple(int(d) for d in value)


def _flatten(value: Any, shape: tuple[int, ...], what: str) -> list[Any]:
    """Leaves of a nested list that must have exactly ``shape``."""
    level = [value]
    for d in shape:
        nxt: list[Any] = []
        for v in level:
            if not isinstance(v, list) or len(v) != d:
                raise _desc_error(f"{what} does not have shape {list(shape)}")
            nxt.extend(v)
        level = nxt
    if any(isinstance(v, (list, dict)) for v in level):
        raise _desc_error(f"{what} does not have shape {list(shape)}")
    return level


def _decode_bounds(value: Any, shape: tuple[int, ...], dtype: np.dtype, sign: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(array of dtype, bounded mask) from a nested list of encoded bounds."""
    leaves = _flatten(value, shape, what)
    mask = [True] * len(leaves)
    out: list[Any] = []
    if dtype.kind == "f":
        specials = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        for v in leaves:
            if isinstance(v, str) and v in specials:
                out.append(specials[v])
            elif _number(v) or (isinstance(v, float) and math.isnan(v)):
                out.append(float(v))
            else:
                raise _desc_error(f"{what} holds {v!r:.40}, not a number")
        with np.errstate(over="ignore"):
            arr = np.array(out, dtype=dtype).reshape(shape)
        if np.any(np.isinf(arr) & np.isfinite(np.array(out, dtype=np.float64).reshape(shape))):
            raise _desc_error(f"{what} holds values beyond the {dtype.name} range")
        return arr, np.array(mask, dtype=bool).reshape(shape)
    if dtype.kind == "b":
        if not all(isinstance(v, bool) for v in leaves):
            raise _desc_error(f"{what} of a bool Box must hold booleans")
        arr = np.array(leaves, dtype=bool).reshape(shape)
        return arr, np.array(mask, dtype=bool).reshape(shape)
    info = np.iinfo(dtype)
    for i, v in enumerate(leaves):
        if v == sign and dtype.kind == "i":
            out.append(int(info.min) if sign == "-inf" else int(info.max))
            mask[i] = False
        elif _is_int(v) and info.min <= v <= info.max:
            out.append(v)
        else:
            raise _desc_error(f"{what} holds {v!r:.40}, not a {dtype.name} value")
    return np.array(out, dtype=dtype).reshape(shape), np.array(mask, dtype=bool).reshape(shape)


def _decode_int_array(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        if len(shape) >= _MAX_DEPTH:
            raise _desc_error(f"{what} nested deeper than {_MAX_DEPTH} levels")
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    dims = _get_shape(shape, what)
    leaves = _flatten(value, dims, what)
    info = np.iinfo(dtype)
    if not all(_is_int(v) and info.min <= v <= info.max for v in leaves):
        raise _desc_error(f"{what} must hold {dtype.name} integers")
    return np.array(leaves, dtype=dtype).reshape(dims)


def space_from_description(desc: Mapping[str, Any], *, max_array_bytes: int = _MAX_ARRAY_BYTES) -> Space:
    """The space a :func:`describe_space` description stands for.

    The input may come from the network: it is validated strictly (known
    ``type`` and keys only, allowed dtypes only, non-negative sizes, at most 32
    levels of nesting, at most ``max_array_bytes`` per array space, checked
    before it is made, bounds given as full nested lists). Nothing is evaluated.

    Raises:
        SpaceMappingError: the description is invalid.
    """
    return _from_desc(desc, 0, max_array_bytes)


def _from_desc(desc: Any, depth: int, max_bytes: int = _MAX_ARRAY_BYTES) -> Space:
    if depth > _MAX_DEPTH:
        raise _desc_error(f"spaces nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(desc, Mapping):
        raise _desc_error(f"expected an object, got {type(desc).__name__}")
    kind = desc.get("type")
    if not isinstance(kind, str) or kind not in _DESC_KEYS:
        raise _desc_error(f"unknown space type {kind!r:.40}")
    extra = set(desc) - _DESC_KEYS[kind]
    missing = _DESC_KEYS[kind] - set(desc)
    if extra or missing:
        raise _desc_error(f"{kind} has unknown keys {sorted(map(str, extra))} / misses {sorted(missing)}")
    try:
        return _READERS[kind](desc, depth, max_bytes)
    except SpaceMappingError:
        raise
    except (ValueError, TypeError, OverflowError, AssertionError) as exc:
        raise _desc_error(f"{kind}: {exc}") from None


def _box_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Box``: bounds as full nested lists, unbounded integer elements as ``"-inf"``/``"inf"``."""
    dtype = _get_dtype(desc)
    shape = _get_shape(desc["shape"], "Box.shape")
    if _too_big(shape, dtype, max_bytes):
        raise _desc_error(f"Box.shape {list(shape)} of {dtype.name} is over {max_bytes} bytes (Limits.max_array_bytes)")
    low, low_mask = _decode_bounds(desc["low"], shape, dtype, "-inf", "Box.low")
    high, high_mask = _decode_bounds(desc["high"], shape, dtype, "inf", "Box.high")
    box = gspaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    if dtype.kind == "i":
        box.bounded_below = low_mask
        box.bounded_above = high_mask
    return box


def _discrete_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Discrete`` whose values fit its dtype."""
    dtype = _get_dtype(desc, integer_only=True)
    n = _get_int(desc, "n", minimum=1)
    start = _get_int(desc, "start")
    info = np.iinfo(dtype)
    if not (info.min <= start and n <= info.max and start + n - 1 <= info.max):
        raise _desc_error(f"Discrete n={n}, start={start} do not fit {dtype.name}")
    return gspaces.Discrete(n, start=start, dtype=dtype)


def _multi_discrete_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``MultiDiscrete`` of positive ``nvec``."""
    dtype = _get_dtype(desc, integer_only=True)
    nvec = _decode_int_array(desc["nvec"], dtype, "MultiDiscrete.nvec")
    starts = _decode_int_array(desc["start"], dtype, "MultiDiscrete.start")
    if starts.shape != nvec.shape:
        raise _desc_error("MultiDiscrete.start and nvec differ in shape")
    if not (nvec > 0).all():
        raise _desc_error("MultiDiscrete.nvec must be positive")
    return gspaces.MultiDiscrete(nvec, dtype=dtype, start=starts)


def _multi_binary_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``MultiBinary`` of ``n`` (an int or a shape) elements."""
    n = desc["n"]
    if _is_int(n):
        if n < 1 or n > min(_MAX_ELEMENTS, max_bytes):
            raise _desc_error(f"MultiBinary.n must be in [1, {min(_MAX_ELEMENTS, max_bytes)}] (Limits.max_array_bytes), got {n}")
        return gspaces.MultiBinary(int(n))
    dims = _get_shape(n, "MultiBinary.n")
    if _too_big(dims, np.int8, max_bytes):
        raise _desc_error(f"MultiBinary.n {list(dims)} is over {max_bytes} bytes (Limits.max_array_bytes)")
    if any(d == 0 for d in dims):
        raise _desc_error("MultiBinary.n must hold positive integers")
    return gspaces.MultiBinary(list(dims))


def _text_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Text`` or a :class:`UnicodeText`."""
    min_len = _get_int(desc, "min_length", minimum=0)
    max_len = _get_int(desc, "max_length", minimum=min_len)
    if max_len > _MAX_ELEMENTS:
        raise _desc_error("Text.max_length larger than 2**31")
    charset = desc["charset"]
    if not isinstance(charset, str):
        raise _desc_error("Text.charset must be a string")
    if desc["type"] == "UnicodeText":
        return UnicodeText(max_len, min_length=min_len, charset=charset)
    return gspaces.Text(max_length=max_len, min_length=min_len, charset=charset)


def _dict_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Dict`` of distinct string keys, in order."""
    keys, subs = desc["keys"], desc["spaces"]
    if not isinstance(keys, list) or not isinstance(subs, list) or len(keys) != len(subs):
        raise _desc_error("Dict.keys and Dict.spaces must be lists of equal length")
    if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise _desc_error("Dict.keys must be distinct strings")
    return gspaces.Dict([(k, _from_desc(s, depth + 1, max_bytes)) for k, s in zip(keys, subs)])


def _sequence_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Sequence``; a stacked one of array items only."""
    if not isinstance(desc["stack"], bool):
        raise _desc_error("Sequence.stack must be a boolean")
    feature = _from_desc(desc["feature_space"], depth + 1, max_bytes)
    if desc["stack"] and not isinstance(feature, ARRAY_SPACES):
        # (and each stacked level would copy the ones inside it: nested, they cost 2**depth)
        raise _desc_error(f"a stacked Sequence needs array items, got {type(feature).__name__}")
    return gspaces.Sequence(feature, stack=desc["stack"])


def _tuple_from_desc(desc: Mapping[str, Any], depth: int, max_bytes: int) -> Space:
    """A ``Tuple``."""
    subs = desc["spaces"]
    if not isinstance(subs, list):
        raise _desc_error("Tuple.spaces must be a list")
    return gspaces.Tuple([_from_desc(s, depth + 1, max_bytes) for s in subs])


#: How each ``type`` of description is read (its keys checked already).
_READERS: dict[str, Callable[[Mapping[str, Any], int, int], Space]] = {
    "Box": _box_from_desc,
    "Discrete": _discrete_from_desc,
    "MultiDiscrete": _multi_discrete_from_desc,
    "MultiBinary": _multi_binary_from_desc,
    "Text": _text_from_desc,
    "UnicodeText": _text_from_desc,
    "Dict": _dict_from_desc,
    "Tuple": _tuple_from_desc,
    "Sequence": _sequence_from_desc,
}
