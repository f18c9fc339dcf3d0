"""The pool against its baselines, side by side in one run, plus two scenarios of the pool alone.

The comparison is ``openenv-gym bench``'s (see ``openenv_gym.bench.compare``):
CartPole-v1 with N envs (default 64), interleaved trials, median reported,
for the pool on the fast path (2 servers), the pool against a stock OpenEnv
server (JSON), the stock OpenEnv client, and gymnasium's Sync/AsyncVectorEnv.

Then two scenarios of the pool alone:

- a latency-bound env (each step sleeps 1-20 ms): lockstep ``step()`` against
  ``send``/``recv`` with ``batch_size = N / 2``;
- 1,024 sessions on 4 local servers from one process: every step must succeed;
  client memory per session is reported.

    python benchmarks/pool_vs_baselines.py [--envs 64] [--seconds 3] [--trials 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from openenv_gym import OpenEnvVectorEnv, launch_local
from openenv_gym.bench import (
    BenchReport,
    ProgressBar,
    describe_machine,
    format_compare,
    measure,
    run_compare,
)
from openenv_gym.bench.bound import lockstep_steps_per_s, zero_overhead_steps_per_s
from openenv_gym.bench.machine import machine_line
from openenv_gym.bench.runners import SendRecvRunner, VectorRunner


def latency_bound(num_envs: int, seconds: float, trials: int) -> dict[str, dict[str, float]]:
    """Sleep-v0 (1-20 ms a step): lockstep step() against send/recv with batch_size = num_envs / 2."""
    half = num_envs // 2
    names = {"lockstep step()": None, f"send/recv, batch_size={half}": half}
    results: dict[str, list[float]] = {name: [] for name in names}
    with launch_local("openenv_gym/Sleep-v0", servers=2, max_sessions=num_envs) as urls:
        for _ in range(trials):
            for name, batch_size in names.items():
                envs = OpenEnvVectorEnv(urls, num_envs, batch_size=batch_size)
                runner = VectorRunner(envs) if batch_size is None else SendRecvRunner(envs)
                try:
                    results[name].append(measure(runner, runner.env_steps_per_call, seconds).steps_per_s)
                finally:
                    runner.close()
    return {name: {"steps_per_s": statistics.median(values)} for name, values in results.items()}


def ideal_ratio(num_envs: int, low_ms: float = 1.0, high_ms: float = 20.0) -> float:
    """send/recv (batch ``num_envs / 2``) over lockstep steps/s for a zero-overhead pool (``openenv_gym.bench.bound``).

    No network, no server: the bound that any implementation can at best reach on this env.
    """
    return zero_overhead_steps_per_s(num_envs, num_envs // 2, low_ms, high_ms) / lockstep_steps_per_s(num_envs, low_ms, high_ms)


def many_sessions(num_envs: int = 1024, servers: int = 4, steps: int = 100) -> dict[str, float]:
    """num_envs CartPole sessions on local servers from one process; every step must succeed."""
    with launch_local("CartPole-v1", servers=servers, max_sessions=num_envs // servers + 8) as urls:
        tracemalloc.start()
        start = time.perf_counter()
        envs = OpenEnvVectorEnv(urls, num_envs)
        envs.reset(seed=0)
        opened = time.perf_counter() - start
        traced, _ = tracemalloc.get_traced_memory()  # Python allocations held by the pool
        tracemalloc.stop()
        actions = np.random.default_rng(0).integers(0, 2, size=(steps, num_envs))
        t = time.perf_counter()
        for k in range(steps):
            obs, *_, infos = envs.step(actions[k])
            assert obs.shape[0] == num_envs and np.isfinite(obs).all()
            assert "openenv_error" not in infos, infos.get("openenv_error")
        wall = time.perf_counter() - t
        envs.close()
    return {
        "sessions": num_envs,
        "servers": servers,
        "steps": steps,
        "steps_per_s": steps * num_envs / wall,
        "open_and_reset_s": opened,
        "client_kib_per_session": traced / num_envs / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    machine = describe_machine()
    bar = ProgressBar("baselines", sys.stderr)
    try:
        compare = run_compare(num_envs=args.envs, seconds=args.seconds, trials=args.trials, progress=bar)
    finally:
        bar.close()
    print(format_compare(compare, machine))
    sleep = latency_bound(args.envs, args.seconds, max(1, args.trials - 1))
    print(f"\nSleep-v0 (1-20 ms per step), {args.envs} envs on 2 servers:")
    for name, row in sleep.items():
        print(f"| {name} | {row['steps_per_s']:,.0f} steps/s |")
    rates = [row["steps_per_s"] for row in sleep.values()]
    bound = ideal_ratio(args.envs)
    sleep["ratio"] = {"measured": rates[1] / rates[0], "zero_overhead_model": bound}
    print(f"send/recv / lockstep: {rates[1] / rates[0]:.2f}x; a zero-overhead model of this env: {bound:.2f}x")
    many = many_sessions()
    print(
        f"\n{many['sessions']} sessions on {many['servers']} servers: {many['steps']} steps all succeeded, "
        f"{many['steps_per_s']:,.0f} steps/s, opened+reset in {many['open_and_reset_s']:.1f} s, "
        f"client memory {many['client_kib_per_session']:.2f} KiB per session (Python allocations held by the pool)"
    )
    print(f"\non {machine_line(machine)}")
    if args.json:
        report: dict[str, Any] = BenchReport(machine, command=sys.argv, compare=compare).as_dict()
        report.update(latency_bound=sleep, many_sessions=many)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
