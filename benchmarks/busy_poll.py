"""Servers that busy-poll (``serve --busy-poll``) against servers that sleep, side by side.

Two local fleets of the same env (by default 64 CartPole-v1 envs on two servers each),
one started with ``--busy-poll MICROSECONDS``, and a pool on each, stepped
in blocks of ``--block`` lockstep steps in ABBA order (so that the VM's
drifting speed falls on both alike). Between steps the trainer may spin the
CPU for ``--work-us`` (a policy computed on the CPU), which is when polling
servers compete with it for the cores. Reports the median steps/s of each
fleet's blocks and their ratio.

    python benchmarks/busy_poll.py [--blocks 60] [--busy-poll 500] [--work-us 0] [--envs 64] [--servers 2] [--unix] [--pin-cpus]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from openenv_gym import OpenEnvVectorEnv, launch_local

WARM_UP = 300


def measure(
    blocks: int,
    block: int,
    busy_poll: int,
    work: float,
    num_envs: int = 64,
    servers: int = 2,
    **fleet: bool,
) -> tuple[list[float], list[float]]:
    """Steps/s of each block: ``(sleeping servers, busy-polling servers)``; ``fleet``: more ``launch_local`` options of both (``unix``, ``pin_cpus``)."""
    actions = np.random.default_rng(0).integers(0, 2, (block, num_envs))
    rates: tuple[list[float], list[float]] = ([], [])
    polling = ["--busy-poll", str(busy_poll)]
    with (
        launch_local("CartPole-v1", servers=servers, max_sessions=num_envs, **fleet) as plain_urls,
        launch_local("CartPole-v1", servers=servers, max_sessions=num_envs, extra_args=polling, **fleet) as polling_urls,
    ):
        pools = [OpenEnvVectorEnv(plain_urls, num_envs), OpenEnvVectorEnv(polling_urls, num_envs)]
        try:
            for pool in pools:
                pool.reset(seed=0)
                for t in range(WARM_UP):
                    pool.step(actions[t % block])
            for b in range(blocks):
                which = (0, 1, 1, 0)[b % 4]
                pool = pools[which]
                for t in range(20):  # (its caches warm again after the other fleet's block)
                    pool.step(actions[t % block])
                start = time.perf_counter()
                for t in range(block):
                    pool.step(actions[t])
                    if work:
                        until = time.perf_counter() + work
                        while time.perf_counter() < until:
                            pass
                rates[which].append(block * num_envs / (time.perf_counter() - start))
        finally:
            for pool in pools:
                pool.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=60, help="blocks of steps, half on each fleet (default: 60)")
    parser.add_argument("--block", type=int, default=250, help="lockstep steps per block (default: 250)")
    parser.add_argument(
        "--busy-poll",
        type=int,
        default=500,
        help="the polling fleet's --busy-poll, microseconds (default: 500; 0: an A/A check of the method)",
    )
    parser.add_argument("--work-us", type=float, default=0.0, help="CPU the trainer spends between steps, microseconds (default: 0)")
    parser.add_argument("--envs", type=int, default=64, help="envs of each fleet's pool (default: 64)")
    parser.add_argument("--servers", type=int, default=2, help="servers of each fleet (default: 2)")
    parser.add_argument("--unix", action="store_true", help="both fleets on Unix sockets")
    parser.add_argument("--pin-cpus", action="store_true", help="each fleet's server i pinned to the i-th CPU")
    args = parser.parse_args()
    if args.blocks < 2 or args.block < 1 or args.busy_poll < 0 or args.work_us < 0 or args.envs < 1 or args.servers < 1:
        parser.error("--blocks must be >= 2, --block, --envs and --servers >= 1, --busy-poll and --work-us >= 0")
    plain, polling = measure(
        args.blocks, args.block, args.busy_poll, args.work_us / 1e6, args.envs, args.servers, unix=args.unix, pin_cpus=args.pin_cpus
    )
    a, b = statistics.median(plain), statistics.median(polling)
    print(
        f"CartPole-v1, {args.envs} envs on {args.servers} servers{', Unix sockets' * args.unix}{', pinned' * args.pin_cpus}, {args.blocks} blocks of {args.block} steps (ABBA), "
        f"{args.work_us:g} us of trainer CPU per step; median steps/s: sleeping servers {a:,.0f}, "
        f"busy-polling {args.busy_poll} us {b:,.0f}, ratio {b / a:.3f}"
    )


if __name__ == "__main__":
    main()
