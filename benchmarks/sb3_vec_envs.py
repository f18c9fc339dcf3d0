"""Stable-Baselines3's VecEnv step over remote envs: the pool (SB3VecEnv) against SB3's own VecEnvs.

Setups, measured in one run in interleaved trials (median reported):

- ``SB3VecEnv(OpenEnvVectorEnv)``: one pool, SAME_STEP autoreset;
- ``DummyVecEnv`` of ``OpenEnvEnv``s: what ``make_vec_env`` builds from a
  remote env id, one round trip per env and step;
- ``SubprocVecEnv`` of ``OpenEnvEnv``s: one process per env (``--subproc``);
- ``DummyVecEnv`` of local CartPole-v1, in-process: no network at all.

The remote setups share two local openenv_gym servers of CartPole-v1.

    python benchmarks/sb3_vec_envs.py [--num-envs 8] [--seconds 3] [--trials 3] [--subproc]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Callable

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

import openenv_gym
from openenv_gym.sb3 import SB3VecEnv


def steps_per_s(envs: VecEnv, seconds: float, seed: int) -> float:
    """Env steps per second of ``envs.step`` with random CartPole actions, for ``seconds`` of wall time."""
    rng = np.random.default_rng(seed)
    envs.seed(seed)
    envs.reset()
    for _ in range(20):  # warm up
        envs.step(rng.integers(0, 2, envs.num_envs))
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(rng.integers(0, 2, envs.num_envs))
        steps += 1
    return steps * envs.num_envs / (time.perf_counter() - start)


def remote_env(url: str) -> Callable[[], gym.Env]:
    return lambda: gym.make(openenv_gym.REMOTE_ID, base_url=url)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--subproc", action="store_true", help="add SubprocVecEnv of OpenEnvEnvs")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    n = args.num_envs
    with openenv_gym.launch_local("CartPole-v1", servers=2, max_sessions=4 * n) as urls:
        setups: dict[str, VecEnv] = {
            "SB3VecEnv(OpenEnvVectorEnv)": SB3VecEnv(openenv_gym.OpenEnvVectorEnv(urls, n, autoreset_mode="SameStep")),
            "DummyVecEnv of OpenEnvEnvs": DummyVecEnv([remote_env(urls[i % 2]) for i in range(n)]),
            "DummyVecEnv, local CartPole": DummyVecEnv([lambda: gym.make("CartPole-v1") for _ in range(n)]),
        }
        if args.subproc:
            setups["SubprocVecEnv of OpenEnvEnvs"] = SubprocVecEnv([remote_env(urls[i % 2]) for i in range(n)])
        runs: dict[str, list[float]] = {name: [] for name in setups}
        try:
            for trial in range(args.trials):
                for name, envs in setups.items():
                    runs[name].append(steps_per_s(envs, args.seconds, seed=trial))
        finally:
            for envs in setups.values():
                envs.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    pool = medians["SB3VecEnv(OpenEnvVectorEnv)"]
    print(
        f"{n} envs, CartPole-v1, 2 local servers; {args.trials} trials of {args.seconds:g} s; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    )
    print(f"{'setup':32} {'steps/s (median)':>18} {'pool / setup':>13}  trials")
    for name, value in medians.items():
        trials = ", ".join(f"{v:,.0f}" for v in runs[name])
        print(f"{name:32} {value:18,.0f} {pool / value:12.2f}x  {trials}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"num_envs": n, "runs": runs, "medians": medians}, file, indent=1)
    return medians


if __name__ == "__main__":
    main()
