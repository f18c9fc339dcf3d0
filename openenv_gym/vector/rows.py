"""Batches of a space's values: rows written, read, taken and copied; a batch space that keeps open bounds open.

Plain functions of a Gymnasium space and a batch made by
``gymnasium.vector.utils.create_empty_array`` (or ``batch_space``), and of
the pool's per-request :class:`~openenv_gym.vector.links.Results` and request columns.
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from .._numbers import ARRAY_SPACES
from ..protocol.multiplex import Column
from ..spaces import CodecKind
from .links import Results

#: The field kinds whose wire value is the space's value (an enum sends ``enum[i]``, the others are not arrays).
_SAME_ON_THE_WIRE = frozenset({CodecKind.BOX, CodecKind.DISCRETE, CodecKind.MULTIBINARY, CodecKind.MULTIDISCRETE})


def same_on_the_wire(codec: Any) -> bool:
    """Whether a field's wire values are its space's values (an enum sends ``enum[i]``, a bool field ``true``)."""
    return codec.kind in _SAME_ON_THE_WIRE and not codec.as_bool


def batched_space(space: gym.Space, n: int) -> gym.Space:
    """``batch_space(space, n)``, with the open bounds of its integer ``Box`` es kept open.

    Gymnasium builds a batch ``Box`` from the bounds alone, and an open
    integer bound is stored as the dtype's extreme, which the batch takes for
    a bound: its ``sample()`` draws near -2**63, or fails ("high - low < 0")
    for a field that is only bounded below (an OpenEnv ``int = Field(ge=0)``).
    """
    batch = batch_space(space, n)
    _keep_open_bounds(space, batch, n)
    return batch


def _keep_open_bounds(space: gym.Space, batch: gym.Space, n: int) -> None:
    if isinstance(space, spaces.Box):
        if space.dtype.kind in "iu" and not (space.bounded_below.all() and space.bounded_above.all()):
            repeats = (n,) + (1,) * space.bounded_below.ndim
            batch.bounded_below = np.tile(space.bounded_below, repeats)  # type: ignore[attr-defined]
            batch.bounded_above = np.tile(space.bounded_above, repeats)  # type: ignore[attr-defined]
    elif isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _keep_open_bounds(sub, batch[key], n)  # type: ignore[index]
    elif isinstance(space, spaces.Tuple):
        for sub, sub_batch in zip(space.spaces, batch):  # type: ignore[call-overload]
            _keep_open_bounds(sub, sub_batch, n)


def row_of(space: gym.Space, batch: Any, n: int) -> Any:
    """The ``n``-th value of a batch of ``space``: Dict and Tuple batches hold a batch per sub-space,
    array spaces an array, others (Text, Sequence, ...) a tuple of values."""
    if isinstance(space, gym.spaces.Dict):
        return {k: row_of(sub, batch[k], n) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(row_of(sub, b, n) for sub, b in zip(space.spaces, batch))
    if isinstance(batch, np.ndarray):
        # A Box's value is an array, even of shape () (batch[n] of a 1-D batch would be a numpy scalar).
        return (batch[n, ...] if isinstance(space, gym.spaces.Box) else batch[n]).copy()
    return batch[n]


def array_leaves_only(space: gym.Space) -> bool:
    if isinstance(space, ARRAY_SPACES):
        return True
    if isinstance(space, spaces.Dict):
        return all(array_leaves_only(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(array_leaves_only(s) for s in space.spaces)
    return False


def write_row(space: gym.Space, out: Any, index: int, value: Any) -> None:
    """Write one env's value into row ``index`` of a batch made by ``create_empty_array``."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            write_row(sub, out[key], index, value[key])
    elif isinstance(space, spaces.Tuple):
        for sub, part, item in zip(space.spaces, out, value):
            write_row(sub, part, index, item)
    else:
        out[index] = value


def take_rows(space: gym.Space, batch: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of a batch (a copy)."""
    if isinstance(space, spaces.Dict):
        return {key: take_rows(sub, batch[key], rows) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple) and isinstance(batch, tuple) and len(batch) == len(space.spaces):
        return tuple(take_rows(sub, part, rows) for sub, part in zip(space.spaces, batch))
    if isinstance(batch, np.ndarray):
        return batch[rows]
    return tuple(batch[i] for i in rows.tolist())


def copy_batch(batch: Any) -> Any:
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {key: copy_batch(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(copy_batch(value) for value in batch)
    return batch


def take_results(results: Results, positions: np.ndarray) -> Results:
    """The entries at ``positions`` of every column of ``results`` (and the resets after those, renumbered)."""
    taken = Results(
        take_columns(results.observation, positions),
        results.reward[positions],
        results.done[positions],
        None if results.metadata is None else [results.metadata[p] for p in positions.tolist()],
        None,
    )
    if results.after_rows is not None and results.after is not None:
        renumber = np.full(len(results.done), -1, dtype=np.int64)
        renumber[positions] = np.arange(len(positions))
        rows = renumber[results.after_rows]
        kept = np.flatnonzero(rows >= 0)
        after = results.after
        taken.after_rows = rows[kept]
        taken.after = Results(
            take_columns(after.observation, kept),
            after.reward[kept],
            after.done[kept],
            None if after.metadata is None else [after.metadata[p] for p in kept.tolist()],
            None if after.errors is None else [after.errors[p] for p in kept.tolist()],
        )
    return taken


def take_info(infos: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Rows ``rows`` of a batched info dict (arrays and ``_key`` masks alike)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = take_info(value, rows)
        elif isinstance(value, np.ndarray):
            out[key] = value[rows]
        else:
            out[key] = value
    return out


def take_columns(columns: Mapping[str, Column], positions: np.ndarray | slice) -> dict[str, Column]:
    """The entries at ``positions`` (indices, or a slice) of each column."""
    out: dict[str, Column] = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray) or isinstance(positions, slice):
            out[name] = column[positions]
        else:
            out[name] = [column[p] for p in positions.tolist()]
    return out
