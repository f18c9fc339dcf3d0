"""SAME_STEP autoreset with and without the servers' resets within the step's request.

A pool in ``SAME_STEP`` mode resets an env within the step that ends its
episode. Fast-path servers do that reset inside the step's own request
(``autoreset``, ``docs/PROTOCOL.md`` 5.2); without it, every step in which an
episode ends takes a second round trip for the resets. One pool is switched
between the two in alternating blocks of steps (``FastLink.autoreset``), next
to a ``NEXT_STEP`` pool on the same servers, whose steps are one round trip
(on a lane) whatever ends.

    python benchmarks/same_step_autoreset.py [--num-envs 64] [--blocks 12] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import openenv_gym


def run_block(envs: openenv_gym.OpenEnvVectorEnv, actions: np.ndarray) -> float:
    """Env steps per second of ``len(actions)`` lockstep steps."""
    start = time.perf_counter()
    for row in actions:
        envs.step(row)
    return actions.size / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=12, help="blocks per setup, alternating")
    parser.add_argument("--steps", type=int, default=300, help="steps per block")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    runs: dict[str, list[float]] = {"SAME_STEP, resets within the step": [], "SAME_STEP, resets as requests": [], "NEXT_STEP": []}
    with openenv_gym.launch_local("CartPole-v1", servers=args.servers, max_sessions=2 * args.num_envs) as urls:
        same = openenv_gym.OpenEnvVectorEnv(urls, args.num_envs, autoreset_mode="SameStep")
        nxt = openenv_gym.OpenEnvVectorEnv(urls, args.num_envs, autoreset_mode="NextStep")
        try:
            same.reset(seed=0)
            nxt.reset(seed=0)
            links = same._core.links
            for block in range(2 * args.blocks):
                actions = rng.integers(0, 2, (args.steps, args.num_envs))
                within = block % 2 == 0
                for link in links:
                    link.autoreset = within
                name = "SAME_STEP, resets within the step" if within else "SAME_STEP, resets as requests"
                runs[name].append(run_block(same, actions))
                if within:
                    runs["NEXT_STEP"].append(run_block(nxt, actions))
        finally:
            same.close()
            nxt.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    base = medians["SAME_STEP, resets as requests"]
    print(f"{args.num_envs} CartPole-v1 envs on {args.servers} servers; medians of {args.blocks} blocks of {args.steps} steps")
    for name, value in medians.items():
        print(f"{name:36} {value:10,.0f} steps/s  {value / base:5.2f}x")
    return medians


if __name__ == "__main__":
    main()
