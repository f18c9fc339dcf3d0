"""Reading received numbers as a numpy dtype exactly: no wrap-around, no truncation. No I/O.

numpy casts arrays unsafely: int64 300 becomes uint8 44, float 1.7 becomes
int 1, 2.0**63 becomes int64's minimum. Values that cross the wire are read
with :func:`cast_problem` first, by servers (actions) and clients
(observations) alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["ARRAY_SPACES", "cast_numbers", "cast_problem", "becomes_infinite", "numbers_of"]

#: The spaces whose values are numpy arrays of one dtype.
ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)

_EXACT_FLOAT_INTS = float(2**53)  # floats beyond this may not be the integers that were meant


def numbers_of(value: Any, dtype: np.dtype) -> np.ndarray:
    """``np.asarray(value)``, but integers of 2**63 and more kept exact for an unsigned ``dtype``.

    numpy reads a list that mixes such an int with smaller ones (``[2**63, 0]``,
    as JSON carries a uint64 array) as float64, which loses the low bits.
    """
    raw = np.asarray(value)
    if raw.dtype.kind == "f" and dtype.kind == "u" and not isinstance(value, np.ndarray):
        if all(type(x) is int for x in np.asarray(value, dtype=object).flat):
            try:
                return np.asarray(value, dtype=np.uint64)
            except OverflowError:  # (a negative int too: refused by cast_problem as the floats are)
                return raw
    return raw


def cast_problem(raw: np.ndarray, dtype: np.dtype) -> str | None:
    """Why the numbers of ``raw`` (kind b, i, u or f) cannot all be read exactly as ``dtype``, or ``None``.

    Integers must fit ``dtype``'s range; floats read as integers must be
    whole, finite, in range and below 2**53 in magnitude; booleans take 0 and 1
    only (or bools). Float targets accept anything (a float32 observation of
    1e39 is inf by the space's own choice of dtype).
    """
    if not raw.size or dtype.kind not in "biu":
        return None
    kind = raw.dtype.kind
    if dtype.kind == "b":
        if kind == "b":
            return None
        if kind not in "iuf" or not np.all((raw == 0) | (raw == 1)):
            return "booleans (0 or 1)"
        return None
    info = np.iinfo(dtype)
    if kind == "b":
        return None
    if kind == "f":
        if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
            return "integers"
        # (int64's max is no float: 2.0**63 == float(2**63 - 1), so the top is exclusive)
        top = float(2 ** (info.bits - (info.min < 0)))
        if raw.min() < info.min or raw.max() >= top or np.abs(raw).max() >= _EXACT_FLOAT_INTS:
            return f"integers that {dtype} holds"
        return None
    if kind in "iu":
        if raw.min() < info.min or raw.max() > info.max:
            return f"integers that {dtype} holds"
        return None
    return "numbers"


def cast_numbers(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``raw`` as a new array of ``dtype``, floats beyond a narrower float dtype's range as ±inf without numpy's ``RuntimeWarning``.

    (numpy warns "overflow encountered in cast" where float64 1e300 becomes
    float32 inf: a warning per value received, and an exception where
    warnings are errors. Whether that inf is acceptable is the caller's to
    say, with :func:`becomes_infinite`.)
    """
    if dtype.kind == "f" and raw.dtype.kind == "f" and raw.dtype.itemsize > dtype.itemsize:
        with np.errstate(over="ignore"):
            return np.array(raw, dtype=dtype)
    return np.array(raw, dtype=dtype)


def becomes_infinite(raw: np.ndarray, cast: np.ndarray) -> bool:
    """Whether ``cast``, ``raw`` cast to a float dtype, made a finite number inf (1e39 in float32).

    (Where a value is sent, that is a change; an observation space's float32 takes it as its own choice.)
    """
    if cast.dtype.kind != "f" or raw.dtype.kind not in "iuf" or not raw.size:
        return False
    return not bool(np.all(np.isfinite(cast) | ~np.isfinite(raw)))
