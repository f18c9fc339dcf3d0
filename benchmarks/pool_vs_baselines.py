"""The pool against its baselines, side by side in one run.

CartPole-v1 with N envs (default 64), measured in interleaved trials (the
median is reported), all on this machine:

- ``pool fast``: OpenEnvVectorEnv over 2 local openenv_gym servers (msgpack fast path);
- ``pool stock``: OpenEnvVectorEnv over 1 stock OpenEnv server (openenv's own
  FastAPI app under uvicorn, JSON);
- ``stock client``: N ``openenv.core.GenericEnvClient`` stepped with
  ``asyncio.gather`` against that stock server;
- ``sync`` / ``async``: gymnasium's SyncVectorEnv / AsyncVectorEnv in-process.

Then two scenarios of the pool alone:

- a latency-bound env (each step sleeps 1-20 ms): lockstep ``step()`` against
  ``send``/``recv`` with ``batch_size = N / 2``;
- 1,024 sessions on 4 local servers from one process: every step must succeed;
  client memory per session is reported.

Client CPU is this process's CPU time (all threads) per env-step; it excludes
server processes and AsyncVectorEnv's worker processes.

    python benchmarks/pool_vs_baselines.py [--envs 64] [--seconds 3] [--trials 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import tracemalloc
from typing import Any, Callable

import gymnasium as gym
import numpy as np

import openenv_gym
from openenv_gym import OpenEnvVectorEnv, launch_local


def measure(step: Callable[[int], Any], num_envs: int, seconds: float) -> dict[str, float]:
    """Call ``step(k)`` for ``seconds`` after a warm-up; steps/s, CPU and latency percentiles."""
    for k in range(20):
        step(k)
    latencies = []
    cpu0, start = time.process_time(), time.perf_counter()
    k = 0
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        step(k)
        latencies.append(time.perf_counter() - t)
        k += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "steps_per_s": k * num_envs / wall,
        "cpu_us_per_step": cpu / (k * num_envs) * 1e6,
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
    }


class VectorRunner:
    """Steps a Gymnasium vector env with pre-drawn random actions."""

    def __init__(self, envs: Any, num_envs: int) -> None:
        self.envs = envs
        self.actions = np.random.default_rng(0).integers(0, 2, size=(256, num_envs))
        envs.reset(seed=0)

    def __call__(self, k: int) -> None:
        self.envs.step(self.actions[k % 256])

    def close(self) -> None:
        self.envs.close()


class StockClientRunner:
    """N stock ``GenericEnvClient`` sessions stepped with ``asyncio.gather`` (reset when done)."""

    def __init__(self, url: str, num_envs: int) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.loop = asyncio.new_event_loop()
        self.actions = np.random.default_rng(0).integers(0, 2, size=(256, num_envs)).tolist()
        self.clients = [GenericEnvClient(base_url=url) for _ in range(num_envs)]
        self.done = [False] * num_envs
        # The stock client's methods are awaitables only when called inside a running loop.
        self._run(lambda: asyncio.gather(*(c.connect() for c in self.clients)))
        self._run(lambda: asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(self.clients))))

    def _run(self, make: Callable[[], Any]) -> Any:
        async def inside() -> Any:
            return await make()

        return self.loop.run_until_complete(inside())

    async def _one(self, i: int, action: int) -> None:
        client = self.clients[i]
        result = await (client.reset() if self.done[i] else client.step({"action": action}))
        self.done[i] = bool(result.done)

    def __call__(self, k: int) -> None:
        row = self.actions[k % 256]
        self._run(lambda: asyncio.gather(*(self._one(i, a) for i, a in enumerate(row))))

    def close(self) -> None:
        self._run(lambda: asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True))
        self.loop.close()


def compare_baselines(num_envs: int, seconds: float, trials: int) -> dict[str, dict[str, float]]:
    make = lambda: gym.make("CartPole-v1")  # noqa: E731
    results: dict[str, list[dict[str, float]]] = {}
    with launch_local("CartPole-v1", servers=2, max_sessions=num_envs) as fast_urls, launch_local(
        "CartPole-v1", stock=True, max_sessions=2 * num_envs
    ) as (stock_url,):
        configs: dict[str, Callable[[], Any]] = {
            "pool fast (2 servers)": lambda: VectorRunner(OpenEnvVectorEnv(fast_urls, num_envs), num_envs),
            "pool stock (1 stock server)": lambda: VectorRunner(OpenEnvVectorEnv(stock_url, num_envs), num_envs),
            "stock client (1 stock server)": lambda: StockClientRunner(stock_url, num_envs),
            "gymnasium SyncVectorEnv": lambda: VectorRunner(gym.vector.SyncVectorEnv([make] * num_envs), num_envs),
            "gymnasium AsyncVectorEnv": lambda: VectorRunner(gym.vector.AsyncVectorEnv([make] * num_envs), num_envs),
        }
        for trial in range(trials):
            for name, build in configs.items():
                runner = build()
                try:
                    results.setdefault(name, []).append(measure(runner, num_envs, seconds))
                finally:
                    runner.close()
                print(f"  trial {trial + 1}/{trials} {name}: {results[name][-1]['steps_per_s']:,.0f} steps/s", flush=True)
    return {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}


def latency_bound(num_envs: int, seconds: float, trials: int) -> dict[str, dict[str, float]]:
    """Sleep-v0 (1-20 ms a step): lockstep step() against send/recv with batch_size = num_envs / 2."""
    results: dict[str, list[float]] = {"lockstep step()": [], f"send/recv, batch_size={num_envs // 2}": []}
    with launch_local("openenv_gym/Sleep-v0", servers=2, max_sessions=num_envs) as urls:
        for _ in range(trials):
            with OpenEnvVectorEnv(urls, num_envs) as envs:
                envs.reset(seed=0)
                actions = np.zeros(num_envs, dtype=np.int64)
                results["lockstep step()"].append(measure(lambda k: envs.step(actions), num_envs, seconds)["steps_per_s"])
            with OpenEnvVectorEnv(urls, num_envs, batch_size=num_envs // 2) as envs:
                envs.reset(seed=0)
                half = np.zeros(num_envs // 2, dtype=np.int64)
                envs.send(np.zeros(num_envs, dtype=np.int64))

                def cycle(k: int) -> None:
                    *_, infos = envs.recv()
                    envs.send(half, infos["env_id"])

                stats = measure(cycle, num_envs // 2, seconds)
                results[f"send/recv, batch_size={num_envs // 2}"].append(stats["steps_per_s"])
                envs.recv()
    return {name: {"steps_per_s": statistics.median(values)} for name, values in results.items()}


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
            obs, rewards, *_ = envs.step(actions[k])
            assert obs.shape[0] == num_envs and np.isfinite(obs).all()
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

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"openenv_gym {openenv_gym.__version__} on {machine}")
    print(f"CartPole-v1, {args.envs} envs, {args.trials} trials x {args.seconds:.0f} s, median:")
    table = compare_baselines(args.envs, args.seconds, args.trials)
    fast = table["pool fast (2 servers)"]
    print(f"\n| setup | steps/s | vs pool fast | client CPU us/env-step | p50 ms | p99 ms |\n|---|---|---|---|---|---|")
    for name, row in table.items():
        print(
            f"| {name} | {row['steps_per_s']:,.0f} | {fast['steps_per_s'] / row['steps_per_s']:.2f}x "
            f"| {row['cpu_us_per_step']:.1f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |"
        )
    sleep = latency_bound(args.envs, args.seconds, max(1, args.trials - 1))
    print(f"\nSleep-v0 (1-20 ms per step), {args.envs} envs on 2 servers:")
    for name, row in sleep.items():
        print(f"| {name} | {row['steps_per_s']:,.0f} steps/s |")
    many = many_sessions()
    print(
        f"\n{many['sessions']} sessions on {many['servers']} servers: {many['steps']} steps all succeeded, "
        f"{many['steps_per_s']:,.0f} steps/s, opened+reset in {many['open_and_reset_s']:.1f} s, "
        f"client memory {many['client_kib_per_session']:.2f} KiB per session (Python allocations held by the pool)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "baselines": table, "latency_bound": sleep, "many_sessions": many}, f, indent=2)


if __name__ == "__main__":
    main()
