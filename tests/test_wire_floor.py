"""The wire floor benchmark does the same work as SyncVectorEnv: same seeds, same actions, same transitions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np

_SPEC = importlib.util.spec_from_file_location("wire_floor", Path(__file__).parent.parent / "benchmarks" / "wire_floor.py")
wire_floor = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wire_floor)


def test_the_floor_steps_what_sync_vector_env_steps_with_next_step_autoreset():
    n = 4
    actions = np.random.default_rng(1).integers(0, 2, (120, n))  # random actions end episodes within 120 steps
    floor = wire_floor.Floor(n)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    try:
        sync.reset(seed=0)
        ended = 0
        for t in range(len(actions)):
            floor.step(actions[t])
            obs, rewards, terminated, truncated, _ = sync.step(actions[t])
            np.testing.assert_array_equal(floor.obs, obs)
            np.testing.assert_array_equal(floor.rewards, rewards)
            np.testing.assert_array_equal(floor.terminated, terminated)
            np.testing.assert_array_equal(floor.truncated, truncated)
            ended += int(terminated.sum())
        assert ended > 0  # episodes ended, so the autoreset was compared too
    finally:
        floor.close()
        sync.close()


def test_the_lane_client_steps_what_sync_vector_env_steps_over_real_servers():
    n = 4
    actions = np.random.default_rng(1).integers(0, 2, (120, n))
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    with wire_floor.launch_local("CartPole-v1", servers=2, max_sessions=n) as urls:
        client = wire_floor.LaneClient(urls, n)
        try:
            sync.reset(seed=0)
            ended = 0
            for t in range(len(actions)):
                ours = client.step(actions[t])
                theirs = sync.step(actions[t])
                for a, b in zip(ours[:4], theirs[:4]):
                    np.testing.assert_array_equal(a, b)
                ended += int(theirs[2].sum())
            assert ended > 0  # episodes ended, so the autoreset by reset bytes was compared too
        finally:
            client.close()
            sync.close()


def test_the_ab_of_two_checkouts_steps_each_in_its_own_processes_and_reports_both():
    import subprocess
    import sys

    top = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, str(top / "benchmarks" / "ab_trees.py"), str(top), str(top), "--rounds", "1", "--steps", "200"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for name in ("before", "after", "SyncVectorEnv"):
        row = next(line for line in lines if line.startswith(name))
        assert float(row.split()[1].replace(",", "")) > 0  # steps/s
    assert "after / before, per round:" in lines[-1]
