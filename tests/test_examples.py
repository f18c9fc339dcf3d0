"""Every example runs, with short settings, so that none of them can rot.

Each test calls an example's ``main([...])`` in-process (the examples start
their own local servers) and checks what it returns.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest


def example(name: str):
    """The module ``examples/<name>.py`` (``examples`` is a package at the repository root)."""
    return importlib.import_module(f"examples.{name}")


def test_quickstart_plays_one_episode():
    episode_return = example("quickstart").main(["--seed", "0"])
    assert episode_return >= 1.0


def test_vector_quickstart_steps_16_envs_over_2_servers():
    result = example("vector_quickstart").main(["--num-envs", "16", "--servers", "2", "--steps", "100", "--seed", "0"])
    assert result["episodes"] > 0
    assert 8.0 <= result["mean_return"] <= 100.0  # random actions on CartPole
    assert result["steps_per_s"] > 0


def test_async_agents_send_recv_outpaces_lockstep():
    result = example("async_agents").main(["--num-envs", "32", "--batch-size", "8", "--duration", "1.5"])
    assert result["lockstep_steps_per_s"] > 0
    # Lockstep waits for the slowest of 32 envs every step; send/recv does not.
    assert result["async_steps_per_s"] > result["lockstep_steps_per_s"]


def test_openenv_environment_same_episodes_on_stock_and_openenv_gym_servers():
    pytest.importorskip("openenv")
    pytest.importorskip("uvicorn")
    results = example("openenv_environment").main(["--episodes", "3", "--seed", "0"])
    assert {label: r["codec"] for label, r in results.items()} == {
        "stock": "json",
        "openenv_gym": "msgpack",
        "openenv_gym_json": "json",
    }
    for r in results.values():
        assert r["mean_return"] == 1.0  # binary search always finds the number
        assert r["trajectories"] == results["stock"]["trajectories"]


def test_tool_calls_agent_answers_every_episode():
    pytest.importorskip("openenv")
    result = example("tool_calls").main(["--episodes", "2", "--num-envs", "3", "--seed", "0"])
    assert result["mean_return"] == 1.0 and result["vector_returns"] == [1.0, 1.0, 1.0]


def test_sb3_ppo_trains_through_the_pool(monkeypatch, tmp_path):
    pytest.importorskip("stable_baselines3")
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path))  # (SB3 makes a log folder per learn(), in /tmp by default)
    result = example("sb3_cartpole").main(["--num-envs", "4", "--total-steps", "512", "--n-steps", "64", "--eval-episodes", "2"])
    assert result["env_steps"] == 512
    assert result["train_mean_return"] > 0  # episodes ended and VecMonitor saw them
    assert result["eval_mean_return"] >= 1.0


# ---------------------------------------------------------------- PPO


def test_ppo_gae_keeps_next_step_reset_steps_out():
    pytest.importorskip("torch")
    gae = example("ppo_cartpole").gae
    # One env; step 1 ends the episode, step 2 is the NEXT_STEP reset step
    # (reward 0, action ignored); values[2] is the value of the final observation.
    rewards = np.array([[1.0], [1.0], [0.0], [1.0]], dtype=np.float32)
    values = np.array([[10.0], [20.0], [30.0], [40.0]], dtype=np.float32)
    next_value = np.array([50.0], dtype=np.float32)
    ended = np.array([[0.0], [1.0], [0.0], [0.0]], dtype=np.float32)

    terminated = ended.copy()
    adv = gae(rewards, values, next_value, terminated, ended, gamma=1.0, lam=1.0)
    assert adv[3, 0] == pytest.approx(1.0 + 50.0 - 40.0)
    assert adv[1, 0] == pytest.approx(1.0 - 20.0)  # no bootstrap past a termination
    assert adv[0, 0] == pytest.approx(1.0 + 1.0 - 10.0)  # nothing flows back from the reset step

    truncated_only = np.zeros_like(ended)
    adv = gae(rewards, values, next_value, truncated_only, ended, gamma=1.0, lam=1.0)
    assert adv[1, 0] == pytest.approx(1.0 + 30.0 - 20.0)  # truncation bootstraps from the final observation
    assert adv[0, 0] == pytest.approx(1.0 + 1.0 + 30.0 - 10.0)


def test_ppo_cartpole_runs_its_loop_with_tiny_settings():
    pytest.importorskip("torch")
    result = example("ppo_cartpole").main(
        ["--num-envs", "4", "--total-steps", "512", "--rollout-steps", "32", "--eval-episodes", "2", "--seed", "0"]
    )
    assert result.env_steps == 512 and result.updates == 4
    assert math.isfinite(result.train_mean_return) and result.train_mean_return > 0
    assert math.isfinite(result.eval_mean_return) and result.eval_mean_return >= 1.0
    assert result.wall_time > 0


def test_ppo_cartpole_stops_at_the_target():
    pytest.importorskip("torch")
    result = example("ppo_cartpole").main(
        ["--num-envs", "4", "--total-steps", "100000", "--rollout-steps", "32", "--eval-episodes", "2", "--target", "1"]
    )
    # 20 finished episodes of return >= 1 come within a few updates, far below the budget.
    assert result.env_steps < 5_000
    assert result.train_mean_return >= 1
