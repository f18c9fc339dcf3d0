"""Side-by-side runs of a remote pool and gymnasium's SyncVectorEnv, for conformance tests."""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

__all__ = ["assert_same", "reset_alike", "run_side_by_side", "step_alike", "step_side_by_side"]


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Exact equality of observations, arrays and (nested, masked) info dicts."""
    if isinstance(a, dict):
        assert isinstance(b, dict), f"{where}: {type(b).__name__} is not a dict"
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{where}: {type(b).__name__} is not an array"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert a.tobytes() == b.tobytes(), f"{where}: {a} != {b}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def run_side_by_side(
    make_remote: Callable[[AutoresetMode], Any],
    make_local: Callable[[], gym.Env],
    mode: AutoresetMode,
    *,
    num_envs: int,
    steps: int,
    seed: int = 3,
    exact_spaces: bool = True,
) -> int:
    """Step a remote pool and a local SyncVectorEnv with the same seeds and actions.

    Asserts that every reset and step returns exactly the same thing; returns
    how many episodes ended (so a caller can check the run covered some).
    ``exact_spaces=False`` compares only shapes and dtypes (a stock schema has no bounds).
    """
    local = SyncVectorEnv([make_local] * num_envs, autoreset_mode=mode)
    remote = make_remote(mode)
    try:
        assert remote.metadata["autoreset_mode"] == mode
        if exact_spaces:
            assert remote.single_observation_space == local.single_observation_space
            assert remote.single_action_space == local.single_action_space
        else:
            assert remote.single_observation_space.shape == local.single_observation_space.shape
            assert remote.single_observation_space.dtype == local.single_observation_space.dtype
            assert remote.single_action_space == local.single_action_space
        assert_same(remote.reset(seed=seed), local.reset(seed=seed), "reset")
        return step_side_by_side(remote, local, steps, seed=seed)
    finally:
        remote.close()
        local.close()


def step_side_by_side(remote: Any, local: SyncVectorEnv, steps: int, *, seed: int = 3) -> int:
    """Step a remote pool and a SyncVectorEnv, both reset alike, with the same random actions (of ``Discrete(2)``) ``steps`` times.

    Asserts that every step (and, under ``DISABLED``, every reset of the envs
    that ended) returns exactly the same thing; returns how many episodes ended.
    """
    mode = local.metadata["autoreset_mode"]
    rng = np.random.default_rng(seed)
    ended = 0
    for t in range(steps):
        want = step_alike(remote, local, rng.integers(0, 2, size=local.num_envs), f"step {t}")
        done = want[2] | want[3]
        ended += int(done.sum())
        if mode == AutoresetMode.DISABLED and done.any():
            reset_alike(remote, local, done, f"reset at {t}")
    return ended


def step_alike(remote: Any, local: SyncVectorEnv, actions: Any, where: str) -> tuple:
    """Step both with ``actions``, assert that they return exactly the same; SyncVectorEnv's result."""
    want = local.step(actions)
    got = remote.step(actions)
    for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want):
        assert_same(x, y, f"{where} {name}")
    return want


def reset_alike(remote: Any, local: SyncVectorEnv, mask: np.ndarray, where: str, seeds: list[int] | None = None) -> None:
    """Reset the envs of ``mask`` (with ``seeds``, one per env) in both; assert the same results, and the caller's options dict left alone."""
    options = {"reset_mask": mask}
    assert_same(remote.reset(seed=seeds, options=options), local.reset(seed=seeds, options=dict(options)), where)
    assert options["reset_mask"] is mask
