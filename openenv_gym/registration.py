"""Gymnasium registration of remote environments.

``import openenv_gym`` registers ``openenv_gym/Remote-v0``, so that::

    gymnasium.make("openenv_gym/Remote-v0", base_url="http://127.0.0.1:8000")

works with the keyword arguments of :class:`~openenv_gym.env.OpenEnvEnv`, and
``gymnasium.make_vec("openenv_gym/Remote-v0", num_envs=N, base_url=...)`` returns
an :class:`~openenv_gym.OpenEnvVectorEnv`.
:func:`register_remote` gives a remote environment a name of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

__all__ = ["REMOTE_ID", "register_remote"]

#: The generic remote environment id; pass ``base_url=`` to ``gymnasium.make``.
REMOTE_ID = "openenv_gym/Remote-v0"

_ENTRY_POINT = "openenv_gym.env:OpenEnvEnv"
_VECTOR_ENTRY_POINT = "openenv_gym.vector:OpenEnvVectorEnv"


def register_remote(
    env_id: str,
    base_url: str | Sequence[str],
    *,
    max_episode_steps: int | None = None,
    nondeterministic: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``env_id`` as the remote environment served at ``base_url``.

    Afterwards ``gymnasium.make(env_id)`` returns an :class:`~openenv_gym.env.OpenEnvEnv`
    connected to ``base_url`` and ``gymnasium.make_vec(env_id, num_envs=N)`` an
    :class:`~openenv_gym.OpenEnvVectorEnv` of ``N`` sessions; ``kwargs`` (for example ``truncated_key=``,
    ``headers=``) are its default constructor arguments and may be overridden
    in ``make``. ``max_episode_steps`` adds Gymnasium's ``TimeLimit``. Set
    ``nondeterministic`` when the server does not reproduce episodes from seeds.
    ``base_url`` may list several servers (what ``launch_local`` yields):
    ``make_vec`` then spreads its sessions over them, while ``make`` needs one
    (``gymnasium.make(env_id, base_url=url)``; without it, ``TypeError``).

    Example::

        openenv_gym.register_remote("openenv/CartPole-v1", "http://127.0.0.1:8000")
        env = gymnasium.make("openenv/CartPole-v1")

    Raises:
        ValueError: ``ssl=`` given: Gymnasium deep-copies registered kwargs,
            and an ``SSLContext`` cannot be copied; pass it to ``make`` instead.
    """
    if kwargs.get("ssl") is not None:
        raise ValueError(
            "register_remote cannot hold ssl= (gymnasium deep-copies registered kwargs, and an SSLContext "
            "cannot be copied); pass it to gymnasium.make(..., ssl=ctx) or make_vec instead"
        )
    gym.register(
        id=env_id,
        entry_point=_ENTRY_POINT,
        vector_entry_point=_VECTOR_ENTRY_POINT,
        max_episode_steps=max_episode_steps,
        nondeterministic=nondeterministic,
        kwargs={"base_url": base_url, **kwargs},
    )


def _register_builtin() -> None:
    if REMOTE_ID not in gym.registry:
        gym.register(id=REMOTE_ID, entry_point=_ENTRY_POINT, vector_entry_point=_VECTOR_ENTRY_POINT)


def with_time_limit(spec: EnvSpec | None, *limits: int | None) -> EnvSpec | None:
    """``spec`` saying the smallest of ``limits`` (steps; ``None``: none) when it says no time limit itself.

    A remote env's server truncates by its own limit, which ``gymnasium.make``
    cannot know: the env puts it in the spec it is given, as a local env's says it.
    """
    known = [n for n in limits if n is not None]
    if spec is None or spec.max_episode_steps is not None or not known:
        return spec
    return dataclasses.replace(spec, max_episode_steps=min(known))
