"""Stable-Baselines3's PPO on remote CartPole-v1, through the session pool.

Two local openenv_gym servers host CartPole-v1; one ``OpenEnvVectorEnv`` of
``--num-envs`` sessions, in Gymnasium's ``SAME_STEP`` autoreset mode (SB3's
own), goes to SB3 as a ``VecEnv`` through ``openenv_gym.sb3.SB3VecEnv``, and
SB3's ``VecMonitor`` records the episodes. After training, SB3's
``evaluate_policy`` plays ``--eval-episodes`` greedy episodes on the same envs.

Needs Stable-Baselines3 (``pip install "openenv-gym[sb3]"``).

    python examples/sb3_cartpole.py [--num-envs 8] [--total-steps 50000] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

import openenv_gym
from openenv_gym.sb3 import SB3VecEnv


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train, evaluate, print, and return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--total-steps", type=int, default=50_000, help="env step budget")
    parser.add_argument("--n-steps", type=int, default=128, help="vector steps per PPO rollout")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # the servers need the other cores
    with openenv_gym.launch_local("CartPole-v1", servers=args.servers) as urls:
        pool = openenv_gym.OpenEnvVectorEnv(urls, args.num_envs, autoreset_mode="SameStep")
        envs = VecMonitor(SB3VecEnv(pool))
        try:
            model = PPO("MlpPolicy", envs, n_steps=args.n_steps, batch_size=64, seed=args.seed, verbose=0)
            start = time.perf_counter()
            model.learn(total_timesteps=args.total_steps)
            train_time = time.perf_counter() - start
            episodes = [info["r"] for info in model.ep_info_buffer]
            eval_mean, eval_std = evaluate_policy(model, envs, n_eval_episodes=args.eval_episodes)
        finally:
            envs.close()
    result = {
        "env_steps": float(model.num_timesteps),
        "train_time": train_time,
        "train_mean_return": float(np.mean(episodes)) if episodes else float("nan"),
        "eval_mean_return": float(eval_mean),
    }
    print(
        f"PPO with {args.num_envs} remote envs on {args.servers} servers: {model.num_timesteps} env steps "
        f"in {train_time:.1f} s; mean return of the last {len(episodes)} training episodes "
        f"{result['train_mean_return']:.1f}"
    )
    print(f"greedy evaluation: {eval_mean:.1f} +- {eval_std:.1f} over {args.eval_episodes} episodes")
    return result


if __name__ == "__main__":
    main()
