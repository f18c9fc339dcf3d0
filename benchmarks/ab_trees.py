"""A/B of two checkouts of openenv_gym: the pool's steps/s, client and server CPU, in alternating rounds.

Each round steps ``OpenEnvVectorEnv`` (64 CartPole-v1 envs on two local
servers, lockstep ``step()``) once per checkout, each in a fresh process whose
``PYTHONPATH`` is that checkout (its servers too), the order swapped every
round, then gymnasium's ``SyncVectorEnv`` in this process. On a VM whose speed
moves by a third from one hour to the next, only such side-by-side rounds say
whether a change helped: the per-round ratio is reported with the medians.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_trees.py /tmp/before . [--rounds 8] [--steps 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
NUM_ENVS = 64


def one(steps: int) -> dict[str, Any]:
    """Step a pool of the checkout on ``sys.path`` (after 100 warm-up steps); what ``wire_floor.run`` measures."""
    sys.path.insert(0, str(HERE))
    import wire_floor

    from openenv_gym import OpenEnvVectorEnv, launch_local

    actions = np.random.default_rng(0).integers(0, 2, (steps + 100, NUM_ENVS))
    with launch_local("CartPole-v1", servers=2, max_sessions=NUM_ENVS) as urls:
        envs = OpenEnvVectorEnv(urls, NUM_ENVS)
        try:
            envs.reset(seed=0)
            return wire_floor.run(envs.step, actions, wire_floor._children())
        finally:
            envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="a checkout of openenv_gym (its top directory)")
    parser.add_argument("after", help="another checkout")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.steps)))
        return
    sys.path.insert(0, str(HERE))
    import wire_floor

    trees = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    for name, tree in trees.items():
        if not (Path(tree) / "openenv_gym" / "__init__.py").is_file():
            sys.exit(f"{name}: no openenv_gym package in {tree}")
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": [], "SyncVectorEnv": []}
    actions = np.random.default_rng(0).integers(0, 2, (args.steps + 100, NUM_ENVS))
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            env = dict(os.environ, PYTHONPATH=trees[name])
            done = subprocess.run(
                [sys.executable, __file__, trees["before"], trees["after"], "--one", "--steps", str(args.steps)],
                env=env,
                cwd=trees[name],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                sys.exit(f"{name} failed:\n{done.stderr[-2000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        results["SyncVectorEnv"].append(wire_floor.run_sync(actions))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['steps_per_s']:,.0f}" for k, v in results.items()), flush=True)
    from openenv_gym.bench.machine import describe_machine, machine_line

    print(
        f"CartPole-v1, {NUM_ENVS} envs on 2 servers, {args.rounds} rounds of {args.steps} steps, median; {machine_line(describe_machine())}"
    )
    wire_floor.print_table(results, width=14)
    ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(results["after"], results["before"])]
    print(f"after / before, per round: {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)")


if __name__ == "__main__":
    main()
