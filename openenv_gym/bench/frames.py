"""Large observations: Atari-sized frames (210 x 160 x 3 uint8) over the JSON path and the fast path.

Local servers host ``openenv_gym/Frames-v0``. For each setup:

- **time**: ``num_envs`` envs stepped directly (see :mod:`.measure`), in
  interleaved trials, the median reported;
- **bytes on the wire**: the same setup again through a :class:`CountingRelay`,
  for a bounded number of steps after a warm-up; bytes per env-step, each way.
  The relay shares this process's CPU, so timing is done without it.

Setups: the pool on the fast path (msgpack, raw array bytes); the pool against
a stock OpenEnv server (JSON: a frame is a nested list of ints); the stock
client against that server (when ``openenv`` is installed; it negotiates
permessage-deflate with the stock server, so its bytes are compressed).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..launch import launch_local
from ..vector import OpenEnvVectorEnv
from .compare import Progress, Setup, SetupResult, _no_progress, run_setups
from .relay import CountingRelay
from .runners import (
    Runner,
    StockClientRunner,
    VectorRunner,
    env_actions,
    include_stock_setups,
)

__all__ = ["FRAMES_ENV", "FRAME_BYTES", "FramesResult", "FramesRow", "run_frames"]

logger = logging.getLogger(__name__)

FRAMES_ENV = "openenv_gym/Frames-v0"
#: Raw bytes of one 210 x 160 x 3 uint8 frame.
FRAME_BYTES = 210 * 160 * 3


@dataclass(slots=True)
class FramesRow:
    """One setup of the frames study.

    Attributes:
        timing: the timed run (median over trials, and the trials).
        bytes_up, bytes_down: bytes on the wire per env-step, each way (``None`` if not measured).
        byte_steps: env-steps over which the bytes were counted.
    """

    timing: SetupResult
    bytes_up: float | None = None
    bytes_down: float | None = None
    byte_steps: int = 0
    error: str | None = None

    @property
    def name(self) -> str:
        return self.timing.name

    @property
    def bytes_per_step(self) -> float | None:
        if self.bytes_up is None or self.bytes_down is None:
            return None
        return self.bytes_up + self.bytes_down

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.timing.as_dict(),
            "bytes_up_per_step": self.bytes_up,
            "bytes_down_per_step": self.bytes_down,
            "bytes_per_step": self.bytes_per_step,
            "byte_steps": self.byte_steps,
            "bytes_error": self.error,
        }


@dataclass(slots=True)
class FramesResult:
    num_envs: int
    seconds: float
    trials: int
    rows: list[FramesRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "env_id": FRAMES_ENV,
            "frame_bytes": FRAME_BYTES,
            "num_envs": self.num_envs,
            "seconds": self.seconds,
            "trials": self.trials,
            "rows": [r.as_dict() for r in self.rows],
            "notes": self.notes,
        }


def count_bytes(build: Callable[[str], Runner], url: str, *, calls: int, seconds: float, warmup: int = 2) -> tuple[float, float, int]:
    """Bytes per env-step ``(up, down, env_steps)`` of ``build(relay_url)``, through a :class:`CountingRelay`.

    Runs ``warmup`` calls, then up to ``calls`` calls or ``seconds``, whichever
    comes first (at least one).
    """
    with CountingRelay(url) as relay:
        runner = build(relay.url)
        try:
            for k in range(warmup):
                runner(k)
            relay.reset_counts()
            start, done = time.perf_counter(), 0
            while done < calls and (done == 0 or time.perf_counter() - start < seconds):
                runner(warmup + done)
                done += 1
            up, down = relay.bytes_up, relay.bytes_down
        finally:
            runner.close()
    steps = done * runner.env_steps_per_call
    return up / steps, down / steps, steps


def run_frames(
    *,
    num_envs: int = 8,
    seconds: float = 3.0,
    trials: int = 1,
    byte_calls: int = 20,
    include_stock: bool | None = None,
    step_timeout: float = 60.0,
    progress: Progress = _no_progress,
) -> FramesResult:
    """Run the frames study (see the module docstring) on local servers started here.

    Args:
        num_envs: envs per setup.
        seconds: timed seconds per trial and setup (also the cap of the byte count).
        trials: interleaved timing trials.
        byte_calls: most steps (of all envs) counted through the relay.
        include_stock: the stock server setups (default: when ``openenv`` is installed).
        progress: ``progress(done, total, label)``.
    """
    if num_envs < 1 or trials < 1 or seconds <= 0 or byte_calls < 1:
        raise ValueError("num_envs, trials and byte_calls must be >= 1 and seconds > 0")
    result = FramesResult(num_envs, seconds, trials)
    include_stock = include_stock_setups(include_stock, result.notes)
    count = 3 if include_stock else 1
    total = 1 + count * (trials + 1)
    progress(0, total, "starting local servers")
    with contextlib.ExitStack() as stack:
        (fast_url,) = stack.enter_context(launch_local(FRAMES_ENV, max_sessions=2 * num_envs))
        pool = lambda url: VectorRunner(OpenEnvVectorEnv(url, num_envs, step_timeout=step_timeout))
        builders: dict[str, tuple[str, Callable[[str], Runner]]] = {"pool, fast path": (fast_url, pool)}
        if include_stock:
            (stock_url,) = stack.enter_context(launch_local(FRAMES_ENV, stock=True, max_sessions=4 * num_envs))
            actions = env_actions(FRAMES_ENV, num_envs)
            stock: Callable[[str], Any] = lambda url: StockClientRunner(url, num_envs, actions, timeout=step_timeout)
            builders["pool, stock server (JSON)"] = (stock_url, pool)
            builders["stock client, stock server (JSON)"] = (stock_url, stock)
        setups = [Setup(name, functools.partial(build, url)) for name, (url, build) in builders.items()]
        progress(1, total, "local servers up")
        timings = run_setups(setups, seconds, trials, progress, done=1, total=total)
        done = 1 + trials * len(setups)
        for timing in timings:
            row = FramesRow(timing)
            url, build = builders[timing.name]
            label = f"{timing.name}: bytes on the wire"
            progress(done, total, label)
            try:
                row.bytes_up, row.bytes_down, row.byte_steps = count_bytes(build, url, calls=byte_calls, seconds=seconds)
            except Exception as exc:
                row.error = f"{type(exc).__name__}: {exc}"
                logger.warning("%s failed: %s", label, row.error)
            done += 1
            progress(done, total, label)
            result.rows.append(row)
    return result
