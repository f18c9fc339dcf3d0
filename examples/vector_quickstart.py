"""Vector quickstart: ``gymnasium.make_vec`` with 16 remote envs over 2 local servers.

Starts two local openenv_gym servers hosting CartPole-v1, makes one vector env
of 16 sessions spread over both, steps it with random actions and prints the
episode returns that Gymnasium's ``RecordEpisodeStatistics`` wrapper sees.

    python examples/vector_quickstart.py [--num-envs 16] [--servers 2] [--steps 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import openenv_gym


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the example; returns ``{"episodes", "mean_return", "steps_per_s"}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500, help="vector steps (each steps every env)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with openenv_gym.launch_local("CartPole-v1", servers=args.servers) as urls:
        print(f"servers: {', '.join(urls)}")
        envs = gym.make_vec("openenv_gym/Remote-v0", num_envs=args.num_envs, base_url=urls)
        envs = RecordEpisodeStatistics(envs, buffer_length=10_000)
        print(f"{envs.num_envs} envs, autoreset {envs.metadata['autoreset_mode'].name}")
        print(f"per env: observation space {envs.single_observation_space}, action space {envs.single_action_space}")
        print(f"batched: observation space shape {envs.observation_space.shape}, action space {envs.action_space}")

        envs.action_space.seed(args.seed)
        obs, _ = envs.reset(seed=args.seed)
        assert obs.shape == (args.num_envs, 4) and obs.dtype == np.float32
        start = time.perf_counter()
        for _step in range(args.steps):
            obs, rewards, terminations, truncations, _ = envs.step(envs.action_space.sample())
            assert rewards.shape == terminations.shape == truncations.shape == (args.num_envs,)
        elapsed = time.perf_counter() - start
        returns = np.asarray(envs.return_queue, dtype=np.float64)
        envs.close()

    steps_per_s = args.steps * args.num_envs / elapsed
    mean_return = float(returns.mean()) if returns.size else float("nan")
    print(f"{args.steps} vector steps = {args.steps * args.num_envs} env steps in {elapsed:.2f} s ({steps_per_s:,.0f} env steps/s)")
    print(f"{returns.size} episodes finished, mean return {mean_return:.1f} (random actions)")
    return {"episodes": float(returns.size), "mean_return": mean_return, "steps_per_s": steps_per_s}


if __name__ == "__main__":
    main()
