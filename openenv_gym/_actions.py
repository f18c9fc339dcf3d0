"""Actions as the caller wrote them, made into values of the action space where nothing is lost.

Gymnasium's envs take an in-bounds ``float64`` action for a ``float32`` ``Box``
(numpy's default dtype), or a list for a ``Discrete`` batch; ``Box.contains``
refuses the first because the cast is not "safe". The sync faces check actions
before anything is sent, so they first convert what converts without loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from ._numbers import ARRAY_SPACES, becomes_infinite, cast_numbers, cast_problem, numbers_of

__all__ = ["coerce_action"]


def coerce_action(space: spaces.Space, value: Any) -> Any:
    """``value`` (one action, or a batch for a batched space) as an array of ``space.dtype``, if that loses nothing.

    Arrays and lists are cast when the cast keeps the kind of number
    (``float64`` to ``float32``, ``int64`` to ``int8``, ``bool`` to ints) and,
    for integer dtypes, every value fits. Anything else comes back as an array
    of its own dtype, for ``space.contains`` to refuse: ``1.7`` is never made
    ``1``, nor ``300`` made ``44``. (A list given to ``contains`` as it is would
    be cast by Gymnasium first, and pass.)
    ``Dict`` and ``Tuple`` actions are coerced leaf by leaf; a list for a
    ``Sequence`` becomes the tuple the space holds.
    """
    if isinstance(space, spaces.Dict) and isinstance(value, dict):
        return {key: coerce_action(space[key], v) if key in space.spaces else v for key, v in value.items()}
    if isinstance(space, spaces.Tuple) and isinstance(value, (tuple, list)) and len(value) == len(space):
        return tuple(coerce_action(s, v) for s, v in zip(space, value))
    if isinstance(space, spaces.Sequence) and not space.stack and isinstance(value, (list, tuple)):
        return tuple(coerce_action(space.feature_space, v) for v in value)  # a list is the natural spelling
    if not isinstance(space, ARRAY_SPACES):
        return value
    if isinstance(space, spaces.Discrete) and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)  # (a uint64 scalar is no Discrete value to Gymnasium: its int is)
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = numbers_of(value, np.dtype(space.dtype))
        except (TypeError, ValueError, OverflowError):
            return value
    target = np.dtype(space.dtype)
    if array.dtype == target:
        return array
    if array.dtype.kind not in "biuf":
        return value
    if target.kind in "biu":
        # Integers in range, whole floats, 0/1 for bools: read exactly, else refused by contains.
        return array.astype(target) if cast_problem(array, target) is None else array
    if not np.can_cast(array.dtype, target, "same_kind"):
        return array
    cast = cast_numbers(array, target)
    return array if becomes_infinite(array, cast) else cast
