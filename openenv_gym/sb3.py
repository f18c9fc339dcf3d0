"""Stable-Baselines3 over a pool: a Gymnasium ``VectorEnv`` as an SB3 ``VecEnv``.

SB3 trains on its own ``VecEnv`` API, not on Gymnasium's vector envs. Handed
single envs (``make_vec_env``), it steps them one after the other in its
``DummyVecEnv``: for remote envs, one round trip per env and step.
:class:`SB3VecEnv` puts a whole :class:`~openenv_gym.OpenEnvVectorEnv` behind
that API instead, so that one step of all envs is one step of the pool::

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor
    from openenv_gym import OpenEnvVectorEnv
    from openenv_gym.sb3 import SB3VecEnv

    pool = OpenEnvVectorEnv(url, 8, autoreset_mode="SameStep")
    model = PPO("MlpPolicy", VecMonitor(SB3VecEnv(pool))).learn(10_000)

It returns what ``DummyVecEnv`` returns for the same envs, seeds and actions:
SB3 resets an env in the step that ends its episode, which is Gymnasium's
``SAME_STEP`` autoreset mode, so the pool must be made in that mode. Needs
``stable-baselines3`` (``pip install "openenv-gym[sb3]"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from .vector.batch import Batch
from .vector.infos import Infos

__all__ = ["SB3VecEnv", "list_infos"]

# Keys of a SAME_STEP step info that are not the envs' own.
_FINAL_KEYS = frozenset({"final_obs", "_final_obs", "final_info", "_final_info"})


class SB3VecEnv(VecEnv):
    """An SB3 ``VecEnv`` over a Gymnasium ``VectorEnv`` in ``SAME_STEP`` autoreset mode.

    Args:
        envs: usually an :class:`~openenv_gym.OpenEnvVectorEnv` made with
            ``autoreset_mode="SameStep"``; any Gymnasium ``VectorEnv`` in that
            mode works. Closing this closes it.

    What SB3 gets, as from ``DummyVecEnv``:

    - ``reset()`` returns the batch of observations (an array of shape
      ``(num_envs, *obs_shape)``, or a dict of such arrays) and keeps the
      envs' reset infos in ``reset_infos``; seeds from ``seed()`` and options
      from ``set_options()`` are used once, at the next ``reset()``.
    - ``step_wait()`` returns ``(obs, rewards, dones, infos)``: rewards as
      float32 of shape ``(num_envs,)``, ``dones`` as bool (terminated or
      truncated), ``infos`` a list of one dict per env. Where an episode ended,
      ``obs`` is the next episode's first observation, the env's dict holds
      ``terminal_observation`` (the last one) and
      ``"TimeLimit.truncated"`` (truncated and not terminated), and the new
      episode's reset info goes to ``reset_infos``.
    - Infos are the envs' own dicts from an ``OpenEnvVectorEnv`` (as its
      wire path gives them: numpy scalars over msgpack, Python numbers over
      JSON). From another vector env they are read back from its batched
      info, where Gymnasium types each key's array by its first env's value.

    Remote envs have no attributes to reach: ``get_attr``, ``set_attr`` and
    ``env_method`` go to the vector env's ``get_attr``/``set_attr``/``call``
    (``OpenEnvVectorEnv`` raises ``AttributeError``), but for
    ``render_mode``, which is the vector env's. ``env_is_wrapped`` is False
    for every env: their wrappers, if any, are on the servers.
    """

    def __init__(self, envs: VectorEnv) -> None:
        if not isinstance(envs, VectorEnv):
            raise TypeError(f"SB3VecEnv wraps a gymnasium.vector.VectorEnv, not {type(envs).__name__}")
        mode = envs.metadata.get("autoreset_mode")
        if mode is None or AutoresetMode(mode) != AutoresetMode.SAME_STEP:
            raise ValueError(
                "Stable-Baselines3 resets an env in the step that ends it: make the vector env with "
                f"autoreset_mode=AutoresetMode.SAME_STEP (it has {mode!r})"
            )
        self.envs = envs
        self._actions: Any = None
        # An OpenEnvVectorEnv hands on its envs' infos as they gave them (a batched info types each
        # key by its first env's value: FrozenLake's prob 0.33 read as 0 next to another env's 1).
        batch = getattr(envs, "_batch", None)
        self._kept: Infos | None = batch.infos if isinstance(batch, Batch) else None
        if self._kept is not None:
            self._kept.keep_rows = True
        super().__init__(envs.num_envs, envs.single_observation_space, envs.single_action_space)
        merged: dict[str, Any] = dict(envs.metadata)
        merged.update(getattr(self, "metadata", {}))  # (SB3's render_modes)
        self.metadata = merged

    def reset(self) -> VecEnvObs:
        """Reset every env, with the seeds and options given since the last reset."""
        # Gymnasium's vector envs take a list of seeds, one per env (typed as an int only).
        seeds: Any = None if all(seed is None for seed in self._seeds) else list(self._seeds)
        groups: dict[str, list[int]] = {}
        for index, options in enumerate(self._options):
            groups.setdefault(repr(sorted(options.items())) if options else "", []).append(index)
        if len(groups) == 1:
            obs, info = self.envs.reset(seed=seeds, options=self._options[0] or None)
            self.reset_infos = [merged for merged, _ in self._infos(info)]
        else:
            # Envs with other options: one partial reset per set of options.
            for indices in groups.values():
                mask = np.zeros(self.num_envs, dtype=np.bool_)
                mask[indices] = True
                obs, info = self.envs.reset(seed=seeds, options={**self._options[indices[0]], "reset_mask": mask})
                rows = self._infos(info)
                for index in indices:
                    self.reset_infos[index] = rows[index][0]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Keep the actions (shape ``(num_envs, *action_shape)``) for ``step_wait``."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env with the actions of ``step_async``; see the class docstring."""
        actions, self._actions = self._actions, None
        if actions is None:
            raise RuntimeError("step_wait() without step_async()")
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        dones = np.logical_or(terminated, truncated)
        rows = self._infos(info)
        infos: list[dict[str, Any]] = []
        for index, (merged, final) in enumerate(rows):
            if dones[index] and final is not None:
                # The env's own info is its new episode's reset info; its step's is final_info.
                self.reset_infos[index] = merged
                final_obs, merged = final
                merged = {**merged, "terminal_observation": final_obs}
            merged["TimeLimit.truncated"] = bool(truncated[index] and not terminated[index])
            infos.append(merged)
        return obs, np.asarray(rewards, dtype=np.float32), dones, infos

    def _infos(self, info: dict[str, Any]) -> list[tuple[dict[str, Any], tuple[Any, dict[str, Any]] | None]]:
        """Per env: its info, and ``(final_obs, final_info)`` where its episode ended in this step (else ``None``)."""
        n = self.num_envs
        if self._kept is not None:  # the envs' own dicts, in the order they came (a step's final entry, then the reset's info)
            given = self._kept.rows
            out: list[tuple[dict[str, Any], tuple[Any, dict[str, Any]] | None]] = []
            for index in range(n):
                merged: dict[str, Any] = {}
                final = None
                for entry in given.get(index, ()):
                    if "final_obs" in entry and "final_info" in entry:  # (with openenv_error for a failed step)
                        final = (entry["final_obs"], dict(entry["final_info"]))
                        merged.update((k, v) for k, v in entry.items() if k not in _FINAL_KEYS)
                    else:
                        merged.update(entry)
                out.append((merged, final))
            return out
        own = list_infos({key: value for key, value in info.items() if key not in _FINAL_KEYS}, n)
        finals = list_infos(info.get("final_info", {}), n) if "final_obs" in info else None
        ended = info.get("_final_obs", np.zeros(n, dtype=np.bool_))
        return [
            (own[index], (info["final_obs"][index], finals[index]) if finals is not None and ended[index] else None) for index in range(n)
        ]

    def close(self) -> None:
        self.envs.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        targets = list(self._get_indices(indices))
        if attr_name == "render_mode":
            return [self.envs.render_mode] * len(targets)
        values = self._vector_method("get_attr")(attr_name)
        return [values[index] for index in targets]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        targets = list(self._get_indices(indices))
        if targets == list(range(self.num_envs)):
            self._vector_method("set_attr")(attr_name, [value] * self.num_envs)  # (a list value is the value, as SB3's)
            return
        values = list(self._vector_method("get_attr")(attr_name))
        for index in targets:
            values[index] = value
        self._vector_method("set_attr")(attr_name, values)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        results = self._vector_method("call")(method_name, *method_args, **method_kwargs)
        return [results[index] for index in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]

    def render(self, mode: str | None = None) -> np.ndarray | None:
        return None

    def _vector_method(self, name: str) -> Any:
        """``get_attr``, ``set_attr`` or ``call`` of the vector env (Gymnasium's base class has none)."""
        method = getattr(self.envs, name, None)
        if method is None:
            raise AttributeError(f"{type(self.envs).__name__} has no {name}(): its envs' attributes are out of reach")
        return method


def list_infos(info: dict[str, Any], num_envs: int, indices: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """One dict per env from a Gymnasium vector info (values under their ``_key`` masks).

    Args:
        info: a batched info, as ``VectorEnv.step`` returns it.
        num_envs: the number of envs it batches.
        indices: the envs to return dicts for, in this order (all by default).

    Returns:
        A list of dicts, the i-th holding what env ``indices[i]`` put in ``info``.
    """
    rows: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if key.startswith("_") and key[1:] in info:
            continue
        mask = info.get(f"_{key}")
        if isinstance(value, dict):
            values: Sequence[Any] = list_infos(value, num_envs)
        else:
            values = value
        for index in range(num_envs):
            if mask is None or mask[index]:
                rows[index][key] = values[index]
    if indices is None:
        return rows
    return [rows[index] for index in indices]
