"""Results as text: Markdown tables, and the JSON document.

:class:`BenchReport` gathers whatever studies ran; ``format_*`` return strings
(the CLI prints them); :func:`write_json` writes the whole report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .compare import CompareResult
from .frames import FRAME_BYTES, FramesResult
from .machine import machine_line
from .sweep import POOL, STOCK, SUCCESS_THRESHOLD, SweepResult

__all__ = ["BenchReport", "format_compare", "format_frames", "format_sweep", "write_json"]


@dataclass(slots=True)
class BenchReport:
    """Everything one ``bench`` run measured.

    Attributes:
        machine: from :func:`~openenv_gym.bench.machine.describe_machine`.
        command: the command line, for the record.
        seconds: wall time of the whole run, seconds.
    """

    machine: dict[str, Any]
    command: list[str] = field(default_factory=list)
    compare: CompareResult | None = None
    sweep: SweepResult | None = None
    frames: FramesResult | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "command": self.command,
            "seconds": self.seconds,
            "compare": None if self.compare is None else self.compare.as_dict(),
            "sweep": None if self.sweep is None else self.sweep.as_dict(),
            "frames": None if self.frames is None else self.frames.as_dict(),
        }


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _text(head: str, header: list[str], rows: list[list[str]], explained: list[str], notes: list[str]) -> str:
    """A study as text: ``head``, the table, a blank line, the lines that explain the table, and the notes."""
    text = head + "\n\n" + _table(header, rows) + "\n"
    for line in explained:
        text += "\n" + line
    for note in notes:
        text += f"\nNote: {note}"
    return text


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def format_compare(result: CompareResult, machine: dict[str, Any]) -> str:
    """The comparison table, with a heading naming the env, settings and machine."""
    what = result.env_id if result.env_id else ", ".join(result.urls)
    head = (
        f"{what}: {result.num_envs} envs, {result.trials} trial(s) x {result.seconds:g} s, median; "
        f"{'local servers pinned one per CPU; ' if result.pin_cpus else ''}on {machine_line(machine)}"
    )
    first = next((s.stats for s in result.setups if s.stats is not None), None)
    rows = []
    for setup in result.setups:
        stats = setup.stats
        if stats is None:
            rows.append([setup.name, f"failed: {setup.error}", "-", "-", "-", "-"])
            continue
        ratio = f"{first.steps_per_s / stats.steps_per_s:.2f}x" if first is not None else "-"
        rows.append(
            [
                setup.name,
                _num(stats.steps_per_s),
                ratio,
                _num(stats.cpu_us_per_step, 1),
                _num(stats.p50_ms, 2),
                _num(stats.p99_ms, 2),
            ]
        )
    header = ["setup", "steps/s", "row 1 / this", "client CPU us/step", "p50 ms", "p99 ms"]
    explained = [
        "row 1 / this: the first row's steps/s over this row's (above 1x: row 1 is faster).",
        "Latency: one call stepping every env (one recv batch for send/recv). CPU: this process, all threads.",
    ]
    return _text(head, header, rows, explained, result.notes)


def format_sweep(result: SweepResult, machine: dict[str, Any]) -> str:
    """The sweep table: per size, success rate, p99 latency and steps/s of each client; then the verdicts."""
    head = (
        f"Scaling sweep: Sleep-v0 ({result.sleep_ms:g} ms per step), {result.servers} server processes per client, "
        f"up to {result.rounds} round(s) per size, {result.timeout:g} s timeout; on {machine_line(machine)}"
    )
    header = ["sessions"]
    for client in result.clients:
        header += [f"{client} success", f"{client} p99 s", f"{client} steps/s"]
    rows = []
    for n in result.sizes:
        row = [f"{n:,}"]
        for client in result.clients:
            point = result.point(client, n)
            if point is None or point.skipped is not None:
                row += ["skipped", "-", "-"]
                continue
            success = f"{point.success_rate:.1%}"
            if point.errors:
                kind, count = next(iter(point.errors.items()))
                success += f" ({count} {kind})"
            row += [success, _num(point.p99_s, 2), _num(point.steps_per_s)]
        rows.append(row)
    best = result.max_ok
    verdict = ", ".join(f"{c} {'none' if best[c] is None else f'{best[c]:,}'}" for c in result.clients)
    explained = [f"Largest size with >= {SUCCESS_THRESHOLD:.0%} success: {verdict}."]
    if STOCK in result.clients:
        explained.append("stock client request: connect + reset + one step (then close), all sessions at once.")
    if POOL in result.clients:
        explained.append("pool request: one env's step; latency is the whole step() call; sessions opened once.")
    return _text(head, header, rows, explained, result.notes)


def format_frames(result: FramesResult, machine: dict[str, Any]) -> str:
    """The frames table: per setup, time per step and bytes per step on the wire."""
    head = (
        f"Large observations: Frames-v0 (210x160x3 uint8, {FRAME_BYTES:,} bytes raw), {result.num_envs} envs, "
        f"{result.trials} trial(s) x {result.seconds:g} s, median; on {machine_line(machine)}"
    )
    header = [
        "setup",
        "env-steps/s",
        "ms per env-step",
        f"p50 ms per step ({result.num_envs} envs)",
        "client CPU ms/env-step",
        "bytes down/env-step",
        "bytes up/env-step",
        "x raw frame",
    ]
    rows = []
    for row in result.rows:
        stats = row.timing.stats
        timing = (
            [_num(stats.steps_per_s, 1), _num(1e3 / stats.steps_per_s, 2), _num(stats.p50_ms, 1), _num(stats.cpu_us_per_step / 1e3, 2)]
            if stats is not None
            else [f"failed: {row.timing.error}", "-", "-", "-"]
        )
        ratio = f"{row.bytes_per_step / FRAME_BYTES:.2f}" if row.bytes_per_step is not None else "-"
        rows.append([row.name, *timing, _num(row.bytes_down), _num(row.bytes_up), ratio])
    counted = "; ".join(f"{r.name}: {r.byte_steps}" for r in result.rows)
    explained = [f"Bytes: TCP payload through a counting relay (HTTP and WebSocket framing included); env-steps counted: {counted}."]
    return _text(head, header, rows, explained, result.notes)


def _clean(value: Any) -> Any:
    """NaN and infinities become ``None``: the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(report: BenchReport, path: str | Path) -> None:
    """Write ``report`` as JSON (indented, strict: no NaN)."""
    Path(path).write_text(json.dumps(_clean(report.as_dict()), indent=2, allow_nan=False) + "\n", encoding="utf-8")
