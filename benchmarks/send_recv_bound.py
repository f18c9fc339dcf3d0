"""``send``/``recv`` beside its zero-overhead bound, on a latency-bound env.

``openenv_gym/Sleep-v0`` (each step sleeps U(1, 20) ms) on local servers
whose env calls run in threads (one per session); for each number of envs
and each batch size, the pool's ``send``/``recv`` steps/s and, computed in
the same run, the steps/s of a pool with no overhead at all on the same env
(``openenv_gym.bench.bound``). Interleaved trials, medians reported.

    python benchmarks/send_recv_bound.py [--envs 64,1024] [--seconds 5] [--trials 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics

from openenv_gym import OpenEnvVectorEnv, launch_local
from openenv_gym.bench import describe_machine, measure
from openenv_gym.bench.bound import lockstep_steps_per_s, zero_overhead_steps_per_s
from openenv_gym.bench.machine import machine_line
from openenv_gym.bench.runners import SendRecvRunner


def run(num_envs: int, seconds: float, trials: int) -> list[dict[str, float]]:
    """Rows of ``num_envs``: one per batch size (``num_envs / 2`` and ``/ 4``)."""
    servers = 2 if num_envs <= 64 else 4
    per_server = -(-num_envs // servers)
    batches = (num_envs // 2, num_envs // 4)
    measured: dict[int, list[float]] = {b: [] for b in batches}
    extra = ["--execution", "thread", "--threads", str(per_server)]
    with launch_local("openenv_gym/Sleep-v0", servers=servers, max_sessions=per_server, extra_args=extra) as urls:
        for _ in range(trials):
            for batch_size in batches:
                runner = SendRecvRunner(OpenEnvVectorEnv(urls, num_envs, batch_size=batch_size, step_timeout=30))
                try:
                    measured[batch_size].append(measure(runner, runner.env_steps_per_call, seconds).steps_per_s)
                finally:
                    runner.close()
    rows = []
    for batch_size in batches:
        bound = zero_overhead_steps_per_s(num_envs, batch_size)
        pool = statistics.median(measured[batch_size])
        rows.append(
            {
                "num_envs": num_envs,
                "batch_size": batch_size,
                "servers": servers,
                "pool_steps_per_s": pool,
                "bound_steps_per_s": bound,
                "of_bound": pool / bound,
                "lockstep_bound_steps_per_s": lockstep_steps_per_s(num_envs),
                "trials": [round(v, 1) for v in measured[batch_size]],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="64,1024", help="numbers of envs (default: 64,1024)")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per trial (default: 5)")
    parser.add_argument("--trials", type=int, default=3, help="interleaved trials, median reported (default: 3)")
    parser.add_argument("--json", help="write the rows as JSON")
    args = parser.parse_args()
    print(machine_line(describe_machine()))
    rows = [row for n in args.envs.split(",") for row in run(int(n), args.seconds, args.trials)]
    print(f"{'envs':>6} {'batch':>6} {'pool steps/s':>13} {'bound steps/s':>14} {'of bound':>9}")
    for row in rows:
        print(
            f"{row['num_envs']:>6} {row['batch_size']:>6} {row['pool_steps_per_s']:>13,.0f} "
            f"{row['bound_steps_per_s']:>14,.0f} {row['of_bound']:>8.0%}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": describe_machine(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
