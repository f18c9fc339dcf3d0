"""Figures of a :class:`~openenv_gym.bench.report.BenchReport` (needs matplotlib: the ``plot`` extra).

One PNG with a panel per measurement: the comparison's steps/s; the sweep's
P99 latency, success rate and steps/s against sessions; the frames study's
time and bytes per env-step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .frames import FRAME_BYTES
from .report import BenchReport

__all__ = ["plot_available", "plot_report"]


def plot_available() -> bool:
    """Whether matplotlib can be imported."""
    return importlib.util.find_spec("matplotlib") is not None


def _bars(ax: Any, names: list[str], values: list[float], *, xlabel: str, color: str, fmt: str, log: bool = False) -> None:
    """Horizontal bars, first name on top, each labelled with its value."""
    ax.barh(range(len(names)), values, color=color)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    if log and values and min(values) > 0:
        import math

        from matplotlib.ticker import LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.set_xlim(10 ** math.floor(math.log10(min(values))), 10 ** (math.log10(max(values)) + 0.6))
        ax.xaxis.set_major_locator(LogLocator(base=10))
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif values:
        ax.set_xlim(0, max(values) * 1.25)
    ax.set_xlabel(xlabel)
    for i, v in enumerate(values):
        ax.text(v, i, " " + fmt.format(v), va="center", fontsize=8)


def _compare_panels(report: BenchReport) -> list[Any]:
    result = report.compare
    if result is None:
        return []
    setups = [s for s in result.setups if s.stats is not None]

    def draw(ax: Any) -> None:
        names = [s.name for s in setups]
        values = [s.stats.steps_per_s for s in setups]  # type: ignore[union-attr]
        _bars(ax, names, values, xlabel="env-steps/s", color="tab:blue", fmt="{:,.0f}")
        ax.set_title(f"{result.env_id or 'your servers'}, {result.num_envs} envs")

    return [draw]


def _sweep_panels(report: BenchReport) -> list[Any]:
    result = report.sweep
    if result is None:
        return []

    def series(client: str, key: str) -> tuple[list[int], list[float]]:
        points = [p for p in result.points if p.client == client and p.skipped is None and getattr(p, key) is not None]
        return [p.sessions for p in points], [float(getattr(p, key)) for p in points]

    from matplotlib.ticker import NullFormatter

    def panel(key: str, label: str, scale: float = 1.0, log: bool = True) -> Any:
        def draw(ax: Any) -> None:
            for client in result.clients:
                xs, ys = series(client, key)
                ax.plot(xs, [y * scale for y in ys], marker="o", label=client)
            ax.set_xscale("log", base=2)
            ax.set_xticks(result.sizes, [f"{n:,}" for n in result.sizes], fontsize=8)
            ax.xaxis.set_minor_formatter(NullFormatter())
            if log:
                ax.set_yscale("log")
            else:
                ax.set_ylim(0, 105)
            ax.set_xlabel("concurrent sessions")
            ax.set_ylabel(label)
            ax.set_title(f"sweep: {label} ({result.sleep_ms:g} ms step)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)

        return draw

    return [panel("p99_s", "P99 latency, s"), panel("success_rate", "success rate, %", 100.0, log=False), panel("steps_per_s", "steps/s")]


def _frames_panels(report: BenchReport) -> list[Any]:
    result = report.frames
    if result is None:
        return []
    rows = result.rows

    def draw_time(ax: Any) -> None:
        pairs = [(r.name, 1e3 / r.timing.stats.steps_per_s) for r in rows if r.timing.stats is not None]
        _bars(ax, [n for n, _ in pairs], [v for _, v in pairs], xlabel="ms per env-step (log)", color="tab:orange", fmt="{:,.2f}", log=True)
        ax.set_title("210x160x3 frames: time")

    def draw_bytes(ax: Any) -> None:
        pairs = [(r.name, r.bytes_per_step / 1e3) for r in rows if r.bytes_per_step is not None]
        _bars(ax, [n for n, _ in pairs], [v for _, v in pairs], xlabel="kB on the wire per env-step", color="tab:green", fmt="{:,.1f}")
        ax.axvline(FRAME_BYTES / 1e3, color="gray", linestyle="--", label=f"raw frame, {FRAME_BYTES / 1e3:.1f} kB")
        ax.set_title("210x160x3 frames: bytes")
        ax.legend(fontsize=8)

    return [draw_time, draw_bytes]


def plot_report(report: BenchReport, path: str | Path) -> None:
    """Draw ``report`` into the PNG file ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install -e '.[plot]'`` in a checkout).
        ValueError: the report has nothing to draw.
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend state
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install -e '.[plot]' in a checkout") from exc
    panels = _compare_panels(report) + _sweep_panels(report) + _frames_panels(report)
    if not panels:
        raise ValueError("nothing to plot")
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(6.5 * columns, 4 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, draw in zip(axes.flat, panels):
        draw(ax)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    machine = report.machine
    fig.suptitle(f"openenv-gym bench on {machine.get('cpu')}, {machine.get('cores')} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
