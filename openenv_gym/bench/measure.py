"""Timing one setup: throughput, step latency and client CPU time.

No servers and no printing here: :func:`measure` calls a step function in a
loop bounded in time and in count, and :func:`median_stats` folds trials.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Stats", "measure", "median_stats", "percentile"]

#: Upper bound on the calls of one measured loop, whatever the time budget.
MAX_CALLS = 1_000_000


@dataclass(frozen=True, slots=True)
class Stats:
    """One timed run of a setup.

    Attributes:
        steps_per_s: env-steps per second (calls x env-steps per call / wall time).
        p50_ms, p99_ms: percentiles of the duration of one call, in milliseconds
            (one call steps every env of the setup, or one ``recv`` batch).
        cpu_us_per_step: this process's CPU time (all threads) per env-step, in
            microseconds; excludes server processes and worker subprocesses.
        calls: calls timed.
        env_steps: env-steps timed.
        seconds: wall time of the timed loop, in seconds.
    """

    steps_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_step: float
    calls: int
    env_steps: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def measure(
    step: Callable[[int], Any],
    env_steps_per_call: int,
    seconds: float,
    *,
    warmup_calls: int = 20,
    warmup_seconds: float | None = None,
    max_calls: int = MAX_CALLS,
) -> Stats:
    """Call ``step(k)`` for ``seconds`` after a warm-up; return its :class:`Stats`.

    The warm-up stops after ``warmup_calls`` calls or ``warmup_seconds``
    (default ``min(1, seconds / 2)``), whichever comes first. The timed loop
    stops after ``seconds`` or ``max_calls`` calls, and makes at least one call.

    Args:
        step: one call; ``k`` counts calls from 0 (warm-up included).
        env_steps_per_call: env-steps that one call performs.
        seconds: the time budget of the timed loop, in seconds.
    """
    if env_steps_per_call < 1:
        raise ValueError(f"env_steps_per_call must be >= 1, got {env_steps_per_call}")
    budget = min(1.0, seconds / 2) if warmup_seconds is None else warmup_seconds
    k = 0
    start = time.perf_counter()
    while k < warmup_calls and time.perf_counter() - start < budget:
        step(k)
        k += 1
    latencies: list[float] = []
    clock = time.perf_counter
    cpu0, start = time.process_time(), clock()
    while True:
        t = clock()
        step(k)
        now = clock()
        latencies.append(now - t)
        k += 1
        if now - start >= seconds or len(latencies) >= max_calls:
            break
    wall, cpu = clock() - start, time.process_time() - cpu0
    env_steps = len(latencies) * env_steps_per_call
    return Stats(
        steps_per_s=env_steps / wall,
        p50_ms=percentile(latencies, 50) * 1e3,
        p99_ms=percentile(latencies, 99) * 1e3,
        cpu_us_per_step=cpu / env_steps * 1e6,
        calls=len(latencies),
        env_steps=env_steps,
        seconds=wall,
    )


def median_stats(trials: Sequence[Stats]) -> Stats:
    """Each field's median over ``trials`` (counts and seconds are summed)."""
    if not trials:
        raise ValueError("no trials")
    med = lambda name: float(statistics.median(getattr(t, name) for t in trials))
    return Stats(
        steps_per_s=med("steps_per_s"),
        p50_ms=med("p50_ms"),
        p99_ms=med("p99_ms"),
        cpu_us_per_step=med("cpu_us_per_step"),
        calls=sum(t.calls for t in trials),
        env_steps=sum(t.env_steps for t in trials),
        seconds=sum(t.seconds for t in trials),
    )
