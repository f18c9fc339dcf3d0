"""A progress bar for the ``bench`` command, on a text stream (stderr), with no dependency.

On a terminal it redraws one line (``\\r``); elsewhere (a log file, CI) it
writes one plain line each time a unit of work starts or ends, so the output
stays readable.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``bar(done, total, label)`` shows progress; :meth:`close` ends the line.

    Args:
        title: what is running, shown before the bar.
        stream: where to write (default ``sys.stderr``).
        width: bar width in characters.
        enabled: ``False`` writes nothing.
    """

    def __init__(self, title: str, stream: TextIO | None = None, *, width: int = 24, enabled: bool = True) -> None:
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last = ""
        self._drawn = False

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        total = max(total, 1)
        done = min(max(done, 0), total)
        elapsed = time.monotonic() - self.start
        if self.tty:
            filled = round(self.width * done / total)
            bar = "#" * filled + "." * (self.width - filled)
            line = f"{self.title} [{bar}] {done}/{total} {elapsed:4.0f} s  {label}"
            columns = shutil.get_terminal_size((100, 20)).columns
            line = line[: max(columns - 1, 20)]
            self.stream.write("\r" + line.ljust(len(self._last)))
            self._last = line
        else:
            key = f"{done}/{total} {label}"
            if key == self._last:
                return
            self.stream.write(f"{self.title}: {done}/{total} [{elapsed:.0f} s] {label}\n")
            self._last = key
        self._drawn = True
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line (on a terminal)."""
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False
