"""Small environments for benchmarks, registered on ``import openenv_gym``.

- ``openenv_gym/Sleep-v0``: a latency-bound env, the shape of an LLM-agent or
  simulator env: each step sleeps a random time in ``[min_ms, max_ms]``
  milliseconds (uniform, from the env's seeded RNG). Observation
  ``Box(-1, 1, (4,), float32)``, action ``Discrete(2)``, reward 1, episodes of
  ``episode_length`` steps (then truncated).
- ``openenv_gym/Frames-v0``: an Atari-sized frame env: observation
  ``Box(0, 255, (210, 160, 3), uint8)``, action ``Discrete(6)``; each frame
  is drawn from the seeded RNG; episodes of ``episode_length`` steps.
- ``openenv_gym/Null-v0``: CartPole-v1's spaces and no dynamics: a step costs
  next to nothing, so a pool over it measures the cost of the pool, the
  servers and the wire alone, the ceiling of any env's throughput.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["SleepEnv", "FramesEnv", "NullEnv", "register_bench_envs"]


class SleepEnv(gym.Env):
    """Each step sleeps ``min_ms``..``max_ms`` milliseconds (uniform)."""

    metadata = {"render_modes": []}

    def __init__(self, min_ms: float = 1.0, max_ms: float = 20.0, episode_length: int = 100) -> None:
        if not 0 <= min_ms <= max_ms:
            raise ValueError(f"need 0 <= min_ms <= max_ms, got {min_ms}, {max_ms}")
        self.min_ms, self.max_ms, self.episode_length = min_ms, max_ms, episode_length
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: int):
        time.sleep(self.np_random.uniform(self.min_ms, self.max_ms) / 1000.0)
        self._t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, False, self._t >= self.episode_length, {}


class FramesEnv(gym.Env):
    """Atari-sized random frames: 210 x 160 x 3 uint8 (100,800 bytes)."""

    metadata = {"render_modes": []}

    def __init__(self, episode_length: int = 1000) -> None:
        self.episode_length = episode_length
        self.observation_space = spaces.Box(0, 255, (210, 160, 3), np.uint8)
        self.action_space = spaces.Discrete(6)
        self._t = 0

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (210, 160, 3), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: int):
        self._t += 1
        return self._frame(), float(action == 0), False, self._t >= self.episode_length, {}


class NullEnv(gym.Env):
    """CartPole-v1's spaces (``Box(-inf, inf, (4,), float32)``, ``Discrete(2)``); every step returns zeros and reward 1."""

    metadata = {"render_modes": []}

    def __init__(self, episode_length: int = 500) -> None:
        self.episode_length = episode_length
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: int):
        self._t += 1
        return np.zeros(4, np.float32), 1.0, False, self._t >= self.episode_length, {}


def register_bench_envs() -> None:
    """Register ``openenv_gym/Sleep-v0``, ``openenv_gym/Frames-v0`` and ``openenv_gym/Null-v0`` (idempotent)."""
    entry_point: Any
    for env_id, entry_point in (
        ("openenv_gym/Sleep-v0", SleepEnv),
        ("openenv_gym/Frames-v0", FramesEnv),
        ("openenv_gym/Null-v0", NullEnv),
    ):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point)
