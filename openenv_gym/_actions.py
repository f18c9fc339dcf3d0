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

__all__ = ["coerce_action", "refusal"]


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


def refusal(space: spaces.Space, value: Any, *, batched: bool = False) -> str:
    """Why ``value`` is no action of ``space``, and what fixes it: the shape, dtype or values given against the space's.

    ``batched``: ``space`` is a vector env's batch space (the fix then names
    Gymnasium's vector ``ClipAction``).
    """
    clip = "gymnasium.wrappers.vector.ClipAction" if batched else "gymnasium.wrappers.ClipAction"
    if isinstance(space, spaces.Box):
        array = value if isinstance(value, np.ndarray) else None
        if array is None:
            try:
                array = np.asarray(value)
            except (TypeError, ValueError):
                return f"expected an array of shape {space.shape}, got {type(value).__name__}"
        if array.shape != space.shape:
            return f"expected an array of shape {space.shape}, got shape {array.shape}"
        if array.dtype.kind not in "biuf":
            return f"expected numbers ({space.dtype}), got dtype {array.dtype}"
        if np.dtype(space.dtype).kind in "iu" and array.dtype.kind == "f" and not np.all(np.mod(array, 1) == 0):
            return f"expected whole numbers ({space.dtype}), got fractions such as {array[np.mod(array, 1) != 0].flat[0].item()!r}"
        with np.errstate(invalid="ignore"):
            outside = ~((array >= space.low) & (array <= space.high))
        if outside.any():
            bad = array[outside].flat[0].item()
            return (
                f"{int(outside.sum())} value(s) outside the space's bounds (such as {bad!r}): clip actions into "
                f"[low, high] first ({clip}, or np.clip(action, space.low, space.high))"
            )
        return f"expected values of {space} (dtype {space.dtype}), got dtype {array.dtype}"
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        array = np.asarray(value) if not isinstance(value, (dict, str)) else None
        if array is None or array.shape != space.shape:
            shape = None if array is None else array.shape
            return f"expected {'an int' if space.shape == () else f'ints of shape {space.shape}'}, got {type(value).__name__}" + (
                f" of shape {shape}" if shape is not None else ""
            )
        return f"expected ints in the space's range, got {array.tolist()!r:.120}"
    return f"expected a value of {type(space).__name__}, got {type(value).__name__}"
