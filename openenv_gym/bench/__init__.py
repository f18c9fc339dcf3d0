"""Benchmarks of the pool against its baselines: the ``openenv-gym bench`` command's engine.

- :func:`run_compare`: the pool (fast path, against a stock server), the
  stock OpenEnv client and Gymnasium's vector envs, side by side; or the
  user's own servers.
- :func:`run_sweep`: concurrent sessions from 32 to 4,096 on an env whose
  step sleeps, for the stock client and the pool (success rate, P99, steps/s).
- :func:`run_frames`: Atari-sized frames, time and bytes on the wire per step,
  JSON path against fast path.
- :class:`BenchReport`, ``format_*``, :func:`write_json`, :func:`plot_report`
  (matplotlib, the ``plot`` extra): the output.

Library code here logs and returns results; the CLI prints.
"""

from .compare import CompareResult, SetupResult, run_compare
from .frames import FramesResult, run_frames
from .machine import describe_machine, ensure_fd_limit
from .measure import Stats, measure
from .plot import plot_available, plot_report
from .progress import ProgressBar
from .relay import CountingRelay
from .report import BenchReport, format_compare, format_frames, format_sweep, write_json
from .sweep import SweepResult, run_sweep

__all__ = [
    "BenchReport",
    "CompareResult",
    "CountingRelay",
    "FramesResult",
    "ProgressBar",
    "SetupResult",
    "Stats",
    "SweepResult",
    "describe_machine",
    "ensure_fd_limit",
    "format_compare",
    "format_frames",
    "format_sweep",
    "measure",
    "plot_available",
    "plot_report",
    "run_compare",
    "run_frames",
    "run_sweep",
    "write_json",
]
