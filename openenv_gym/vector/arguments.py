"""A pool's arguments checked as Gymnasium checks them: keyword arguments, sizes, reset seeds and masks."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
from gymnasium.utils.seeding import np_random

__all__ = ["SINGLE_ENV_ONLY", "check_sizes", "refuse_unused", "reset_ids", "reset_seeds"]

logger = logging.getLogger("openenv_gym.vector.env")

#: OpenEnvEnv options a pool takes and ignores (a registered remote env may carry them into make_vec).
SINGLE_ENV_ONLY = frozenset({"offer_msgpack", "render_mode", "disable_env_checker"})


def refuse_unused(unused: Mapping[str, Any]) -> None:
    """Refuse keyword arguments a pool does not take, but for :data:`SINGLE_ENV_ONLY` ones (ignored)."""
    unknown = sorted(set(unused) - SINGLE_ENV_ONLY)
    if unknown:  # (a misspelt option must not pass silently)
        raise TypeError(f"OpenEnvVectorEnv got unexpected keyword arguments {unknown}")
    if unused.get("render_mode") is not None:  # (as OpenEnvEnv: a mode cannot be served)
        raise ValueError(
            f"remote envs do not render (the OpenEnv protocol has no frames to give); got render_mode={unused['render_mode']!r}"
        )
    if unused:
        # gymnasium.make_vec passes every registered kwarg, single-env ones included.
        logger.debug("OpenEnvVectorEnv ignores %s", sorted(unused))


def check_sizes(urls: Sequence[str], num_envs: int, batch_size: int | None, max_episode_steps: Any, request_size: int | None) -> None:
    """Refuse sizes a pool cannot have (as ``ValueError``, naming the argument)."""
    if not urls:
        raise ValueError("base_url must name at least one server")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if not 1 <= (num_envs if batch_size is None else int(batch_size)) <= num_envs:
        raise ValueError(f"batch_size must be in [1, num_envs={num_envs}], got {batch_size}")
    if max_episode_steps is not None and not (isinstance(max_episode_steps, int) and max_episode_steps > 0):
        raise ValueError(f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}")  # (as TimeLimit)
    if request_size is not None and request_size < 1:
        raise ValueError(f"request_size must be >= 1, got {request_size}")


def reset_seeds(seed: int | list[int | None] | None, num_envs: int) -> list[int | None]:
    """Each env's reset seed, as ``SyncVectorEnv`` gives them (checked here, as each env's reset would)."""
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, int):
        seeds = [seed + i for i in range(num_envs)]
    else:
        seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"If seeds are passed as a list the length must match num_envs={num_envs} but got length={len(seeds)}.")
    for s in seeds:  # (nothing is reset if one is bad)
        if s is not None and not (isinstance(s, int) and s >= 0):
            np_random(s)  # raises Gymnasium's own error for it
    return seeds


def reset_ids(options: dict[str, Any] | None, num_envs: int) -> np.ndarray:
    """The envs a reset resets: those of ``options["reset_mask"]`` (popped; checked as ``SyncVectorEnv`` does), else all."""
    if options is None or "reset_mask" not in options:
        return np.arange(num_envs)
    reset_mask = options.pop("reset_mask")
    if not isinstance(reset_mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
    if reset_mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {reset_mask.shape}")
    if reset_mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}")
    if not np.any(reset_mask):
        raise ValueError(f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={reset_mask}")
    return np.flatnonzero(reset_mask)
