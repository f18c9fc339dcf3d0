"""``/schema`` for a hosted Gymnasium environment. No I/O.

The response has the stock OpenEnv keys (``action``, ``observation``,
``reset_observation``, ``state``: JSON Schemas shaped like the ones pydantic
writes for OpenEnv's ``Action``/``Observation``/``State`` models), so every
OpenEnv client can read it, plus the extension block :data:`EXTENSION_KEY`
with the exact Gymnasium spaces::

    "x-openenv-gym": {
        "version": 1,
        "observation_space": describe_space(env.observation_space),
        "action_space": describe_space(env.action_space),
        "obs_key": "observation",
        "action_key": "action",
        "truncated_key": "truncated"
    }

JSON Schema bounds are written only where they are finite and equal over the
whole array, so the document never holds a non-finite number.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = [
    "EXTENSION_KEY",
    "EXTENSION_VERSION",
    "OBS_KEY",
    "ACTION_KEY",
    "TRUNCATED_KEY",
    "TERMINATED_KEY",
    "space_json_schema",
    "gym_schema",
    "BASE_OBSERVATION_PROPERTIES",
    "STATE_SCHEMA",
]

EXTENSION_KEY = "x-openenv-gym"
EXTENSION_VERSION = 1
OBS_KEY = "observation"
ACTION_KEY = "action"
TRUNCATED_KEY = "truncated"
#: The observation field of a hosted Gymnasium env that carries Gymnasium's ``terminated`` (with
#: ``truncated``, both can be true: a time limit reached on the terminal step; ``done`` alone cannot say so).
TERMINATED_KEY = "terminated"

_METADATA_SCHEMA: dict[str, Any] = {
    "additionalProperties": True,
    "description": "Additional metadata for the observation",
    "title": "Metadata",
    "type": "object",
}

#: The fields every OpenEnv observation has (as in openenv's ``Observation`` model).
BASE_OBSERVATION_PROPERTIES: dict[str, Any] = {
    "done": {"default": False, "description": "Whether the episode has terminated", "title": "Done", "type": "boolean"},
    "reward": {
        "anyOf": [{"type": "boolean"}, {"type": "integer"}, {"type": "number"}, {"type": "null"}],
        "default": None,
        "description": "Reward signal from the last action",
        "title": "Reward",
    },
    "metadata": _METADATA_SCHEMA,
}

#: openenv's ``State`` model schema: ``episode_id`` and ``step_count``.
STATE_SCHEMA: dict[str, Any] = {
    "additionalProperties": True,
    "description": "Episode id and steps taken in the current episode.",
    "properties": {
        "episode_id": {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "default": None,
            "description": "Unique identifier for the current episode",
            "title": "Episode Id",
        },
        "step_count": {
            "default": 0,
            "description": "Number of steps taken in the current episode",
            "minimum": 0,
            "title": "Step Count",
            "type": "integer",
        },
    },
    "title": "State",
    "type": "object",
}


def _scalar_type(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "boolean"
    if dtype.kind in "iu":
        return "integer"
    return "number"


def _uniform_bound(values: np.ndarray, integer: bool) -> int | float | None:
    """The common value of ``values`` if they are all equal and finite, else ``None``."""
    if values.size == 0:
        return None
    first = values.flat[0]
    if not np.all(values == first):
        return None
    if integer:
        return int(first)
    value = float(first)
    return value if math.isfinite(value) else None


def _nested_array(item: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    schema = item
    for n in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": int(n), "maxItems": int(n)}
    return schema


def _numeric_item(dtype: np.dtype, low: np.ndarray | None, high: np.ndarray | None) -> dict[str, Any]:
    kind = _scalar_type(dtype)
    item: dict[str, Any] = {"type": kind}
    if kind != "boolean":
        integer = kind == "integer"
        if low is not None:
            lo = _uniform_bound(low, integer)
            if lo is not None:
                item["minimum"] = lo
        if high is not None:
            hi = _uniform_bound(high, integer)
            if hi is not None:
                item["maximum"] = hi
    return item


def space_json_schema(space: spaces.Space) -> dict[str, Any]:
    """A JSON Schema for the values of ``space`` as they travel in JSON.

    Box -> nested fixed-length arrays (``minItems == maxItems`` at each level) of
    ``number``/``integer``/``boolean``, with ``minimum``/``maximum`` only when
    every bound is equal and finite (a shape ``()`` Box is a bare scalar);
    Discrete -> ``integer`` with ``minimum``/``maximum``; MultiBinary and
    MultiDiscrete -> nested arrays of integers; Dict -> ``object`` with all keys
    required; Tuple -> fixed-length array with ``prefixItems``; Text -> ``string``;
    Sequence -> open-length array of its feature space's values; any other space -> ``{}`` (any value) with a description.
    """
    if isinstance(space, spaces.Box):
        item = _numeric_item(space.dtype, np.asarray(space.low), np.asarray(space.high))
        return _nested_array(item, space.shape)
    if isinstance(space, spaces.Discrete):
        first = int(space.start)
        return {"type": "integer", "minimum": first, "maximum": first + int(space.n) - 1}
    if isinstance(space, spaces.MultiBinary):
        return _nested_array({"type": "integer", "minimum": 0, "maximum": 1}, tuple(space.shape))
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        start = np.asarray(space.start)
        item = _numeric_item(np.dtype(np.int64), start, start + nvec - 1)
        return _nested_array(item, tuple(space.shape))
    if isinstance(space, spaces.Dict):
        props = {str(key): space_json_schema(sub) for key, sub in space.spaces.items()}
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    if isinstance(space, spaces.Tuple):
        items = [space_json_schema(sub) for sub in space.spaces]
        n = len(items)
        return {"type": "array", "prefixItems": items, "items": False, "minItems": n, "maxItems": n}
    if isinstance(space, spaces.Text):
        return {"type": "string", "minLength": int(space.min_length), "maxLength": int(space.max_length)}
    if isinstance(space, spaces.Sequence):
        return {"type": "array", "items": space_json_schema(space.feature_space)}
    return {"description": f"a value of the Gymnasium space {space}"}


def gym_schema(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    title: str = "Gym",
    max_episode_steps: int | None = None,
) -> dict[str, Any]:
    """The ``/schema`` response for a Gymnasium env with these spaces (and the time limit its spec has, if any).

    Raises:
        SpaceMappingError: (from :func:`openenv_gym.spaces.describe_space`) a space
            that cannot be described exactly.
    """
    from ...spaces import describe_space  # imported lazily: only servers of Gymnasium envs need it

    observation = {
        "additionalProperties": False,
        "description": "A Gymnasium observation; done = terminated or truncated.",
        "properties": {
            OBS_KEY: {**space_json_schema(observation_space), "title": "Observation"},
            TRUNCATED_KEY: {
                "default": False,
                "description": "Whether the episode ended by truncation (Gymnasium's truncated)",
                "title": "Truncated",
                "type": "boolean",
            },
            TERMINATED_KEY: {
                "default": False,
                "description": "Whether the episode ended in a terminal state (Gymnasium's terminated)",
                "title": "Terminated",
                "type": "boolean",
            },
            **BASE_OBSERVATION_PROPERTIES,
        },
        "required": [OBS_KEY],
        "title": f"{title}Observation",
        "type": "object",
    }
    action = {
        "additionalProperties": False,
        "description": "A Gymnasium action.",
        "properties": {
            ACTION_KEY: {**space_json_schema(action_space), "title": "Action"},
            "metadata": {
                "additionalProperties": True,
                "description": "Additional metadata for the action (ignored)",
                "title": "Metadata",
                "type": "object",
            },
        },
        "required": [ACTION_KEY],
        "title": f"{title}Action",
        "type": "object",
    }
    return {
        "action": action,
        "observation": observation,
        "reset_observation": observation,
        "state": STATE_SCHEMA,
        EXTENSION_KEY: {
            "version": EXTENSION_VERSION,
            "observation_space": describe_space(observation_space),
            "action_space": describe_space(action_space),
            "obs_key": OBS_KEY,
            "action_key": ACTION_KEY,
            "truncated_key": TRUNCATED_KEY,
            "terminated_key": TERMINATED_KEY,
            **({"max_episode_steps": int(max_episode_steps)} if max_episode_steps else {}),
        },
    }
