"""The types of ``openenv-gym``'s options: each reads one option's text, or raises ``argparse.ArgumentTypeError`` saying why not."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["busy_poll_us", "cpu_list", "json_object", "port", "positive_float", "positive_int", "seconds_or_none", "sizes"]


def seconds_or_none(text: str) -> float | None:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (0 disables)")
    return None if value == 0 else value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def busy_poll_us(text: str) -> int:
    from .server.net.busy_poll import check_window

    value = int(text)
    if value != 0:
        try:
            check_window(value / 1e6)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"microseconds, 0 for off: {exc}") from None
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be in [0, 65535]")
    return value


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError("must be CPU numbers and ranges, e.g. 0 or 0,2 or 0-3") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError("must name CPUs >= 0")
    return cpus


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("must be a comma-separated list of ints, e.g. 32,128,512") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be >= 1")
    return sizes
