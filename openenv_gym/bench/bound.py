"""The zero-overhead bound of ``send``/``recv`` on a latency-bound env, by simulation.

Each env's step takes ``U(low_ms, high_ms)``; ``recv`` returns the first
``batch_size`` envs to finish, and they are sent again at once. No network,
no server, no client work: what any pool can at best reach on that env.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["zero_overhead_steps_per_s", "lockstep_steps_per_s"]


def zero_overhead_steps_per_s(num_envs: int, batch_size: int, low_ms: float = 1.0, high_ms: float = 20.0, steps: int = 200_000) -> float:
    """Env steps per second of a pool with no overhead, ``send``/``recv`` with ``batch_size`` (simulated, seeded)."""
    rng = np.random.default_rng(0)
    clock, done = 0.0, 0
    running = [(float(t), i) for i, t in enumerate(rng.uniform(low_ms, high_ms, num_envs))]
    heapq.heapify(running)
    while done < steps:
        batch = [heapq.heappop(running) for _ in range(batch_size)]
        clock = max(clock, batch[-1][0])
        for (_, i), t in zip(batch, rng.uniform(low_ms, high_ms, batch_size)):
            heapq.heappush(running, (clock + float(t), i))
        done += batch_size
    return done / clock * 1000.0


def lockstep_steps_per_s(num_envs: int, low_ms: float = 1.0, high_ms: float = 20.0) -> float:
    """Env steps per second of a zero-overhead lockstep ``step()``: each waits for the slowest of ``num_envs``."""
    expected_max = high_ms - (high_ms - low_ms) / (num_envs + 1)  # E[max of num_envs uniforms]
    return num_envs / expected_max * 1000.0
